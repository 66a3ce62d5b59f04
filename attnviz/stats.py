"""Per-head statistics of a captured attention pattern, one row per (layer, head), and the top heads of each role.

Notation: P = pattern[layer, head] is [query, key], row q sums to 1; n tokens; "mean over q" is the plain average
over the query rows named. Token 0 is the first token (BOS for the toy models, the first word for smollm2).

- entropy        mean over all q of H(P[q]) = -sum_k P[q,k] ln P[q,k], in nats. 0 = every query looks at one key;
                 ln(n) = uniform over n keys (a causal row q can reach at most ln(q+1)).
- sink_mass      mean over q >= 1 of P[q, 0]: the share of attention parked on the first token (query 0 is left
                 out: in a causal model it can only look at itself). Xiao et al. 2023, "attention sinks".
- mean_distance  mean over all q of sum_k P[q,k] |q - k|, in tokens: how far a head looks on average.
- prev_token     mean over q >= 1 of P[q, q-1]: a previous-token head scores near 1.
- self           mean over all q of P[q, q]: attention to the query's own token.
- learned_sink   (models with learned sink logits, gpt-oss, only) mean over all q of the weight the row gives the
                 head's sink logit, 1 - sum_k P[q, k]: the attention that goes to no token at all.
- induction      mean over the queries q that have an earlier copy of their own token (token_ids[j] == token_ids[q],
                 j + 1 < q) of sum over the distinct targets t = j + 1 of P[q, t]: attention to the token that came
                 after the earlier copy, the "[A][B] ... [A] -> [B]" pattern of Olsson et al. 2022, "In-context
                 learning and induction heads". NaN when no token repeats.

Each statistic is defined here densely (pattern_stats); attnviz.streamed computes the same from q and k a tile at
a time, and the tests hold the two equal.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from attnviz.during import DuringForward
from attnviz.errors import CaptureError
from attnviz.streamed import InductionMatch, streamed_stats
from attnviz.views import overview_in_pass

COLUMNS = ("entropy", "sink_mass", "mean_distance", "prev_token", "self", "induction")

# role -> (column, ascending?, what a high rank means)
ROLES: dict[str, tuple[str, bool, str]] = {
    "Sink": ("sink_mass", False, "most attention on the first token"),
    "Previous token": ("prev_token", False, "each token looks at the one before it"),
    "Induction": ("induction", False, "looks at what followed the earlier copy of the current token"),
    "Self": ("self", False, "each token looks at itself"),
    "Broad": ("entropy", False, "attention spread over many tokens"),
    "Long range": ("mean_distance", False, "looks furthest back (or ahead)"),
}


def head_stats(capture, *, block: int = 32, progress: Callable[[int, int], None] | None = None,
               pool: int | None = None, pooled_out: list | None = None,
               pooled_nosink_out: list | None = None) -> pd.DataFrame:
    """One row per captured (layer, head): layer, head, kv_head and the columns of COLUMNS (see module docstring).

    capture: an AttentionCapture in either store (or anything with pattern [layer, head, query, key], layers,
    token_ids and kv_head_of).
    Dense store: every head of a layer at once, `block` query rows at a time, in float64 (see pattern_stats):
    memory stays at a few [head, block, n] float64 slices whatever the text's length, small enough to stay in the
    CPU cache (32 rows x 9 heads x 1,126 keys is 2.6 MB; blocks of 256 rows spill out of it).
    qk store (pattern None): streamed_stats on each layer's inputs, never building the N x N pattern.
    progress: called as progress(layers_done, n_layers).
    pool, pooled_out (qk store): also append each layer's heads max-pooled to `pool` pixels ([head, m, m], as
    attnviz.views.pooled_heads) to the list pooled_out, from the same pass (the Heads page's grid costs no second
    pass over the scores); pooled_nosink_out likewise gets them with the first-token sink hidden.
    """
    if not capture.layers:
        raise CaptureError("This capture has no softmax attention layer, so no head statistics: a linear mixer's "
                           "map has its own (attnviz.mixers.stats.map_stats; the Heads page shows them).")
    pattern = getattr(capture, "pattern", None)
    targets = induction_targets(capture.token_ids) if pattern is not None else None
    n_layers, n = len(capture.layers), len(capture.token_ids)
    summary = getattr(capture, "summary", None) or {}
    # a model with learned sink logits (gpt-oss): each row's weights sum to 1 minus its sink's share
    sinks = getattr(capture, "learned_sink", None) if pattern is not None else None
    per_layer, match = [], None
    for li, layer in enumerate(capture.layers):
        if layer in summary and (not pool or "_pooled" in summary[layer]):  # computed during the forward pass
            result = summary[layer]
            per_layer.append({c: result[c] for c in (*COLUMNS, "learned_sink") if c in result})
        elif pattern is not None:
            result = {}
            per_layer.append(pattern_stats(pattern[li], targets, block=block))
            if sinks is not None:
                per_layer[-1]["learned_sink"] = np.asarray(sinks[li], dtype=np.float64).mean(-1)
        else:
            match = match or InductionMatch(capture.token_ids)  # one per text: every layer's tiles match alike
            result = streamed_stats(capture.inputs[layer], match, pool=pool)
            per_layer.append({c: result[c] for c in (*COLUMNS, "learned_sink") if c in result})
        if pool and "_pooled" in result:
            if pooled_out is not None:
                pooled_out.append(result["_pooled"])
            if pooled_nosink_out is not None:
                pooled_nosink_out.append(result["_pooled_nosink"])
        if progress is not None:
            progress(li + 1, n_layers)
    # a capture read from a file of some heads keeps the model's head numbers
    return stats_frame(per_layer, capture.layers, capture.kv_head_of, n, heads=getattr(capture, "head_numbers", None))


def streaming_attend(token_ids, *, pool: int | None = None, keep_inputs: bool = True,
                     overview: int | None | str = "auto"):
    """A capture.DuringForward for capture_attention(store="qk", during=...): each wanted layer's attention output
    and its streamed_stats (and pooled heads) from one pass over its scores, in its .summary[layer], which the
    capture keeps as capture.summary and head_stats reads instead of computing again. A family whose attention is
    rebuilt by hooks (BLOOM) makes no attend call: its statistics are computed when its inputs are recorded.

    overview: also pool every head to this many pixels (streamed_stats's "_overview"), so the Heads page's One head
    view of any head is a lookup, not a pass over its N² scores. "auto": attnviz.views.OVERVIEW when grid tiles are
    asked (pool: the Heads page's pass) and the text has at least views.OVERVIEW_IN_PASS_FROM tokens, where a
    fresh pass over one head takes about a second or more; else none."""
    if overview == "auto":
        overview = overview_in_pass(len(token_ids)) if pool else None
    from attnviz.kernels.triton_stats import kernel_runs

    summary: dict[int, dict] = {}
    match = InductionMatch(token_ids)  # one per text: every layer's tiles match alike

    def attend(layer, inputs, values):
        result = streamed_stats(inputs, match, pool=pool, values=values, overview=overview)
        summary[layer] = result
        return result.pop("_output")

    def on_layer(layer, inputs):
        if layer not in summary:
            summary[layer] = streamed_stats(inputs, match, pool=pool, overview=overview)

    # the statistics kernel reads q, k and v on the GPU where the model made them: no copy to the CPU and back
    return DuringForward(attend=attend, on_layer=on_layer, keep_inputs=keep_inputs, summary=summary,
                         device_inputs=kernel_runs())


def stats_frame(per_layer: list[dict[str, np.ndarray]], layers, kv_head_of, n_tokens: int,
                heads=None) -> pd.DataFrame:
    """The head_stats table from one pattern_stats / streamed_stats result per layer. heads: the model's number of
    each head (default 0 .. n_heads - 1)."""
    n_layers, n_heads = len(per_layer), len(kv_head_of)
    extra = ["learned_sink"] if all("learned_sink" in s for s in per_layer) and per_layer else []
    frame = pd.DataFrame({
        "layer": np.repeat(np.asarray(layers, dtype=np.int64), n_heads),
        "head": np.tile(np.asarray(range(n_heads) if heads is None else heads, dtype=np.int64), n_layers),
        "kv_head": np.tile(np.asarray(kv_head_of, dtype=np.int64), n_layers),
        **{c: np.concatenate([s[c] for s in per_layer]).astype(np.float64) for c in (*COLUMNS, *extra)},
    }, columns=["layer", "head", "kv_head", *COLUMNS, *extra])
    frame.attrs["n_tokens"] = n_tokens
    return frame


def previous_token_score(pattern) -> np.ndarray:
    """prev_token: mean over queries q >= 1 of A[q, q - 1]. pattern [..., query, key] -> [...] float64 (NaN for
    one token). The one definition: pattern_stats, the toy lab's head scores and the induction test (on the second
    copy's rows, attnviz.diagnostics) use it; the streamed statistics accumulate the same sum."""
    a = np.asarray(pattern)
    if a.shape[-2] < 2:
        return np.full(a.shape[:-2], np.nan)
    i = np.arange(1, a.shape[-2])
    return np.asarray(a[..., i, i - 1], dtype=np.float64).mean(axis=-1)


def sink_mass(pattern) -> np.ndarray:
    """sink_mass: mean over queries q >= 1 of A[q, 0], the attention parked on the first token (query 0 is left
    out: in a causal model it can only look at itself). [..., query, key] -> [...] float64 (NaN for one token)."""
    a = np.asarray(pattern)
    if a.shape[-2] < 2:
        return np.full(a.shape[:-2], np.nan)
    return np.asarray(a[..., 1:, 0], dtype=np.float64).mean(axis=-1)


def pattern_stats(p: np.ndarray, targets: list[list[int]] | None = None, *, block: int = 32) -> dict[str, np.ndarray]:
    """The statistics of heads p [head, query, key] (any float dtype: computed in float64), each an array [head].

    targets[q] lists the induction targets of query q (see induction_targets); None or all empty gives NaN.
    Entropy and distance go over `block` query rows at a time. Keys after the block's last query are read only
    when some weight there is not 0 (a causal pattern has none): the mask check is one float32 pass, while
    -p ln p in float64 is the cost of the whole function. mean_distance is one matrix-vector product per block,
    sum_(q,k) P[q,k] |q - k| with the |q - k| of the block flattened.
    """
    n_heads, n = p.shape[0], p.shape[-1]
    q_idx = np.arange(n)
    entropy_sum = np.zeros(n_heads)
    distance_sum = np.zeros(n_heads)
    for a in range(0, n, block):
        b = min(n, a + block)
        keys = n if np.any(p[:, a:b, b:]) else b  # a causal block ends at its last query
        x = np.asarray(p[:, a:b, :keys], dtype=np.float64)
        distance = np.abs(q_idx[a:b, None] - q_idx[None, :keys]).astype(np.float64)  # [block, keys]
        distance_sum += x.reshape(n_heads, -1) @ distance.ravel()
        logs = np.log(x, out=np.zeros_like(x), where=x > 0)
        entropy_sum -= np.einsum("hqk,hqk->h", x, logs)
    diagonal = np.asarray(p[:, q_idx, q_idx], dtype=np.float64)  # [head, query]
    out = {
        "entropy": entropy_sum / n,
        "sink_mass": sink_mass(p),
        "mean_distance": distance_sum / n,
        "prev_token": previous_token_score(p),
        "self": diagonal.mean(-1),
    }
    out["induction"] = induction_score(p, targets or [])
    return out



def induction_targets(token_ids) -> list[list[int]]:
    """For each query q, its induction targets in any text: the distinct positions j + 1 < q with
    token_ids[j] == token_ids[q], j < q (the token after each earlier copy of q's own token)."""
    seen: dict[int, list[int]] = {}
    targets = []
    for q, tok in enumerate(token_ids):
        earlier = seen.setdefault(int(tok), [])
        targets.append(sorted({j + 1 for j in earlier if j + 1 < q}))
        earlier.append(q)
    return targets


def induction_score(pattern, targets) -> np.ndarray:
    """induction: the mean, over the queries q that have targets, of sum_{t in targets[q]} A[q, t], the attention
    on the token after each earlier copy of q's own token (Olsson et al. 2022). The one definition: targets[q] lists
    query q's targets, from repeated tokens in any text (induction_targets: pattern_stats and the streamed pass) or
    from a repeat whose layout is known (attnviz.diagnostics.repeat_targets: the induction test and the toy lab).
    pattern [..., query, key] -> [...] float64, NaN when no query has a target."""
    a = np.asarray(pattern)
    pairs = [(q, t) for q, keys in enumerate(targets) for t in keys]
    if not pairs:
        return np.full(a.shape[:-2], np.nan)
    rows, cols = np.asarray(pairs).T
    queries, which = np.unique(rows, return_inverse=True)
    mass = np.asarray(a[..., rows, cols], dtype=np.float64)  # [..., pair]
    per_query = np.zeros(mass.shape[:-1] + (len(queries),))
    np.add.at(np.moveaxis(per_query, -1, 0), which, np.moveaxis(mass, -1, 0))  # sum over each query's targets
    return per_query.mean(-1)


def by_layer_kind(stats: pd.DataFrame, shape) -> pd.DataFrame:
    """Each statistic's mean over the heads of each layer kind (shape.layer_facts: local = sliding window or chunk,
    global = the rest), one row per kind with its layer and head counts; one row when every layer is alike."""
    kind = stats["layer"].map(shape.layer_kind).rename("kind")
    columns = [c for c in (*COLUMNS, "learned_sink") if c in stats.columns]
    means = stats[columns].groupby(kind, sort=False).mean()
    counts = stats.groupby(kind, sort=False).agg(layers=("layer", "nunique"), heads=("head", "size"))
    return counts.join(means).reset_index()


def top_heads(stats: pd.DataFrame, role: str, k: int = 5) -> pd.DataFrame:
    """The k heads ranked best for a role of ROLES (NaN scores never rank)."""
    column, ascending, _ = ROLES[role]
    ranked = stats.dropna(subset=[column]).sort_values(column, ascending=ascending, kind="stable")
    return ranked.head(k)[["layer", "head", column]].reset_index(drop=True)
