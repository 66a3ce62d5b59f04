"""The exact implicit attention map of a Mamba2 layer (SSD: Mamba2, Falcon-H1, Bamba, Nemotron-H, Granite 4).

Per head, as transformers' mamba2_chunk_scan computes it (Dao and Gu 2024, the semiseparable form; Ali et al.
2024, "The Hidden Attention of Mamba Models"):

    y_t = sum_{s<=t} w_ts x_s + D x_t,    w_ts = (C_t . B_s) exp(sum_{r=s+1..t} dt_r A) dt_s,

with dt = clamp(softplus(dt_raw + dt_bias), dt_limit) where the layer asks for the softplus, A = -exp(A_log) < 0,
and B, C shared by the heads of a group. The skip term D x_t is stated apart: it is not a mixing of tokens. w is
not a probability (C_t . B_s can be negative). The short convolution before the scan is part of x, B and C
(recorded after it), not of w.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def step_sizes(dt, *, dt_bias=None, dt_softplus: bool = False, dt_limit=(0.0, float("inf"))) -> torch.Tensor:
    """dt [N, head] as the scan uses it: the bias added, softplus taken where the layer asks, clamped to
    dt_limit (mamba2_chunk_scan's order)."""
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    return torch.clamp(dt, min=dt_limit[0], max=dt_limit[1])


def _per_head(x, heads: int) -> torch.Tensor:
    """[N, group, n] -> [head, N, n], each group's vectors repeated for its consecutive heads."""
    return x.repeat_interleave(heads // x.shape[1], dim=1).transpose(0, 1)


def ssd_map(dt, A, B, C, *, dt_bias=None, dt_softplus: bool = False, dt_limit=(0.0, float("inf")),
            dtype=torch.float32) -> torch.Tensor:
    """w [head, query, key] of a Mamba2 layer, so that y = w @ x + D x per head.

    dt: [N, head] before the bias and softplus, as the scan receives it; A: [head]; B, C: [N, group, n]. O(N^2 n)
    per head: (C B^T) times the decay exp(cum_t - cum_s) (cum the running sum of dt A, in float64 so that long
    texts lose no digits to the difference) times dt_s, zero above the diagonal; one head at a time, so that no
    [head, N, N] float64 array is made."""
    wide = torch.promote_types(dt.dtype, dtype)  # float32 as the scan, or float64
    dt = step_sizes(dt.to(wide), dt_bias=None if dt_bias is None else dt_bias.to(wide), dt_softplus=dt_softplus,
                    dt_limit=dt_limit)  # [N, head]
    heads, n = dt.shape[1], dt.shape[0]
    b, c = (_per_head(x, heads).to(dtype) for x in (B, C))  # [head, N, n]
    cum = (dt.double() * A.double()).transpose(0, 1).cumsum(-1)  # [head, N]
    upper = torch.ones(n, n, dtype=torch.bool, device=cum.device).triu(1)
    w = torch.empty(heads, n, n, dtype=dtype, device=cum.device)
    for h in range(heads):
        decay = (cum[h, :, None] - cum[h, None, :]).masked_fill(upper, float("-inf")).exp().to(dtype)
        torch.mul(c[h] @ b[h].T, decay * dt[:, h].to(dtype)[None, :], out=w[h])
    return w


def ssd_map_naive(dt, A, B, C, *, dt_bias=None, dt_softplus: bool = False,
                  dt_limit=(0.0, float("inf"))) -> torch.Tensor:
    """The same w in float64 from the recurrence h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T, y_t = h_t^T C_t:
    the weight of x_s in y_t is C_t . B_s times the product of exp(dt_r A) for r = s+1..t, times dt_s."""
    dt = step_sizes(dt.double(), dt_bias=None if dt_bias is None else dt_bias.double(), dt_softplus=dt_softplus,
                    dt_limit=dt_limit)
    heads, n = dt.shape[1], dt.shape[0]
    b, c = (_per_head(x.double(), heads) for x in (B, C))
    w = torch.zeros(heads, n, n, dtype=torch.float64)
    for h in range(heads):
        for t in range(n):
            carry = torch.tensor(1.0, dtype=torch.float64)
            for s in range(t, -1, -1):
                w[h, t, s] = (c[h, t] @ b[h, s]) * carry * dt[s, h]
                carry = carry * torch.exp(dt[s, h] * A[h].double())
    return w


def apply_ssd(w: torch.Tensor, x: torch.Tensor, D=None) -> torch.Tensor:
    """y [N, head, p] = sum_s w[head, t, s] x_s, plus D x_t where D [head] is given; x [N, head, p]."""
    y = torch.einsum("hts,shp->thp", w, x.to(w.dtype))
    return y if D is None else y + D.to(w.dtype)[None, :, None] * x.to(w.dtype)
