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

from attnviz.cores import run_each
from attnviz.mixers.delta import checked_out, head_groups, zeros_for


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
            dtype=torch.float32, out: torch.Tensor | None = None) -> torch.Tensor:
    """w [head, query, key] of a Mamba2 layer, so that y = w @ x + D x per head.

    dt: [N, head] before the bias and softplus, as the scan receives it; A: [head]; B, C: [N, group, n]. O(N^2 n)
    per group: (C B^T) times the decay exp(cum_t - cum_s) (cum the running sum of dt A, in float64 so that long
    texts lose no digits to the difference) times dt_s, zero above the diagonal; a block of rows of one head at a
    time (ssd_rows), so that no [head, N, N] float64 array is made. out: a [head, N, N] tensor of `dtype` to write
    w into (every entry is written); returned. Without it, fresh zeroed memory (delta.zeros_for), written below the
    diagonal only. A group of heads per core (delta.head_groups)."""
    heads, n = dt.shape[1], dt.shape[0]
    fresh = out is None
    out = zeros_for((heads, n, n), dtype, dt.device) if fresh else checked_out(out, (heads, n, n), dtype)

    def group(part: slice) -> None:
        w = out[part]
        for a, b, _ in ssd_rows(dt, A, B, C, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit,
                                dtype=dtype, into=lambda a, b: w[:, a:b], heads=part):
            if not fresh:
                w[:, a:b, b:] = 0

    run_each(group, head_groups(heads))
    return out


def ssd_rows(dt, A, B, C, *, dt_bias=None, dt_softplus: bool = False, dt_limit=(0.0, float("inf")),
             dtype=torch.float32, block: int = 128, into=None, heads: slice = slice(None)):
    """The rows of ssd_map `block` at a time, never an N x N array: yields (a, b, rows), rows [head, b - a, b] the
    map's rows a .. b - 1 on keys 0 .. b - 1 (every later key's weight is 0), equal to ssd_map(...)[:, a:b, :b].
    into(a, b): where to write them, a [head, b - a, >= b] tensor (its first b columns are written); by default one
    buffer that every block reuses, so each block is valid until the next is asked for. heads: only these heads
    (rows [len, b - a, b])."""
    wide = torch.promote_types(dt.dtype, dtype)  # float32 as the scan, or float64
    dt = step_sizes(dt.to(wide), dt_bias=None if dt_bias is None else dt_bias.to(wide), dt_softplus=dt_softplus,
                    dt_limit=dt_limit)  # [N, head]
    n, per_group = dt.shape[0], dt.shape[1] // B.shape[1]  # consecutive heads share a group's B and C
    chosen = range(dt.shape[1])[heads]
    b_, c_ = (x.transpose(0, 1).to(dtype) for x in (B, C))  # [group, N, n]
    cum = (dt.double() * A.double()).transpose(0, 1).cumsum(-1)  # [head, N]
    step = dt.transpose(0, 1).to(dtype)  # [head, N]
    if into is None:
        flat = torch.empty(len(chosen) * min(block, n) * n, dtype=dtype, device=dt.device)
        into = lambda a, b: flat[:len(chosen) * (b - a) * b].view(len(chosen), b - a, b)  # noqa: E731
    positions = torch.arange(n, device=dt.device)
    for a in range(0, n, block):
        b = min(n, a + block)
        rows, group = into(a, b)[:, :, :b], None
        later = positions[None, a:b] > positions[a:b, None]  # keys after each row, within the block
        for i, h in enumerate(chosen):
            if h // per_group != group:
                group = h // per_group
                scores = c_[group, a:b] @ b_[group, :b].T  # C_t . B_s, shared by the group's heads
            _head_rows(rows[i], scores, cum[h], step[h], a, b, later)
        yield a, b, rows


def _head_rows(rows, scores, cum, step, a: int, b: int, later) -> None:
    """One head's rows a .. b - 1 on keys 0 .. b - 1 into rows [b - a, b]: scores (C_t . B_s) times the decay times
    dt_s. The decay of an earlier key (s < a) as the product e^(cum_t - cum_a) e^(cum_a - cum_s), both factors at
    most 1 (cum falls), so the [rows, keys] part is two products in the map's dtype and only b - a + a
    exponentials; the block's own keys by exp(cum_t - cum_s) directly. Exponents in float64."""
    if a:
        into_row = (cum[a:b] - cum[a]).exp().to(rows.dtype)  # e^(cum_t - cum_a)
        from_key = ((cum[a] - cum[:a]).exp() * step[:a]).to(rows.dtype)  # e^(cum_a - cum_s) dt_s
        torch.mul(scores[:, :a], into_row[:, None], out=rows[:, :a]).mul_(from_key)
    own = (cum[a:b, None] - cum[None, a:b]).masked_fill_(later, float("-inf")).exp_().to(rows.dtype)
    torch.mul(scores[:, a:], own.mul_(step[None, a:b]), out=rows[:, a:])


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
