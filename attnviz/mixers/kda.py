"""The exact implicit attention map of a Kimi Delta Attention layer (Kimi Linear).

KDA is a gated delta rule whose decay is a vector, one rate per key channel, instead of one number per head. Its
state S_t [key dim, value dim] per head is updated, as transformers' recurrent_kimi_delta_attention does, by

    S_t = (I - beta_t k_t k_t^T) D_t S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t,    D_t = diag(exp(g_t)),

g_t [key dim] the log decay of each channel (the decay is applied before the delta correction, so the two do not
commute as they do for a scalar decay), q and k l2-normalised (eps 1e-6 inside the root, use_qk_l2norm_in_kernel)
and q then multiplied by dk^-1/2. Unrolled, the output is linear in the values:

    o_t = sum_{s<=t} w_ts v_s,    w_ts = beta_s k_s^T P_{s+1}^T ... P_t^T q_t,    P_r = (I - beta_r k_r k_r^T) D_r,

exactly, for every value channel alike. w is not a probability: it can be negative and its rows do not sum to 1.
The layer's short convolution (with its SiLU) runs before the kernel: q, k and v are recorded after it, so the
convolution is part of q, k and v, not of w. The gated RMSNorm and output projection after the kernel are not
part of w either.
"""

from __future__ import annotations

import math
import torch

from attnviz.mixers.delta import TINY, unit_lower_inverse

CHUNK = 64  # the reference kernel's chunk
BLOCK = 16  # inside a chunk, pairs of tokens this close have their decays as a [head, block, block, dk] array


def prepared(query, key, g, beta, *, l2norm: bool, dtype=torch.float32):
    """The kernel's own preparation: q, k, g [head, N, dk] (l2-normalised if `l2norm`, q scaled by dk^-1/2),
    beta [head, N]. query, key, g: [N, head, dk]; beta: [N, head]."""
    q, k, g, beta = (x.transpose(0, 1).to(dtype) for x in (query, key, g, beta))
    if l2norm:
        q, k = (x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    return q * q.shape[-1] ** -0.5, k, g, beta


def kda_map(query, key, g, beta, *, l2norm: bool = True, chunk: int = CHUNK,
            dtype=torch.float32) -> torch.Tensor:
    """w [head, query, key] of a Kimi Delta Attention layer, so that o = w @ v per head.

    query, key, g: [N, head, dk] as the kernel receives them (g the log decay of each key channel); beta:
    [N, head]. The chunkwise form of the reference kernel (chunk_kimi_delta_attention) with the values set to the
    identity: the carried state Z [dk, key] holds, for every key before the chunk starting at a, beta_s times its
    key vector propagated to a (Z_s = P_{a-1} ... P_{s+1} beta_s k_s); a chunk's rows are then Q_hat Z for the
    earlier keys and M T beta for its own, and Z moves past the chunk as F Z. With G_t [dk] the running log decay
    inside the chunk and Gamma_tsc = e^(G_tc - G_sc) (s <= t): A = strictly lower (beta_t sum_c k_tc k_sc
    Gamma_tsc), T = (I + A)^-1, M = lower (sum_c q_tc k_sc Gamma_tsc); Q_hat = q e^G - M T (beta k e^G),
    F = diag(e^(G_last)) - (k e^(G_last - G))^T T (beta k e^G). Multiply-adds per head: N^2 (dk + dk^2 / chunk) / 2
    for the earlier keys, about N chunk dk for the chunks' own. Entries under TINY (1e-18) are set to 0 where they
    would be carried on (as in attnviz.mixers.delta: below float32's resolution of any sum they enter, and slow as
    subnormal numbers)."""
    q, k, g, beta = prepared(query, key, g, beta, l2norm=l2norm, dtype=dtype)
    heads, n, dk = q.shape
    w = torch.zeros(heads, n, n, dtype=dtype, device=q.device)
    # [head, dk, key]: Z for the keys before the chunk, two buffers so that each product writes in place (bmm's out)
    state, spare = (torch.zeros(heads, dk, n, dtype=dtype, device=q.device) for _ in range(2))
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        q_hat, own, transition, entering = _chunk(q[:, a:b], k[:, a:b], g[:, a:b], beta[:, a:b])
        w[:, a:b, a:b] = own
        if a:
            torch.bmm(q_hat, state[:, :, :a], out=w[:, a:b, :a])
            torch.bmm(transition, state[:, :, :a], out=spare[:, :, :a])
            state, spare = spare, state
            earlier = state[:, :, :a]
            earlier.masked_fill_(earlier.abs() < TINY, 0)
        state[:, :, a:b] = entering
    return w


def _chunk(q, k, g, beta):
    """One chunk's Q_hat [head, C, dk], its own block of w [head, C, C], its transition F [head, dk, dk] and the
    state columns of its own keys at its end [head, dk, C]; q, k, g [head, C, dk], beta [head, C]."""
    cum = g.cumsum(1)  # [head, C, dk]: G_t, each channel's log decay from the chunk's start to t
    kk, qk = _decayed(k, cum, k, q)
    strict = (beta[:, :, None] * kk).tril(-1)  # A
    inverse = unit_lower_inverse(_flushed(strict))  # T
    mixed = _flushed(qk @ inverse)  # M T
    k_in = k * beta[:, :, None] * _exp(cum)  # beta k e^G: what the earlier state subtracts
    q_hat = q * _exp(cum) - mixed @ k_in
    k_out = (k * _exp(cum[:, -1:] - cum)).transpose(-1, -2) @ inverse  # (k e^(G_last - G))^T T: [head, dk, C]
    transition = torch.diag_embed(_exp(cum[:, -1])) - k_out @ k_in
    return _flushed(q_hat), mixed * beta[:, None, :], _flushed(transition), _flushed(k_out * beta[:, None, :])


def _decayed(k, cum, *xs, block: int = BLOCK) -> list[torch.Tensor]:
    """For each x of xs, [head, C, C]: sum_c x_tc k_sc Gamma_tsc for s <= t, 0 above; x, k, cum [head, C, dk].
    Pairs inside a block of `block` tokens directly ([head, block, block, dk] decays, made once for every x); pairs
    across blocks as one product split at the last token r before t's block, e^(G_t - G_s) = e^(G_t - G_r)
    e^(G_r - G_s), both factors at most 1 (G only falls), so neither overflows and a factor that underflows stands
    for a product that is smaller still."""
    heads, size, _ = k.shape
    outs = [k.new_zeros(heads, size, size) for _ in xs]
    for a in range(0, size, block):
        b = min(a + block, size)
        lower = torch.ones(b - a, b - a, dtype=torch.bool, device=k.device).tril()
        gaps = (cum[:, a:b, None, :] - cum[:, None, a:b, :]).masked_fill(~lower[:, :, None], float("-inf"))
        near = k[:, None, a:b, :] * _exp(gaps)  # [head, t, s, dk]
        r = cum[:, a - 1:a]  # [head, 1, dk]: the log decay at the last token before the block
        far = (k[:, :a] * _exp(r - cum[:, :a])).transpose(-1, -2) if a else None  # [head, dk, a]
        for x, out in zip(xs, outs):
            out[:, a:b, a:b] = (x[:, a:b, None, :] * near).sum(-1)
            if a:
                out[:, a:b, :a] = (x[:, a:b] * _exp(cum[:, a:b] - r)) @ far
    return outs


def _exp(x: torch.Tensor) -> torch.Tensor:
    """exp(x), 0 where it would be under TINY."""
    return x.masked_fill(x < math.log(TINY), float("-inf")).exp()


def _flushed(x: torch.Tensor) -> torch.Tensor:
    """x with its entries under TINY in magnitude set to 0."""
    return x.masked_fill(x.abs() < TINY, 0)
