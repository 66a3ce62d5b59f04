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

import torch

from attnviz.mixers.delta import chunked_map, chunked_rows, exp_flushed_, flushed, prepared, unit_lower_inverse

CHUNK = 64  # the reference kernel's chunk
BLOCK = 16  # inside a chunk, pairs of tokens this close have their decays as a [batch, block, block, dk] array


def kda_map(query, key, g, beta, *, l2norm: bool = True, chunk: int = CHUNK, dtype=torch.float32,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """w [head, query, key] of a Kimi Delta Attention layer, so that o = w @ v per head.

    query, key, g: [N, head, dk] as the kernel receives them (g the log decay of each key channel); beta:
    [N, head]. The chunkwise form of the reference kernel (chunk_kimi_delta_attention) with the values set to the
    identity: the carried state Z [dk, key] holds, for every key before the chunk starting at a, beta_s times its
    key vector propagated to a (Z_s = P_{a-1} ... P_{s+1} beta_s k_s); a chunk's rows are then Q_hat Z for the
    earlier keys and M T beta for its own, and Z moves past the chunk as F Z. With G_t [dk] the running log decay
    inside the chunk and Gamma_tsc = e^(G_tc - G_sc) (s <= t): A = strictly lower (beta_t sum_c k_tc k_sc
    Gamma_tsc), T = (I + A)^-1, M = lower (sum_c q_tc k_sc Gamma_tsc); Q_hat = q e^G - M T (beta k e^G),
    F = diag(e^(G_last)) - (k e^(G_last - G))^T T (beta k e^G) (_chunk). Multiply-adds per head:
    N^2 (dk + dk^2 / chunk) / 2 for the earlier keys, about N chunk dk for the chunks' own. The loop over chunks,
    the preparation of q and k, the entries under TINY (1e-18) set to 0, the memory, the cores and out are the
    gated delta rule's (attnviz.mixers.delta: prepared, chunked_map): only the chunk's maths differs."""
    return chunked_map(prepared(query, key, g, beta, l2norm=l2norm, dtype=dtype), _chunk, chunk=chunk,
                       l2norm=l2norm, out=out)


def kda_rows(query, key, g, beta, *, l2norm: bool = True, chunk: int = CHUNK, dtype=torch.float32, into=None,
             heads: slice = slice(None)):
    """The rows of kda_map a chunk at a time, never an N x N array (attnviz.mixers.delta.chunked_rows): yields
    (a, b, rows), rows [head, b - a, b] the map's rows a .. b - 1 on keys 0 .. b - 1, equal to
    kda_map(...)[:, a:b, :b] (the same products). heads: only these heads (rows [len, b - a, b])."""
    yield from chunked_rows(prepared(query, key, g, beta, l2norm=l2norm, dtype=dtype, heads=heads), _chunk,
                            chunk=chunk, l2norm=l2norm, into=into)


def _chunk(q, k, g, beta):
    """Chunks' Q_hat [batch, C, dk], own blocks of w [batch, C, C], transitions F [batch, dk, dk] and the state
    columns of their own keys at their ends [batch, dk, C]; q, k, g [batch, C, dk], beta [batch, C] (a batch of
    (head, chunk) pairs, as attnviz.mixers.delta's loop asks for them)."""
    cum = g.cumsum(1)  # [batch, C, dk]: G_t, each channel's log decay from the chunk's start to t
    kk, qk = _decayed(k, cum, k, q)
    strict = (beta[:, :, None] * kk).tril(-1)  # A
    inverse = unit_lower_inverse(flushed(strict))  # T
    mixed = flushed(qk @ inverse)  # M T
    grow = exp_flushed_(cum.clone())  # e^G
    k_in = k * beta[:, :, None] * grow  # beta k e^G: what the earlier state subtracts
    q_hat = q * grow - mixed @ k_in
    k_out = (k * exp_flushed_(cum[:, -1:] - cum)).transpose(-1, -2) @ inverse  # (k e^(G_last - G))^T T
    transition = torch.diag_embed(exp_flushed_(cum[:, -1].clone())) - k_out @ k_in
    return flushed(q_hat), mixed * beta[:, None, :], flushed(transition), flushed(k_out * beta[:, None, :])


def _decayed(k, cum, *xs, block: int = BLOCK) -> list[torch.Tensor]:
    """For each x of xs, [batch, C, C]: sum_c x_tc k_sc Gamma_tsc for s <= t, 0 above; x, k, cum [batch, C, dk].
    Pairs inside a block of `block` tokens directly ([batch, block, block, dk] decays, made once for every x); pairs
    across blocks as one product split at the last token r before t's block, e^(G_t - G_s) = e^(G_t - G_r)
    e^(G_r - G_s), both factors at most 1 (G only falls), so neither overflows and a factor that underflows stands
    for a product that is smaller still."""
    heads, size, _ = k.shape
    outs = [k.new_zeros(heads, size, size) for _ in xs]
    for a in range(0, size, block):
        b = min(a + block, size)
        lower = torch.ones(b - a, b - a, dtype=torch.bool, device=k.device).tril()
        gaps = (cum[:, a:b, None, :] - cum[:, None, a:b, :]).masked_fill(~lower[:, :, None], float("-inf"))
        near = k[:, None, a:b, :] * exp_flushed_(gaps)  # [batch, t, s, dk]
        r = cum[:, a - 1:a]  # [batch, 1, dk]: the log decay at the last token before the block
        far = (k[:, :a] * exp_flushed_(r - cum[:, :a])).transpose(-1, -2) if a else None  # [batch, dk, a]
        for x, out in zip(xs, outs):
            out[:, a:b, a:b] = (x[:, a:b, None, :] * near).sum(-1)
            if a:
                out[:, a:b, :a] = (x[:, a:b] * exp_flushed_(cum[:, a:b] - r)) @ far
    return outs
