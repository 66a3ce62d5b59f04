"""Scaled dot-product attention, once, for every page and module to reuse.

Vaswani et al. 2017, eq. 1: Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

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


# ---------------------------------------------------------------------------------------------------------------------
# The attention core: what one layer's attention saw (q, k, and the rules applied to q.k), and its scores and pattern
# computed from that, a block of query rows at a time. Capture records a LayerInputs per layer; every map, score and
# statistic attnviz shows of a real model is computed here from it.
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MaskRule:
    """Which keys each query may see, without an [n_query, n_key] array where a rule says it.

    Queries are aligned to the last keys: query i sits at position i + (n_key - n_query).
    causal=True: query i sees key j <= its position (causal_mask's alignment); causal=False: every key.
    window=w (with causal): only the last w keys, the query's own included (position - w < j <= position), as
    transformers' sliding_window_overlay defines it (Gemma 2/3, Mistral, gpt-oss).
    chunk=c (with causal): only the keys of the query's own chunk of c positions (j // c == position // c), Llama
    4's chunked attention.
    bits: an explicit mask instead (padding, anything the model built that no rule names), as np.packbits of the
    [n_query, n_key] bool matrix along keys (1/8 byte per entry). True = may attend.
    """

    n_query: int
    n_key: int
    causal: bool = False
    bits: np.ndarray | None = None
    window: int | None = None
    chunk: int | None = None

    @classmethod
    def from_bool(cls, visible) -> "MaskRule":
        """The rule for a [n_query, n_key] bool matrix: the causal, full, sliding-window or chunked rule when it is
        exactly that, else its bits."""
        visible = np.asarray(visible, dtype=bool)
        n_query, n_key = visible.shape
        if visible.all():
            return cls(n_query, n_key, causal=False)
        for rule in _named_rules(visible):
            if np.array_equal(visible, rule.rows(0, n_query)):
                return rule
        return cls(n_query, n_key, causal=False, bits=np.packbits(visible, axis=1))

    @property
    def kind(self) -> str:
        """"explicit", "sliding", "chunked", "causal" or "full"."""
        if self.bits is not None:
            return "explicit"
        return "sliding" if self.window else "chunked" if self.chunk else "causal" if self.causal else "full"

    def rows(self, start: int, stop: int, key_end: int | None = None, key_start: int = 0) -> np.ndarray:
        """[stop - start, key_end - key_start] bool: the visibility of keys key_start .. key_end - 1 for queries
        start .. stop - 1."""
        key_end = self.n_key if key_end is None else key_end
        if self.bits is not None:
            return np.unpackbits(self.bits[start:stop], axis=1, count=self.n_key)[:, key_start:key_end].astype(bool)
        if not self.causal:
            return np.ones((stop - start, key_end - key_start), dtype=bool)
        pos = np.arange(start, stop)[:, None] + (self.n_key - self.n_query)
        keys = np.arange(key_start, key_end)[None, :]
        visible = keys <= pos
        if self.window:
            visible &= keys > pos - self.window
        if self.chunk:
            visible &= keys // self.chunk == pos // self.chunk
        return visible

    def key_end(self, start: int, stop: int) -> int:
        """One past the last key any of the queries start .. stop - 1 may see (keys after it are never needed)."""
        if self.bits is not None:
            seen = np.nonzero(np.unpackbits(self.bits[start:stop], axis=1, count=self.n_key).any(0))[0]
            return int(seen[-1]) + 1 if len(seen) else 0
        if self.causal:
            return max(0, min(self.n_key, stop + self.n_key - self.n_query))
        return self.n_key

    def key_start(self, start: int, stop: int) -> int:
        """The first key any of the queries start .. stop - 1 may see: the key tiles left of it are never
        computed (a sliding window's or a chunk's), so a windowed layer costs O(n w), not O(n²)."""
        first = start + self.n_key - self.n_query  # the position of the block's first query
        if self.bits is not None:
            seen = np.nonzero(np.unpackbits(self.bits[start:stop], axis=1, count=self.n_key).any(0))[0]
            return int(seen[0]) if len(seen) else 0
        if self.window and self.causal:
            return max(0, first - self.window + 1)
        if self.chunk and self.causal:
            return max(0, first // self.chunk * self.chunk)
        return 0

    def visible_keys(self) -> int:
        """How many (query, key) pairs the rule lets through: the work of a pass that skips every hidden key."""
        if self.bits is not None:
            return int(sum(np.unpackbits(self.bits[a:a + 1024], axis=1, count=self.n_key).sum()
                           for a in range(0, self.n_query, 1024)))
        if not self.causal:
            return self.n_query * self.n_key
        pos = np.arange(self.n_query, dtype=np.int64) + (self.n_key - self.n_query)
        seen = np.minimum(pos + 1, self.n_key)
        if self.window:
            seen = np.minimum(seen, self.window)
        if self.chunk:
            seen = np.minimum(seen, pos % self.chunk + 1)
        return int(seen.sum())


def _named_rules(visible: np.ndarray) -> list[MaskRule]:
    """The causal, sliding-window and chunked rules a [n_query, n_key] bool mask could be (MaskRule.from_bool
    keeps the one that equals it)."""
    n_query, n_key = visible.shape
    return named_rules_from_rows(visible, np.arange(n_query), n_query, n_key)


def named_rules_from_rows(visible: np.ndarray, rows: np.ndarray, n_query: int, n_key: int) -> list[MaskRule]:
    """The rules that some query rows of a mask (visible [len(rows), n_key], for query rows `rows` in increasing
    order) suggest: causal; a sliding window as wide as the widest row; chunks as long as the first row that does
    not see key 0 is far. The caller checks each against the mask."""
    offset = n_key - n_query
    candidates = [MaskRule(n_query, n_key, causal=True)]
    widest = int(visible.sum(1).max()) if len(visible) else 0
    if 0 < widest < n_key:
        candidates.append(MaskRule(n_query, n_key, causal=True, window=widest))
    later = np.nonzero(~visible[:, 0])[0]
    if len(later) and int(rows[later[0]]) + offset > 0:
        candidates.append(MaskRule(n_query, n_key, causal=True, chunk=int(rows[later[0]]) + offset))
    return candidates


@dataclass
class LayerInputs:
    """What one attention layer saw: everything its softmax's logits are made of.

    q: [head, n_query, d] query vectors after the positional rotation (RoPE), float32 on the CPU (or, handed on
       during a capture with DuringForward.device_inputs, where a GPU model made them, in its dtype: on_cpu())
    k: [kv_head, n_key, d] key vectors after the rotation, before the GQA repeat, likewise
    kv_head_of: for each query head, the KV head it reads
    scaling: the factor q.k is multiplied by (1/sqrt(d) in most families)
    mask: the MaskRule the model applied
    softcap: Gemma 2's logit soft-capping c (scores -> c tanh(scores / c)), or None
    key_bias: [head, n_key] additive bias after scaling (BLOOM's ALiBi: slope_h * key position), or None
    sink: [head] learned sink logits (gpt-oss): one extra logit per head in every row's softmax, with no value, or None
    """

    q: torch.Tensor
    k: torch.Tensor
    kv_head_of: tuple[int, ...]
    scaling: float
    mask: MaskRule
    softcap: float | None = None
    key_bias: torch.Tensor | None = None
    sink: torch.Tensor | None = None

    @property
    def n_heads(self) -> int:
        return int(self.q.shape[0])

    @property
    def n_query(self) -> int:
        return int(self.q.shape[1])

    @property
    def n_key(self) -> int:
        return int(self.k.shape[1])

    @property
    def head_dim(self) -> int:
        return int(self.q.shape[-1])

    def on_cpu(self) -> LayerInputs:
        """These inputs with q and k as float32 on the CPU (self where they already are)."""
        if self.q.device.type == "cpu" and self.q.dtype == self.k.dtype == torch.float32:
            return self
        return dataclasses.replace(self, q=self.q.float().cpu(), k=self.k.float().cpu())

    def nbytes(self) -> int:
        extra = sum(x.numel() * x.element_size() for x in (self.key_bias, self.sink) if x is not None)
        bits = 0 if self.mask.bits is None else self.mask.bits.nbytes  # the rules themselves take no memory
        return self.q.numel() * self.q.element_size() + self.k.numel() * self.k.element_size() + extra + bits


def layer_scores(inputs: LayerInputs, start: int = 0, stop: int | None = None, *, heads=None, key_end=None,
                 key_start: int = 0, dtype=torch.float32, out: torch.Tensor | None = None) -> torch.Tensor:
    """The logits that enter the softmax for queries start .. stop - 1: q.k * scaling, soft-capped, plus the bias,
    -inf where the mask forbids. [len(heads), rows, key_end - key_start]. heads: None for all, or a list of head
    indices. Keys key_start .. key_end - 1 (default key_end: the last the mask lets these rows see).
    out: a contiguous tensor of that shape and dtype to write the scores into (a tiled pass reuses one buffer
    rather than allocating each tile). A scaling that is a power of two (1/8 for d = 64) multiplies q before the
    product instead of every score after it: the same numbers bit for bit (a power of two changes no rounding),
    one pass over the scores fewer."""
    stop = inputs.n_query if stop is None else stop
    key_end = inputs.mask.key_end(start, stop) if key_end is None else key_end
    k0 = int(key_start)
    heads = list(range(inputs.n_heads)) if heads is None else list(heads)
    n_kv = inputs.k.shape[0]
    group = inputs.n_heads // n_kv
    exact = _power_of_two(inputs.scaling)
    if heads == list(range(inputs.n_heads)) and list(inputs.kv_head_of) == [h // group for h in heads]:
        # every head, grouped as GQA groups them: one matmul per KV head over its query heads' rows, without a
        # copy of K per query head
        q = inputs.q[:, start:stop].to(dtype)
        q = (q * inputs.scaling if exact else q).reshape(n_kv, group * (stop - start), -1)
        k = inputs.k[:, k0:key_end].to(dtype)
        into = None if out is None else out.view(n_kv, group * (stop - start), key_end - k0)
        scores = torch.matmul(q, k.transpose(-1, -2), out=into).view(inputs.n_heads, stop - start, key_end - k0)
    else:
        q = inputs.q[heads, start:stop].to(dtype)
        q = q * inputs.scaling if exact else q
        k = inputs.k[[inputs.kv_head_of[h] for h in heads], k0:key_end].to(dtype)
        scores = torch.matmul(q, k.transpose(-1, -2), out=out)
    if not exact:
        scores *= inputs.scaling  # in place, in eager attention's order: (q.k) * scaling
    if inputs.softcap:
        scores.div_(inputs.softcap).tanh_().mul_(inputs.softcap)
    if inputs.key_bias is not None:
        scores += inputs.key_bias[heads, None, k0:key_end].to(dtype)
    kind = inputs.mask.kind
    if kind == "causal":  # only keys right of the block's first query can be hidden from some of its rows
        lo = max(k0, start + inputs.mask.n_key - inputs.mask.n_query + 1)
        if lo < key_end:
            visible = torch.from_numpy(inputs.mask.rows(start, stop, key_end, key_start=lo))
            scores[..., lo - k0:].masked_fill_(~visible, float("-inf"))
    elif kind != "full":
        scores.masked_fill_(~torch.from_numpy(inputs.mask.rows(start, stop, key_end, key_start=k0)), float("-inf"))
    return scores


def _power_of_two(x: float) -> bool:
    """Whether x is +-2^k: multiplying by it rounds nothing (short of overflow or underflow)."""
    return x != 0 and math.isfinite(x) and math.frexp(abs(x))[0] == 0.5


def masked_softmax(logits, axis: int = -1, extra=None):
    """The one softmax of attnviz: exp(x_i - m) / (sum_j exp(x_j - m) + exp(extra - m)), m the largest logit.

    -inf logits (masked keys) get weight 0, and a slice with no finite logit (and no extra) gets zeros rather than
    NaN. extra: an additional logit per slice (broadcast against the reduced shape, e.g. a learned sink [head, 1]
    for scores [head, rows, keys]) that takes part in the normalisation but is not returned. Works on torch
    tensors (in their dtype) and on numpy arrays (float64; numpy has its own path because small torch ops on numpy
    data pay thread-pool overheads that dominate the pages' sweeps). Returns (weights like logits, extra's weight
    of the reduced shape, or None)."""
    if isinstance(logits, torch.Tensor):
        m = logits.amax(dim=axis)
        if extra is not None:
            extra = torch.as_tensor(extra, dtype=logits.dtype, device=logits.device)
            m = torch.maximum(m, extra)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.exp(logits - m.unsqueeze(axis))
        total = e.sum(dim=axis)
        extra_e = None if extra is None else torch.exp(extra - m)
        total = total if extra_e is None else total + extra_e
        safe = torch.where(total > 0, total, torch.ones_like(total))
        return e / safe.unsqueeze(axis), (None if extra_e is None else extra_e / safe)
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x, axis=axis)
    if extra is not None:
        extra = np.asarray(extra, dtype=np.float64)
        m = np.maximum(m, extra)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - np.expand_dims(m, axis))
    total = e.sum(axis=axis)
    extra_e = None if extra is None else np.exp(extra - m)
    total = total if extra_e is None else total + extra_e
    safe = np.where(total > 0, total, 1.0)
    return e / np.expand_dims(safe, axis), (None if extra_e is None else extra_e / safe)


def softmax_with_sink(scores: torch.Tensor, sink: torch.Tensor | None = None):
    """masked_softmax over the last axis, with an optional extra logit per head (sink [head], scores [head, rows,
    keys]) that takes part in the normalisation but is not returned as a column. Rows with no visible key (and no
    sink) get zeros. Returns (weights like scores, sink_weight [head, rows] or None)."""
    return masked_softmax(scores, -1, None if sink is None else sink.to(scores.dtype)[:, None])


def layer_pattern(inputs: LayerInputs, start: int = 0, stop: int | None = None, *, heads=None, key_end=None,
                  dtype=torch.float32):
    """Attention weights for queries start .. stop - 1 from the layer's inputs: softmax(layer_scores) with the
    learned sink in the denominator. Returns (weights [heads, rows, key_end], sink_weight [heads, rows] or None);
    each row of weights plus its sink weight sums to 1."""
    heads_list = list(range(inputs.n_heads)) if heads is None else list(heads)
    stop = inputs.n_query if stop is None else stop
    key_end = inputs.mask.key_end(start, stop) if key_end is None else key_end
    k0 = min(inputs.mask.key_start(start, stop), key_end)  # the key tiles left of a window are never computed
    scores = layer_scores(inputs, start, stop, heads=heads_list, key_start=k0, key_end=key_end, dtype=dtype)
    sink = None if inputs.sink is None else inputs.sink[heads_list]
    weights, sink_weight = softmax_with_sink(scores, sink)
    if k0:  # the keys no row of the block sees: weight 0
        weights = torch.cat([weights.new_zeros(*weights.shape[:-1], k0), weights], dim=-1)
    return weights, sink_weight


def layer_output(inputs: LayerInputs, v: torch.Tensor, *, block: int = 256, dtype=torch.float32) -> torch.Tensor:
    """The attention output weights @ v computed a block of query rows at a time, never holding more than
    [head, block, n_key] weights. v: [kv_head, n_key, d_v]. Returns [head, n_query, d_v]."""
    out = torch.empty(inputs.n_heads, inputs.n_query, v.shape[-1], dtype=dtype)
    v_rep = v.to(dtype)[list(inputs.kv_head_of)]
    for a in range(0, inputs.n_query, block):
        b = min(a + block, inputs.n_query)
        k1 = inputs.mask.key_end(a, b)
        k0 = min(inputs.mask.key_start(a, b), k1)  # only the keys the block's rows may see
        scores = layer_scores(inputs, a, b, key_start=k0, key_end=k1, dtype=dtype)
        weights, _ = softmax_with_sink(scores, inputs.sink)
        out[:, a:b] = torch.matmul(weights, v_rep[:, k0:k1])
    return out


def kv_head_of(n_heads: int, n_kv_heads: int | None = None) -> list[int]:
    """For each query head, the key/value head it reads: query head h uses KV head h // (n_heads / n_kv_heads)
    (MHA when n_kv_heads is n_heads or None, MQA when it is 1)."""
    n_kv = n_heads if not n_kv_heads else int(n_kv_heads)
    if n_heads % n_kv:
        raise ValueError(f"{n_heads} query heads cannot be shared evenly by {n_kv} KV heads")
    group = n_heads // n_kv
    return [h // group for h in range(n_heads)]
