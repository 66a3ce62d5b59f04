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
- induction      mean over the queries q that have an earlier copy of their own token (token_ids[j] == token_ids[q],
                 j + 1 < q) of sum over the distinct targets t = j + 1 of P[q, t]: attention to the token that came
                 after the earlier copy, the "[A][B] ... [A] -> [B]" pattern of Olsson et al. 2022, "In-context
                 learning and induction heads". NaN when no token repeats.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

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
               pool: int | None = None, pooled_out: list | None = None) -> pd.DataFrame:
    """One row per captured (layer, head): layer, head, kv_head and the columns of COLUMNS (see module docstring).

    capture: an AttentionCapture in either store (or anything with pattern [layer, head, query, key], layers,
    token_ids and kv_head_of).
    Dense store: every head of a layer at once, `block` query rows at a time, in float64 (see pattern_stats):
    memory stays at a few [head, block, n] float64 slices whatever the text's length, small enough to stay in the
    CPU cache (32 rows x 9 heads x 1,126 keys is 2.6 MB; at 256 rows the same statistics took 6x as long).
    qk store (pattern None): streamed_stats on each layer's inputs, never building the N x N pattern.
    progress: called as progress(layers_done, n_layers).
    pool, pooled_out (qk store): also append each layer's heads max-pooled to `pool` pixels ([head, m, m], as
    attnviz.views.pooled_heads) to the list pooled_out, from the same pass (the Heads page's grid costs no second
    pass over the scores).
    """
    pattern = getattr(capture, "pattern", None)
    targets = induction_targets(capture.token_ids)
    n_layers, n_heads, n = len(capture.layers), len(capture.kv_head_of), len(capture.token_ids)
    per_layer = []
    for li, layer in enumerate(capture.layers):
        if pattern is not None:
            per_layer.append(pattern_stats(pattern[li], targets, block=block))
        else:
            per_layer.append(streamed_stats(capture.inputs[layer], targets, pool=pool))
            if pooled_out is not None and pool:
                pooled_out.append(per_layer[-1].pop("_pooled"))
        if progress is not None:
            progress(li + 1, n_layers)
    return stats_frame(per_layer, capture.layers, capture.kv_head_of, n)


def stats_frame(per_layer: list[dict[str, np.ndarray]], layers, kv_head_of, n_tokens: int) -> pd.DataFrame:
    """The head_stats table from one pattern_stats / streamed_stats result per layer."""
    n_layers, n_heads = len(per_layer), len(kv_head_of)
    frame = pd.DataFrame({
        "layer": np.repeat(np.asarray(layers, dtype=np.int64), n_heads),
        "head": np.tile(np.arange(n_heads, dtype=np.int64), n_layers),
        "kv_head": np.tile(np.asarray(kv_head_of, dtype=np.int64), n_layers),
        **{c: np.concatenate([s[c] for s in per_layer]).astype(np.float64) for c in COLUMNS},
    }, columns=["layer", "head", "kv_head", *COLUMNS])
    frame.attrs["n_tokens"] = n_tokens
    return frame


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
        "sink_mass": np.asarray(p[:, 1:, 0], dtype=np.float64).mean(-1) if n > 1 else np.full(n_heads, np.nan),
        "mean_distance": distance_sum / n,
        "prev_token": (np.asarray(p[:, q_idx[1:], q_idx[:-1]], dtype=np.float64).mean(-1) if n > 1
                       else np.full(n_heads, np.nan)),
        "self": diagonal.mean(-1),
    }
    pairs = [(q, t) for q in range(n) for t in (targets[q] if targets else [])]
    if pairs:
        rows, cols = np.asarray(pairs).T
        mass = np.asarray(p[:, rows, cols], dtype=np.float64)  # [head, pair]
        per_query = np.zeros((n_heads, n))
        np.add.at(per_query.T, rows, mass.T)  # sum over each query's targets
        queries = np.unique(rows)
        out["induction"] = per_query[:, queries].mean(-1)
    else:
        out["induction"] = np.full(n_heads, np.nan)
    return out


def streamed_stats(inputs, targets: list[list[int]] | None = None, *, block: int = 64,
                   pool: int | None = None) -> dict[str, np.ndarray]:
    """pattern_stats of one layer computed from what attention saw (attnviz.attention.LayerInputs), `block` query
    rows at a time: the weights of a block are made from its scores and dropped, so memory is O(heads x block x n)
    and no [n, n] array exists. Keys after the last one a block may see (causal) are never computed.

    Each row's softmax uses the row max m and the sum l = sum_k exp(s_k - m) (+ exp(sink - m) with a learned
    sink), the quantities the kernel page's online softmax carries as m_i and l_i; with them the entropy needs no
    logarithm per weight: H = -sum_k p_k ln p_k = (m + ln l) sum_k p_k - sum_k p_k s_k (Milakov and Gimelshein
    2018's online normaliser; p_k = exp(s_k - m) / l), and a causal row's mean distance is q sum_k p_k - sum_k p_k k,
    one matrix-vector product. Sums over a row run in float32 on the block, totals over rows in float64.
    pool: also return "_pooled", every head max-pooled to `pool` pixels (attnviz.views.pooled_heads's result).
    """
    from attnviz import attention as core
    from attnviz.pooling import pool_edges

    n, n_heads = inputs.n_query, inputs.n_heads
    sums = {c: np.zeros(n_heads) for c in ("entropy", "mean_distance", "sink_mass", "prev_token", "self")}
    per_query = np.zeros((n_heads, n))
    with_targets = np.zeros(n, dtype=bool)
    sink = inputs.sink
    causal_rule = inputs.mask.kind == "causal" and inputs.n_key == n
    positions = torch.arange(inputs.n_key, dtype=torch.float32)
    if pool:
        row_edges, key_edges = pool_edges(n, pool), pool_edges(inputs.n_key, pool)
        pooled = np.full((n_heads, len(row_edges) - 1, len(key_edges) - 1), np.nan, dtype=np.float32)
    for a in range(0, n, block):
        b = min(n, a + block)
        key_end = max(inputs.mask.key_end(a, b), min(b, inputs.n_key))  # the diagonal is always read (prev, self)
        s = core.layer_scores(inputs, a, b, key_end=key_end)  # [head, rows, keys], -inf where masked
        m = s.amax(-1, keepdim=True)
        if sink is not None:
            m = torch.maximum(m, sink[:, None, None])
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        s -= m  # s - m <= 0, in place: no second [head, rows, keys] buffer
        tail = max(0, a + 1 if causal_rule else 0)  # a causal block has -inf only right of its first query
        if not causal_rule or tail < key_end:
            s[..., tail:].clamp_(min=-1e30)  # masked stays masked (exp gives 0) and e * (s - m) stays 0, not NaN
        e = torch.exp(s)  # exp(s - m), the unnormalised weights
        total = e.sum(-1)  # l: sum_k exp(s_k - m)
        if sink is not None:
            total = total + torch.exp(sink[:, None] - m[..., 0])
        total = torch.where(total > 0, total, torch.ones_like(total))
        mass = e.sum(-1) / total  # sum_k p_k: 1, or 1 - the sink's share
        # sum_k p_k (s_k - m) as one batched dot product per row (no [head, rows, keys] temporary)
        es = torch.matmul(e.unsqueeze(-2), s.unsqueeze(-1))[..., 0, 0] / total
        entropy = torch.log(total) * mass - es  # H = -sum p ln p = ln(l) sum p - sum p (s - m)
        sums["entropy"] += entropy.double().sum(-1).numpy()
        rows_pos = positions[a:b]
        if causal_rule:  # every key seen is at or before the query: sum_k p_k |q - k| = q sum p - sum_k p_k k
            weighted = torch.matmul(e, positions[:key_end]) / total
            distance = rows_pos * mass - weighted
        else:
            distance = (e * (rows_pos[:, None] - positions[None, :key_end]).abs_()).sum(-1) / total
        sums["mean_distance"] += distance.double().sum(-1).numpy()
        rows = torch.arange(b - a)
        p_at = lambda r, k: (e[:, r, k] / total[:, r]).double()  # noqa: E731  (a few weights, normalised)
        sums["self"] += p_at(rows, torch.arange(a, b)).sum(-1).numpy()
        first = 1 if a == 0 else 0  # query 0 has no previous token and is left out of the sink mass
        if b - a > first:
            sums["sink_mass"] += p_at(rows[first:], torch.zeros(b - a - first, dtype=torch.long)).sum(-1).numpy()
            sums["prev_token"] += p_at(rows[first:], torch.arange(a + first, b) - 1).sum(-1).numpy()
        if pool:
            starts = key_edges[:-1][key_edges[:-1] < key_end]
            cols = np.maximum.reduceat(e.numpy(), starts, axis=-1) / total.numpy()[..., None]  # [head, rows, bins]
            first_bin = int(np.searchsorted(row_edges, a, side="right")) - 1
            for i in range(first_bin, len(row_edges) - 1):
                lo, hi = max(a, int(row_edges[i])), min(b, int(row_edges[i + 1]))
                if lo >= hi:
                    break
                pooled[:, i, :len(starts)] = np.fmax(pooled[:, i, :len(starts)], cols[:, lo - a:hi - a].max(1))
                pooled[:, i, len(starts):] = np.fmax(pooled[:, i, len(starts):], 0.0)
        pairs = [(q - a, t) for q in range(a, b) for t in (targets[q] if targets else ())]
        if pairs:  # every (query, induction target) weight of the block in one gather
            r, t = torch.tensor(pairs).T
            mass = (e[:, r, t] / total[:, r]).double().numpy()  # [head, pair]
            np.add.at(per_query.T, r.numpy() + a, mass.T)
            with_targets[r.numpy() + a] = True
    out = {
        "entropy": sums["entropy"] / n,
        "sink_mass": sums["sink_mass"] / (n - 1) if n > 1 else np.full(n_heads, np.nan),
        "mean_distance": sums["mean_distance"] / n,
        "prev_token": sums["prev_token"] / (n - 1) if n > 1 else np.full(n_heads, np.nan),
        "self": sums["self"] / n,
        "induction": per_query[:, with_targets].mean(-1) if with_targets.any() else np.full(n_heads, np.nan),
    }
    if pool:
        out["_pooled"] = pooled
    return out


def induction_targets(token_ids) -> list[list[int]]:
    """For each query q, the distinct positions j + 1 < q with token_ids[j] == token_ids[q], j < q."""
    seen: dict[int, list[int]] = {}
    targets = []
    for q, tok in enumerate(token_ids):
        earlier = seen.setdefault(int(tok), [])
        targets.append(sorted({j + 1 for j in earlier if j + 1 < q}))
        earlier.append(q)
    return targets


def top_heads(stats: pd.DataFrame, role: str, k: int = 5) -> pd.DataFrame:
    """The k heads ranked best for a role of ROLES (NaN scores never rank)."""
    column, ascending, _ = ROLES[role]
    ranked = stats.dropna(subset=[column]).sort_values(column, ascending=ascending, kind="stable")
    return ranked.head(k)[["layer", "head", column]].reset_index(drop=True)
