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

import math

import torch

CHUNK = 128  # with dk = 128 (Qwen3-Next), the earlier keys then cost N^2 dk multiply-adds per head
# Weights under TINY are set to 0 where they would be carried on: far below float32's resolution of any sum they
# enter (w's entries are O(1) at most), and as subnormal floats they make every later product ten to a hundred
# times slower on a CPU. 1e-18, so that the product of two kept numbers is still a normal float32 (over 1.2e-38).
TINY = 1e-18


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
    [N, value heads]. The chunkwise form of Yang et al. (2024) with the values set to the identity. The carried
    state S [dk, key] holds, for every key before the chunk, beta_s times its key vector propagated to the chunk's
    start (S_ts = P_t ... P_{s+1} beta_s k_s); a chunk's rows are then Q_hat S for the earlier keys and M T beta for
    its own, and S moves past the chunk as F S, where, with G the running log decay inside the chunk,
    Gamma_ts = e^(G_t - G_s) (s <= t), A = strictly lower (beta_t Gamma_ts k_t.k_s), T = (I + A)^-1,
    M = lower (Q K^T * Gamma): Q_hat = e^G Q - M T (beta e^G K) and F = e^(G_last) I - (K e^(G_last - G))^T T
    (beta e^G K), the chunk's transition P_last ... P_first in WY form. Multiply-adds per head: N^2 (dk + dk^2 /
    chunk) / 2 for the earlier keys, about 6 N chunk dk for the chunks' own, no N^2 dk^2 term. Keys whose decay
    since has fallen under TINY (1e-18) get weight 0 (see _bury)."""
    q, k, g, beta = prepared(query, key, g, beta, l2norm=l2norm, dtype=dtype)
    heads, n, dk = q.shape
    w = torch.empty(heads, n, n, dtype=dtype, device=q.device)
    # [head, dk, key], two buffers: each chunk's products write in place (torch.bmm's out), the state to the other
    state, spare = (torch.zeros(heads, dk, n, dtype=dtype, device=q.device) for _ in range(2))
    total = g.double().cumsum(-1)  # [head, N]: the log decay from the first token
    dead = [0] * heads  # per head, the earlier keys whose state columns are 0 for good
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        q_hat, own, transition, entering = _chunk(q[:, a:b], k[:, a:b], g[:, a:b], beta[:, a:b])
        w[:, a:b, a:b] = own
        w[:, a:b, b:] = 0
        live = min(dead)
        w[:, a:b, :live] = 0
        if a > live:
            torch.bmm(q_hat, state[:, :, live:a], out=w[:, a:b, live:a])
            torch.bmm(transition, state[:, :, live:a], out=spare[:, :, live:a])
            state, spare = spare, state
        state[:, :, a:b] = entering
        if l2norm:
            _bury(state, spare, total[:, :b], dead)
    return w


def _bury(state, spare, total, dead: list[int]) -> None:
    """Sets to 0 the state columns of keys whose decay since has fallen under TINY. With unit keys and beta in
    (0, 1), every P_r is a contraction, so column s is at most e^(total_now - total_s) in norm: these columns hold
    nothing a float32 sum can see, and as subnormal numbers they would slow every later product many times over.
    total: [head, b], the running log decay up to the state's position b - 1."""
    gone = ((total[:, -1:] - total) < math.log(TINY)).sum(-1).tolist()  # a prefix: total only falls
    for head, (before, now) in enumerate(zip(dead, gone)):
        if now > before:
            state[head, :, before:now] = spare[head, :, before:now] = 0
            dead[head] = now


def _chunk(q, k, g, beta):
    """One chunk's Q_hat [head, C, dk], its own block of w [head, C, C], its transition F [head, dk, dk] and the
    state columns of its own keys at its end [head, dk, C]; q, k [head, C, dk], g, beta [head, C]."""
    size = q.shape[1]
    cum = g.cumsum(-1)  # [head, C]: G_t, the log decay from the chunk's start to t
    lower = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    decay = _exp((cum[:, :, None] - cum[:, None, :]).masked_fill(~lower, float("-inf")))  # Gamma
    strict = (beta[:, :, None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)  # A
    inverse = unit_lower_inverse(_flushed(strict))
    mixed = _flushed(((q @ k.transpose(-1, -2)) * decay) @ inverse)  # M T
    k_in = k * (beta * _exp(cum))[:, :, None]  # beta e^G K: what the earlier state subtracts
    q_hat = _exp(cum)[:, :, None] * q - mixed @ k_in
    k_out = (k * _exp(cum[:, -1:] - cum)[:, :, None]).transpose(-1, -2) @ inverse  # (K e^(G_last-G))^T T
    transition = _exp(cum[:, -1, None, None]) * torch.eye(q.shape[-1], dtype=q.dtype, device=q.device) - k_out @ k_in
    return _flushed(q_hat), mixed * beta[:, None, :], _flushed(transition), _flushed(k_out * beta[:, None, :])


def unit_lower_inverse(a: torch.Tensor) -> torch.Tensor:
    """(I + a)^-1 for a strictly lower triangular a [..., C, C], by batched products only (LAPACK's batched
    triangular solve, and MKL's batched float64 products, are slow and erratic on a CPU at these sizes): halves by
    blocks, [[X11, 0], [-X22 a21 X11, X22]], and below 16 the finite Neumann series (I - a)(I + a^2)(I + a^4)
    (I + a^8) (a^16 = 0). Every product is flushed under TINY, so that no subnormal number enters the next."""
    size = a.shape[-1]
    eye = torch.eye(size, dtype=a.dtype, device=a.device)
    if size <= 16:
        inverse, power = eye - a, _flushed(a @ a)
        for _ in range(max(size - 1, 1).bit_length() - 1):
            inverse, power = _flushed(inverse @ (eye + power)), _flushed(power @ power)
        return inverse
    h = size // 2  # the blocks made contiguous: batched products of strided views take a slow path
    top, bottom = unit_lower_inverse(a[..., :h, :h].contiguous()), unit_lower_inverse(a[..., h:, h:].contiguous())
    inverse = torch.zeros_like(a)
    inverse[..., :h, :h], inverse[..., h:, h:] = top, bottom
    inverse[..., h:, :h] = -_flushed(_flushed(bottom @ a[..., h:, :h].contiguous()) @ top)
    return inverse


def _exp(x: torch.Tensor) -> torch.Tensor:
    """exp(x), 0 where it would be under TINY."""
    return x.masked_fill(x < math.log(TINY), float("-inf")).exp()


def _flushed(x: torch.Tensor) -> torch.Tensor:
    """x with its entries under TINY in magnitude set to 0."""
    return x.masked_fill(x.abs() < TINY, 0)


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
