"""Attention sinks: how much attention the first tokens soak up, per head, per text and over many texts.

Gu et al., ICLR 2025, "When Attention Sink Emerges in Language Models": the sink score of key k is the mean,
over the queries that can see it, of the attention they give it,

    alpha_k = 1 / (T - k) * sum_{t=k}^{T-1} A[t, k]        (causal; a bidirectional model averages all T queries)

a head is a sink head on a text when alpha_0 exceeds eps (0.3 in the paper), and the sink metric
Sink_k^eps is the share of (text, layer, head) triples with alpha_k > eps, over a sample of texts (64-token
texts in the paper). StreamingLLM's eviction experiment lives in attnviz.streaming; a map drawn with its sinks
hidden, in attnviz.views.sink_hidden.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SINK_THRESHOLD = 0.3  # Gu et al. 2025, the epsilon of their sink metric
SINK_HEAD_SHARE = 0.05  # a sink key is above the threshold in at least this share of the heads
MIN_SEEN_SHARE = 0.25  # keys seen by fewer than this share of the queries are not judged (causal models)


def sink_scores(pattern, *, causal: bool = True) -> np.ndarray:
    """alpha_k, the mean attention key k receives from the queries that can see it. Returns [..., key].

    Gu et al. 2025: alpha_k = 1/(T - k) * sum_{t=k}^{T-1} A[t, k] for a causal model (T tokens, 0-based).
    For a bidirectional encoder (BERT) every query sees every key, so causal=False averages over all T queries.
    pattern: [..., query, key] with query == key.
    """
    a = np.asarray(pattern, dtype=np.float64)
    n = a.shape[-1]
    if a.shape[-2] != n:
        raise ValueError(f"sink scores need a square pattern, got {a.shape[-2]} queries x {n} keys")
    if not causal:
        return a.mean(axis=-2)
    seen = np.tril(np.ones((n, n)))  # [query, key], 1 where t >= k
    return (a * seen).sum(axis=-2) / seen.sum(axis=0)


def capture_sink_scores(capture, *, block: int = 256, progress=None) -> np.ndarray:
    """sink_scores of every captured layer and head, [layer, head, key], read from the capture a block of query
    rows at a time (capture.layer_rows), so it works in the long-text store at the model's full context.

    Column sums over the rows, divided by the number of queries that can see each key (n - k when causal, n
    otherwise): the weights a causal mask hides are exact zeros in both stores, so the sums over all rows are the
    sums over t >= k. progress(done, total) after each layer."""
    n = capture.n_tokens
    sums = np.zeros((len(capture.layers), capture.n_heads, n))
    for li, layer in enumerate(capture.layers):
        for a in range(0, n, block):
            sums[li] += np.asarray(capture.layer_rows(layer, a, min(n, a + block)), dtype=np.float64).sum(axis=1)
        if progress is not None:
            progress(li + 1, len(capture.layers))
    seen = (n - np.arange(n)) if capture.causal else np.full(n, n)
    return sums / seen


def sink_heads(alpha, *, key: int = 0, threshold: float = SINK_THRESHOLD) -> np.ndarray:
    """[..., head] bool: the heads whose sink score on `key` exceeds the threshold (Gu et al.: alpha_0 > 0.3).

    alpha: sink scores [..., head, key] from sink_scores.
    """
    return np.asarray(alpha)[..., key] > threshold


def sink_head_share(alpha, *, key: int = 0, threshold: float = SINK_THRESHOLD) -> np.ndarray:
    """[layer] the fraction of each layer's heads that are sink heads. alpha: [layer, head, key]."""
    return sink_heads(alpha, key=key, threshold=threshold).mean(axis=-1)


@dataclass(frozen=True)
class SinkKey:
    position: int
    token: str
    mean_score: float  # alpha_k averaged over every layer and head
    sink_heads: int  # heads with alpha_k > threshold
    top_heads: int  # heads for which this key has the largest alpha


def judged_keys(n: int, *, causal: bool = True, min_seen_share: float = MIN_SEEN_SHARE) -> np.ndarray:
    """[key] bool: the keys seen by at least `min_seen_share` of the n queries, the only ones ranked or called sinks.

    In a causal model key k is seen by the n - k queries t >= k, so alpha_k of a late key averages a handful of
    rows (the last key's alpha is the newest token's attention to itself): keys with n - k < min_seen_share * n
    are left unjudged. In a bidirectional model every query sees every key, so every key is judged.
    """
    seen = n - np.arange(n) if causal else np.full(n, n)
    return seen >= min_seen_share * n


def min_sink_heads(n_heads: int, min_head_share: float = SINK_HEAD_SHARE) -> int:
    """The fewest heads, out of n_heads, that make up at least min_head_share of them: ceil(share * n_heads),
    rounded first so that 0.05 * 60 = 3.0000000000000004 asks for 3 heads, not 4."""
    return max(1, math.ceil(round(min_head_share * n_heads, 9)))


def sink_keys(alpha, *, causal: bool = True, threshold: float = SINK_THRESHOLD,
              min_head_share: float = SINK_HEAD_SHARE, min_seen_share: float = MIN_SEEN_SHARE) -> np.ndarray:
    """Positions of the sink keys, ascending: the judged keys (judged_keys) whose alpha_k exceeds `threshold` in at
    least `min_head_share` of the heads. alpha: [..., head, key] sink scores; every layer's heads are pooled.

    Gu et al. 2025 call a head a sink head when alpha_0 > 0.3; this applies the same test to every key, so a sink
    that is not token 0 ([SEP], a full stop) is found too.
    """
    a = np.asarray(alpha, dtype=np.float64).reshape(-1, np.shape(alpha)[-1])  # [layer * head, key]
    above = (a > threshold).sum(axis=0)
    judged = judged_keys(a.shape[-1], causal=causal, min_seen_share=min_seen_share)
    return np.flatnonzero(judged & (above >= min_sink_heads(a.shape[0], min_head_share)))


def top_sink_keys(alpha, tokens: Sequence[str], *, top: int = 5, causal: bool = True,
                  threshold: float = SINK_THRESHOLD, min_seen_share: float = MIN_SEEN_SHARE) -> list[SinkKey]:
    """The judged keys (judged_keys) that soak up the most attention, best first, so a sink that is not token 0
    ([CLS], [SEP], a full stop) shows up. alpha: [layer, head, key] sink scores.

    Ranked by alpha_k averaged over layers and heads. In a causal model only keys seen by at least
    `min_seen_share` of the queries are ranked: the last keys are seen by a few queries, so their alpha is the
    attention of those few (the newest token often attends to itself) rather than a habit.
    """
    a = np.asarray(alpha, dtype=np.float64).reshape(-1, np.shape(alpha)[-1])  # [layer * head, key]
    candidates = np.flatnonzero(judged_keys(a.shape[-1], causal=causal, min_seen_share=min_seen_share))
    mean = a.mean(axis=0)
    order = candidates[np.argsort(-mean[candidates], kind="stable")][:top]
    best = candidates[np.argmax(a[:, candidates], axis=1)]
    return [SinkKey(position=int(k), token=str(tokens[k]), mean_score=float(mean[k]),
                    sink_heads=int((a[:, k] > threshold).sum()), top_heads=int((best == k).sum()))
            for k in order]


def sink_rate(alpha_k, eps: float = SINK_THRESHOLD) -> float:
    """Gu et al. 2025's Sink_k^eps: the share of (text, layer, head) triples whose alpha_k exceeds eps.
    alpha_k: [text, layer, head] (any shape: every entry is one triple)."""
    a = np.asarray(alpha_k, dtype=np.float64)
    return float((a > eps).mean()) if a.size else float("nan")


def sink_rate_by_layer(alpha_k, eps: float = SINK_THRESHOLD) -> np.ndarray:
    """Sink_k^eps of each layer: the share of (text, head) pairs with alpha_k > eps. alpha_k: [text, layer, head]
    -> [layer]."""
    a = np.asarray(alpha_k, dtype=np.float64)
    return (a > eps).mean(axis=(0, 2))


def sink_rate_by_kind(alpha_k, kinds, eps: float = SINK_THRESHOLD) -> dict[str, float]:
    """Sink_k^eps over the layers of each kind: kinds[layer] is "local" or "global" (ModelShape.layer_kind), and
    each kind's rate is the share of its (text, layer, head) triples with alpha_k > eps. alpha_k: [text, layer,
    head]."""
    a = np.asarray(alpha_k, dtype=np.float64)
    kinds = np.asarray(kinds)
    return {str(kind): sink_rate(a[:, kinds == kind], eps) for kind in dict.fromkeys(kinds.tolist())}


def sink_rate_curve(alpha_k, eps_values) -> np.ndarray:
    """Sink_k^eps for each eps in eps_values: how the metric depends on the threshold. -> [len(eps_values)]."""
    a = np.asarray(alpha_k, dtype=np.float64).reshape(-1)
    return np.array([(a > e).mean() for e in eps_values])


def text_windows(text: str, tokenizer, *, n_tokens: int = 64, n_windows: int = 16) -> list[str]:
    """n_windows pieces of `text`, each n_tokens tokens long in the model's own tokenizer, evenly spaced through it
    (Gu et al. measure on 64-token texts). A text shorter than n_tokens tokens gives itself, once. Windows are cut
    at the tokens' character offsets, so the model tokenizes each window back into the same tokens (plus the
    special tokens it adds itself)."""
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    spans = [(a, b) for a, b in enc["offset_mapping"] if b > a]
    if len(spans) <= n_tokens:
        return [text] if text.strip() else []
    starts = np.unique(np.linspace(0, len(spans) - n_tokens, max(1, n_windows)).astype(int))
    return [text[spans[s][0]:spans[s + n_tokens - 1][1]] for s in starts]


def alpha_over_texts(loaded, texts: Sequence[str], *, key: int = 0, progress=None,
                     dense_tokens: int | None = None) -> np.ndarray:
    """alpha_key of every head on each text: [text, layer, head], from attnviz.capture (capture_sink_scores,
    causal or bidirectional as the model is): a text of at most dense_tokens tokens (default capture.MAX_TOKENS) is
    captured densely, a longer one keeps q and k only and is read a block of rows at a time, up to the model's
    context. progress(done, total) is called after each text."""
    from attnviz import capture as cap

    limit = cap.MAX_TOKENS if dense_tokens is None else dense_tokens
    out = []
    for i, text in enumerate(texts):
        n = len(loaded.tokenizer(text)["input_ids"])
        store = "qk" if n > limit and cap.records_inputs(loaded.model) else "pattern"
        capture = cap.capture_attention(loaded, text, store=store)
        alpha = capture_sink_scores(capture)  # [layer, head, key]
        out.append(alpha[..., key] if alpha.shape[-1] > key else np.zeros(alpha.shape[:2]))
        if progress is not None:
            progress(i + 1, len(texts))
    return np.stack(out)
