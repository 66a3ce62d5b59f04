"""The exact implicit attention map of a gated delta rule layer (Gated DeltaNet: Qwen3-Next, Qwen3.5).

The layer keeps a state S_t [key dim, value dim] per head and, as transformers' torch_recurrent_gated_delta_rule
does, updates it token by token:

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t,

with alpha_t = exp(g_t), q and k l2-normalised (eps 1e-6 inside the root) where the layer asks for it
(use_qk_l2norm_in_kernel) and q then multiplied by dk^-1/2. Unrolled, the output is linear in the values:

    o_t = sum_{s<=t} w_ts v_s,    w_ts = beta_s k_s^T P_{s+1} ... P_t q_t,    P_r = alpha_r (I - beta_r k_r k_r^T).

w is not a probability: it can be negative and its rows do not sum to 1. The short convolution before the kernel
is part of q, k and v (recorded after it), not of w.
"""

from __future__ import annotations

import torch

CHUNK = 64


def prepared(query, key, g, beta, *, l2norm: bool, dtype=torch.float32):
    """The kernel's own preparation: q, k [head, N, dk] (k heads repeated to the value heads, l2-normalised if
    `l2norm`, q scaled by dk^-1/2), g, beta [head, N]. query, key [N, k heads, dk]; g, beta [N, value heads]."""
    heads = beta.shape[-1]
    query, key = (x.repeat_interleave(heads // x.shape[1], dim=1) if x.shape[1] != heads else x
                  for x in (query, key))
    query, key, g, beta = (x.transpose(0, 1).to(dtype) for x in (query, key, g, beta))
    if l2norm:
        query, key = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (query, key))
    return query * query.shape[-1] ** -0.5, key, g, beta


def delta_rule_map(query, key, g, beta, *, l2norm: bool = True, chunk: int = CHUNK,
                   dtype=torch.float32) -> torch.Tensor:
    """w [value head, query, key] of a gated delta rule layer, so that o = w @ v per head.

    query, key: [N, k heads, dk] as the kernel receives them; g: [N, value heads], the log decay; beta:
    [N, value heads]. The chunkwise form of Yang et al. (2024) with the values set to the identity: per chunk of
    positions, the pseudo-values U = (I + A)^-1 (diag(beta) E - diag(beta e^G) K S) with A_ts = beta_t
    e^(G_t - G_s) k_t.k_s (s < t), the rows diag(e^G) Q S + (Q K^T * e^(G_t - G_s))_{s<=t} U, and the carried
    state S (one column per earlier key: its key propagated to the chunk's end) updated as e^(G_last) S +
    (K e^(G_last - G))^T U. About N^2 (3 dk + 2 chunk) / 2 multiply-adds per head, no N^2 dk^2 term."""
    q, k, g, beta = prepared(query, key, g, beta, l2norm=l2norm, dtype=dtype)
    heads, n, dk = q.shape
    w = torch.zeros(heads, n, n, dtype=dtype, device=q.device)
    state = torch.zeros(heads, dk, n, dtype=dtype, device=q.device)  # [head, dk, key]
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        rows, update = _chunk(q[:, a:b], k[:, a:b], g[:, a:b], beta[:, a:b], state[:, :, :b], a)
        w[:, a:b, :b] = rows
        state[:, :, :b] = update
    return w


def _chunk(q, k, g, beta, state, start):
    """One chunk's rows of w [head, C, b] and the state carried past it [head, dk, b]; q, k [head, C, dk],
    g, beta [head, C], state [head, dk, b] (zero from column `start` on)."""
    size = q.shape[1]
    cum = g.cumsum(-1)  # [head, C]: G_t, the log decay from the chunk's start to t
    lower = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    decay = (cum[:, :, None] - cum[:, None, :]).masked_fill(~lower, float("-inf")).exp()  # e^(G_t - G_s), s <= t
    strict = (beta[:, :, None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)  # A
    rhs = -(beta * cum.exp())[:, :, None] * (k @ state)  # [head, C, b]
    rhs[:, :, start:] += torch.diag_embed(beta)
    eye = torch.eye(size, dtype=q.dtype, device=q.device)
    pseudo = torch.linalg.solve_triangular(eye + strict, rhs, upper=False, unitriangular=True)  # U
    rows = cum.exp()[:, :, None] * (q @ state) + ((q @ k.transpose(-1, -2)) * decay) @ pseudo
    carried = (k * (cum[:, -1:] - cum).exp()[:, :, None]).transpose(-1, -2) @ pseudo
    return rows, cum[:, -1, None, None].exp() * state + carried


def delta_rule_map_naive(query, key, g, beta, *, l2norm: bool = True) -> torch.Tensor:
    """The same w in float64, straight from the definition: for each query t, u = q_t, and for s = t, t-1, ..., 0
    w_ts = beta_s k_s.u, then u <- P_s u. O(N^2 dk) in Python loops: for tests on a few dozen tokens."""
    q, k, g, beta = prepared(query, key, g, beta, l2norm=l2norm, dtype=torch.float64)
    heads, n, _ = q.shape
    w = torch.zeros(heads, n, n, dtype=torch.float64)
    for h in range(heads):
        for t in range(n):
            u = q[h, t].clone()
            for s in range(t, -1, -1):
                w[h, t, s] = beta[h, s] * (k[h, s] @ u)
                u = g[h, s].exp() * (u - beta[h, s] * k[h, s] * (k[h, s] @ u))
    return w


def apply_map(w: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """o [N, head, dv] = sum_s w[head, t, s] v_s; value [N, head, dv]."""
    return torch.einsum("hts,shd->thd", w, value.to(w.dtype))
