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

Over 300 lines on purpose: each statistic's dense definition and its streamed pass sit side by side, so that
the two are written in one place and tested equal.
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
               pool: int | None = None, pooled_out: list | None = None,
               pooled_nosink_out: list | None = None) -> pd.DataFrame:
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
    pass over the scores); pooled_nosink_out likewise gets them with the first-token sink hidden.
    """
    pattern = getattr(capture, "pattern", None)
    targets = induction_targets(capture.token_ids) if pattern is not None else None
    n_layers, n = len(capture.layers), len(capture.token_ids)
    summary = getattr(capture, "summary", None) or {}
    # a model with learned sink logits (gpt-oss): each row's weights sum to 1 minus its sink's share
    sinks = getattr(capture, "learned_sink", None) if pattern is not None else None
    per_layer = []
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
            result = streamed_stats(capture.inputs[layer], capture.token_ids, pool=pool)
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


def streaming_attend(token_ids, *, pool: int | None = None, keep_inputs: bool = True):
    """A capture.DuringForward for capture_attention(store="qk", during=...): each wanted layer's attention output
    and its streamed_stats (and pooled heads) from one pass over its scores, in its .summary[layer], which the
    capture keeps as capture.summary and head_stats reads instead of computing again. A family whose attention is
    rebuilt by hooks (BLOOM) makes no attend call: its statistics are computed when its inputs are recorded."""
    from attnviz.capture import DuringForward

    summary: dict[int, dict] = {}

    def attend(layer, inputs, values):
        result = streamed_stats(inputs, token_ids, pool=pool, values=values)
        summary[layer] = result
        return result.pop("_output")

    def on_layer(layer, inputs):
        if layer not in summary:
            summary[layer] = streamed_stats(inputs, token_ids, pool=pool)

    return DuringForward(attend=attend, on_layer=on_layer, keep_inputs=keep_inputs, summary=summary)


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


def streamed_stats(inputs, token_ids=None, *, block: int | None = None, key_block: int = 2048,
                   pool: int | None = None, values: torch.Tensor | None = None) -> dict[str, np.ndarray]:
    """pattern_stats of one layer computed from what attention saw (attnviz.attention.LayerInputs) the way the
    kernel page's FlashAttention kernel computes attention: tiles of `block` query rows (default 128, up to 512 under
    a sliding window or chunk, whose rows read few keys) x `key_block` keys, with a
    running row max m_i and running sum l_i, so no [n, n] array exists and each tile stays in the CPU's cache. Key
    tiles wholly right of a causal block, or left of a sliding window's or a chunk's reach, are never computed.

    The online softmax (Milakov and Gimelshein 2018; Dao 2023, the kernel page): after a tile with row max m_t,
    m_new = max(m_i, m_t), alpha = exp(m_i - m_new), l_i <- alpha l_i + sum_tile exp(s - m_new). Every other sum
    over keys is carried the same way and divided by the final l at the end, so no weight is normalised tile by
    tile:
    - entropy: with A = sum_k exp(s_k - m)(s_k - m), H = -sum_k p_k ln p_k = ln(l) sum_k p_k - A / l, and A is
      rescaled as A <- alpha (A + (m_i - m_new) l_i) + sum_tile exp(s - m_new)(s - m_new): no logarithm per weight;
    - mean distance: sum_k p_k |q - k|, as q sum_k p_k - (sum_k exp(s_k - m) k) / l for a causal row;
    - the weight of single keys (token 0, the diagonal, the previous token): their raw scores s are kept, and
      p = exp(s - m) / l at the end; a learned sink logit joins m and l at the end;
    - induction (token_ids given; NaN without): query q's weight on the keys k < q whose previous token equals
      its own, ids[k - 1] == ids[q] (induction_targets' definition), carried like l with that match as a mask on
      each tile: O(tile) work and no list of (query, target) pairs, which a repetitive text makes O(n²) long.
    Sums over a tile run in float32, totals over rows in float64.
    pool: also return "_pooled", every head max-pooled to `pool` pixels (attnviz.views.pooled_heads's result), from
    each pooling block's largest raw score (exp is monotone: the largest weight is exp(max s - m) / l), and
    "_pooled_nosink", the same with the first-token sink hidden (pooled_heads(hide_sink=True): column 0 out, rows
    rescaled by the weight they keep, rows keeping under MIN_REMAINING blank).
    values: the layer's value vectors [kv_head, n_key, d_v]; also return "_output" [head, n, d_v] float32, the
    attention output sum_k p_k v_k, accumulated as acc <- alpha acc + exp(s - m_new) v: the layer's forward pass.
    """
    from attnviz import attention as core
    from attnviz.pooling import MIN_REMAINING, pool_edges

    n, n_keys, n_heads = inputs.n_query, inputs.n_key, inputs.n_heads
    if block is None:  # a window's rows read one tile of about block + window keys: larger blocks, fewer tiles
        reach = inputs.mask.window or inputs.mask.chunk
        block = min(max(128, reach or 0), 512, key_block // 2) if reach else 128
    sums = {c: np.zeros(n_heads) for c in ("entropy", "mean_distance", "sink_mass", "prev_token", "self")}
    per_query = np.zeros((n_heads, n))
    if token_ids is not None:
        ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64))
        before = torch.cat([torch.tensor([-1]), ids[:-1]])  # the token before each key; none before key 0
        first_seen = {}
        for q, tok in enumerate(ids.tolist()):
            first_seen.setdefault(tok, q)
        # query q has an induction target when its token occurred at some j with j + 1 < q
        with_targets = np.array([first_seen[tok] + 1 < q for q, tok in enumerate(ids.tolist())], dtype=bool)
    else:
        with_targets = np.zeros(n, dtype=bool)
    sink = inputs.sink
    sink_share = np.zeros(n_heads)
    causal_rule = inputs.mask.kind == "causal" and n_keys == n
    positions = torch.arange(n_keys, dtype=torch.float32)
    neg_inf = float("-inf")
    if values is not None:
        n_kv = values.shape[0]
        group = n_heads // n_kv
        grouped = list(inputs.kv_head_of) == [h // group for h in range(n_heads)]
        v = values.float() if grouped else values.float()[list(inputs.kv_head_of)]
        output = torch.empty(n_heads, n, values.shape[-1])
    if pool:
        row_edges, key_edges = pool_edges(n, pool), pool_edges(n_keys, pool)
        n_bins = len(key_edges) - 1
        pooled = np.full((n_heads, len(row_edges) - 1, n_bins), np.nan, dtype=np.float32)
        pooled_off = pooled.copy()
    for a in range(0, n, block):
        b = min(n, a + block)
        r = b - a
        rows = torch.arange(r)
        qpos = torch.arange(a, b)
        key_end = max(inputs.mask.key_end(a, b), min(b, n_keys))  # the diagonal is always read (prev, self)
        m = torch.full((n_heads, r), neg_inf)
        l = torch.zeros(n_heads, r)
        big_a = torch.zeros(n_heads, r)  # A: sum exp(s - m)(s - m)
        dist = torch.zeros(n_heads, r)  # sum exp(s - m) k (causal) or sum exp(s - m) |q - k|
        acc = torch.zeros(n_heads, r, values.shape[-1]) if values is not None else None
        raw0, raw_self, raw_prev = (torch.full((n_heads, r), neg_inf) for _ in range(3))
        induction = torch.zeros(n_heads, r)  # sum exp(s - m) over the keys after an earlier copy of the query
        find = token_ids is not None and n_keys == n and bool(with_targets[a:b].any())
        bins_max = torch.full((n_heads, r, n_bins), neg_inf) if pool else None
        bin0_off_sink = torch.full((n_heads, r), neg_inf)  # largest raw score of the first key block, key 0 left out
        # key tiles left of every key the block's rows may see (a sliding window's, a chunk's) are never computed
        for k0 in range(min(inputs.mask.key_start(a, b), key_end), key_end, key_block):
            k1 = min(key_end, k0 + key_block)
            s = core.layer_scores(inputs, a, b, key_start=k0, key_end=k1)  # [head, rows, k1 - k0], -inf masked
            # raw scores of the single keys the statistics read, before s is shifted in place
            if k0 == 0:
                raw0 = s[..., 0].clone()
            on_diag = (qpos >= k0) & (qpos < k1)
            raw_self[:, on_diag] = s[:, rows[on_diag], qpos[on_diag] - k0]
            prev = (qpos - 1 >= k0) & (qpos - 1 < k1)
            raw_prev[:, prev] = s[:, rows[prev], qpos[prev] - 1 - k0]
            if pool:
                first = int(np.searchsorted(key_edges, k0, side="right")) - 1
                last = int(np.searchsorted(key_edges, k1 - 1, side="right")) - 1
                starts = np.maximum(key_edges[first:last + 1], k0) - k0
                tile_max = torch.from_numpy(np.maximum.reduceat(s.numpy(), starts, axis=-1))
                bins_max[..., first:last + 1] = torch.maximum(bins_max[..., first:last + 1], tile_max)
                if first == 0:  # the first key block, without key 0 itself
                    lo, hi = (1 if k0 == 0 else 0), min(int(key_edges[1]), k1) - k0
                    if hi > lo:
                        bin0_off_sink = torch.maximum(bin0_off_sink, s[..., lo:hi].amax(-1))
            m_new = torch.maximum(m, s.amax(-1))
            m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            alpha = torch.exp(m - m_safe)  # 0 while nothing was seen (m = -inf)
            s -= m_safe[..., None]
            s.clamp_(min=-1e30)  # masked: exp gives 0, and 0 * s stays 0 (no -inf * 0)
            e = torch.exp(s)
            shift = torch.where(l > 0, (m - m_safe) * l, torch.zeros_like(l))  # (m_i - m_new) l_i, 0 if l_i = 0
            big_a = alpha * (big_a + shift) + (e * s).sum(-1)
            l = alpha * l + e.sum(-1)
            if find:
                match = (before[None, k0:k1] == ids[a:b, None]) & (positions[None, k0:k1] < qpos[:, None])
                induction = alpha * induction + (e * match).sum(-1) if match.any() else alpha * induction
            if causal_rule:
                dist = alpha * dist + torch.matmul(e, positions[k0:k1])
            else:
                dist = alpha * dist + (e * (qpos[:, None].float() - positions[None, k0:k1]).abs_()).sum(-1)
            if acc is not None:
                if grouped:
                    tile = torch.matmul(e.reshape(n_kv, group * r, k1 - k0), v[:, k0:k1]).reshape(n_heads, r, -1)
                else:
                    tile = torch.matmul(e, v[:, k0:k1])
                acc = alpha[..., None] * acc + tile
            m = m_new
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        l_keys = l
        if sink is not None:  # the sink logit joins the normalisation, with no value and no key
            m_f = torch.maximum(m_safe, sink[:, None])
            alpha = torch.exp(m - m_f)
            big_a = alpha * (big_a + torch.where(l > 0, (m - m_f) * l, torch.zeros_like(l)))
            l_keys = alpha * l
            l = l_keys + torch.exp(sink[:, None] - m_f)
            dist = alpha * dist
            induction = alpha * induction
            if acc is not None:
                acc = alpha[..., None] * acc
            m_safe = m_f
        total = torch.where(l > 0, l, torch.ones_like(l))
        mass = l_keys / total  # sum_k p_k: 1, or 1 - the sink's share
        sink_share += (1.0 - mass).double().sum(-1).numpy() if sink is not None else 0.0
        entropy = torch.log(total) * mass - big_a / total
        sums["entropy"] += entropy.double().sum(-1).numpy()
        distance = qpos.float() * mass - dist / total if causal_rule else dist / total
        sums["mean_distance"] += distance.double().sum(-1).numpy()

        p0 = torch.exp(raw0 - m_safe) / total
        p_self = torch.exp(raw_self - m_safe) / total
        p_prev = torch.exp(raw_prev - m_safe) / total
        sums["self"] += p_self.double().sum(-1).numpy()
        first_row = 1 if a == 0 else 0  # query 0 has no previous token and is left out of the sink mass
        sums["sink_mass"] += p0[:, first_row:].double().sum(-1).numpy()
        sums["prev_token"] += p_prev[:, first_row:].double().sum(-1).numpy()
        if find:
            per_query[:, a:b] = (induction / total).double().numpy()
        if acc is not None:
            output[:, a:b] = acc / total[..., None]
        if pool:  # the largest weight of each (row, key block), then the largest over each pooling row block
            row_max = (torch.exp(bins_max - m_safe[..., None]) / total[..., None]).numpy()
            # hiding the sink: key 0 out of the first block, each row divided by the weight it keeps off key 0
            kept = (mass - p0).numpy()
            off = row_max.copy()
            off[..., 0] = (torch.exp(bin0_off_sink - m_safe) / total).numpy()
            with np.errstate(invalid="ignore", divide="ignore"):
                off /= kept[..., None]
            off[kept < MIN_REMAINING] = np.nan
            first_bin = int(np.searchsorted(row_edges, a, side="right")) - 1
            for i in range(first_bin, len(row_edges) - 1):
                lo, hi = max(a, int(row_edges[i])), min(b, int(row_edges[i + 1]))
                if lo >= hi:
                    break
                pooled[:, i] = np.fmax(pooled[:, i], row_max[:, lo - a:hi - a].max(1))
                with np.errstate(invalid="ignore"):
                    pooled_off[:, i] = np.fmax(pooled_off[:, i], np.fmax.reduce(off[:, lo - a:hi - a], axis=1))
    out = {
        "entropy": sums["entropy"] / n,
        "sink_mass": sums["sink_mass"] / (n - 1) if n > 1 else np.full(n_heads, np.nan),
        "mean_distance": sums["mean_distance"] / n,
        "prev_token": sums["prev_token"] / (n - 1) if n > 1 else np.full(n_heads, np.nan),
        "self": sums["self"] / n,
        "induction": per_query[:, with_targets].mean(-1) if with_targets.any() else np.full(n_heads, np.nan),
    }
    if sink is not None:
        out["learned_sink"] = sink_share / n
    if pool:
        out["_pooled"] = pooled
        out["_pooled_nosink"] = pooled_off
    if values is not None:
        out["_output"] = output
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
