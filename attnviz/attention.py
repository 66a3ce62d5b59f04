"""Scaled dot-product attention, once, for every page and module to reuse.

Vaswani et al. 2017, eq. 1: Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def scaled_dot_product_attention(q, k, v, *, mask=None, bias=None, scale=None):
    """softmax(q k^T * scale + bias, masked) v. Returns (output, weights).

    q: [..., n_query, d_k], k: [..., n_key, d_k], v: [..., n_key, d_v]; weights: [..., n_query, n_key].
    scale=None means 1/sqrt(d_k), as in torch; scale=1.0 is the unscaled variant.
    mask: bool, True = may attend, broadcast against the scores. bias: added to the scaled scores (ALiBi).
    A row whose keys are all masked gets zero weights (and a zero output) rather than NaN.
    Numpy in -> numpy out; torch in -> torch out. The softmax runs in at least float32, in float64 for float64 input.
    """
    as_numpy = isinstance(q, np.ndarray)
    scores = _scores(*(_as_tensor(x) for x in (q, k)), mask=mask, bias=bias, scale=scale)  # [..., n_query, n_key]
    v = _as_tensor(v)
    dtype = scores.dtype
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    exp = torch.exp(scores - row_max)
    total = exp.sum(dim=-1, keepdim=True)
    weights = torch.where(total > 0, exp / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(exp))
    output = weights @ v.to(dtype)
    if as_numpy:
        return output.numpy(), weights.numpy()
    return output, weights


def attention_scores(q, k, *, mask=None, bias=None, scale=None):
    """The logits the softmax sees: q k^T * scale + bias, -inf where the mask forbids. [..., n_query, n_key].

    Same arguments and conventions as scaled_dot_product_attention, which is built on this function.
    """
    as_numpy = isinstance(q, np.ndarray)
    scores = _scores(_as_tensor(q), _as_tensor(k), mask=mask, bias=bias, scale=scale)
    return scores.numpy() if as_numpy else scores


def _scores(q: torch.Tensor, k: torch.Tensor, *, mask, bias, scale) -> torch.Tensor:
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = (q.to(dtype) @ k.to(dtype).transpose(-2, -1)) * scale
    if bias is not None:
        scores = scores + _as_tensor(bias).to(dtype)
    if mask is not None:
        scores = scores.masked_fill(~_as_tensor(mask).to(torch.bool), float("-inf"))
    return scores


def causal_mask(n_query: int, n_key: int | None = None) -> np.ndarray:
    """[n_query, n_key] bool, True where key j <= query i (queries aligned to the last keys)."""
    n_key = n_query if n_key is None else n_key
    offset = n_key - n_query
    return np.tril(np.ones((n_query, n_key), dtype=bool), k=offset)


def _as_tensor(x) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
