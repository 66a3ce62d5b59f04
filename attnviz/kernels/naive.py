"""Attention the plain ways: naive (the whole score matrix at once), the float64 reference, and a two-pass tiled
version that never holds more than one tile of scores but reads K twice.

All take q: [batch, head, n_query, d], k and v: [batch, head, n_key, d] torch tensors. causal: query i sees key
j <= i + (n_key - n_query), the alignment of attnviz.attention.causal_mask.
"""

from __future__ import annotations

import math

import torch

from attnviz.attention import MaskRule, causal_mask, scaled_dot_product_attention


def naive_attention(q, k, v, *, causal=False, scale=None):
    """softmax(q k^T * scale) v, materialising the [n_query, n_key] scores and pattern (Vaswani et al. 2017, eq. 1).

    Matmuls run in the input dtype, the softmax in float32 (as transformers' eager attention does).
    A query with no visible key (causal, n_query > n_key) gets a zero output. Returns [batch, head, n_query, d].
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = (q @ k.transpose(-2, -1)) * scale  # [batch, head, query, key]
    if causal:  # built where the scores live (causal_mask's alignment), so a GPU run moves no N x N mask
        n_query, n_key = q.shape[-2], k.shape[-2]
        visible = torch.ones(n_query, n_key, dtype=torch.bool, device=q.device).tril(n_key - n_query)
        scores = scores.masked_fill(~visible, float("-inf"))
    pattern = torch.softmax(scores.float(), dim=-1).nan_to_num(0.0).to(q.dtype)  # all-masked row: 0/0 -> 0
    return pattern @ v


def reference_attention(q, k, v, *, causal=False, scale=None, window=None):
    """The float64 reference every kernel is checked against: attnviz.attention on float64 copies of the inputs,
    under the causal mask, or a sliding window of `window` keys (the query's own included), when asked."""
    q, k, v = (torch.as_tensor(x).cpu().double() for x in (q, k, v))
    mask = torch.as_tensor(causal_mask(q.shape[-2], k.shape[-2])) if causal else None
    if window is not None:  # query i at position p = i + n_key - n_query sees keys p - window < j <= p
        mask = torch.as_tensor(MaskRule(q.shape[-2], k.shape[-2], causal=True, window=int(window)).rows(
            0, q.shape[-2]))
    out, _ = scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)
    return out


def two_pass_attention(q, k, v, *, causal=False, scale=None, block_m=32, block_n=32):
    """Tiled attention with a two-pass softmax: pass 1 finds each row's max m over all key tiles, pass 2 sums
    l = sum exp(s - m) and acc = sum exp(s - m) v tile by tile, then O = acc / l.

    Only one [block_m, block_n] tile of scores exists at a time, but every score is computed twice and K is read
    twice; the online softmax (tiled_steps, flash_attention) needs one pass. Computes in float32 (float64 for
    float64 input). Returns [batch, head, n_query, d] in q's dtype.
    """
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    n_query, n_key = q.shape[-2], k.shape[-2]
    offset = n_key - n_query
    out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    for start_m in range(0, n_query, block_m):
        rows = torch.arange(start_m, min(start_m + block_m, n_query), device=q.device)
        qb = q[..., rows, :].to(dtype)  # [batch, head, block_m, d]
        hi = max(0, min(int(rows[-1]) + 1 + offset, n_key)) if causal else n_key

        def tile_scores(start_n):
            cols = torch.arange(start_n, min(start_n + block_n, hi), device=q.device)
            s = (qb @ k[..., cols, :].to(dtype).transpose(-2, -1)) * scale  # [batch, head, block_m, block_n]
            if causal:
                s = s.masked_fill(cols[None, :] > rows[:, None] + offset, float("-inf"))
            return s, cols

        m = torch.full(qb.shape[:-1], float("-inf"), dtype=dtype, device=q.device)
        for start_n in range(0, hi, block_n):  # pass 1: the row max
            m = torch.maximum(m, tile_scores(start_n)[0].amax(-1))
        m_shift = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape, dtype=dtype, device=q.device)
        for start_n in range(0, hi, block_n):  # pass 2: the sum and the weighted values
            s, cols = tile_scores(start_n)
            p = torch.exp(s - m_shift[..., None])
            l = l + p.sum(-1)
            acc = acc + p @ v[..., cols, :].to(dtype)
        out[..., rows, :] = acc / torch.where(l == 0, torch.ones_like(l), l)[..., None]
    return out.to(q.dtype)
