"""Attention against query-key distance, measured in real heads, and what position alone would predict.

attention_by_distance / attention_by_signed_distance read a dense pattern; capture_by_distance reads any
AttentionCapture a block of query rows at a time (the long-text store never holds the N x N weights), so a model is
measured at its full context. measured_profile puts together what the Positional page shows for one capture: the
profile per layer, the position-free baseline, the theory curve that fits the model's positional scheme (ALiBi's
closed form, RoPE's RoFormer bound) and how local each layer is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnviz.shape import LayerFacts

def _layered(pattern, exclude_keys):
    """(p [layer, head, query, key], whether a layer axis was added, n_query, n_key, key offset of the queries,
    exclude_keys checked) for the distance averages. No float64 copy: a real model's pattern can be hundreds of MB."""
    p = np.asarray(pattern)
    squeeze = p.ndim == 3
    if squeeze:
        p = p[None]
    if p.ndim != 4:
        raise ValueError(f"pattern must be [layer, head, query, key], got shape {p.shape}")
    n_query, n_key = p.shape[-2], p.shape[-1]
    exclude_keys = int(exclude_keys)
    if not 0 <= exclude_keys < n_key:
        raise ValueError(f"exclude_keys must be in [0, {n_key}), got {exclude_keys}")
    return p, squeeze, n_query, n_key, n_key - n_query, exclude_keys


def attention_by_distance(pattern, *, per_head: bool = False, max_distance: int | None = None,
                          exclude_keys: int = 0) -> np.ndarray:
    """Mean attention weight at each query-key distance r = i - j >= 0.

    pattern: [layer, head, query, key] (or [head, query, key]; the queries aligned to the last keys). Entry r is the
    mean of pattern[..., i, i - r] over every query i that has a key r positions back, then over heads unless
    per_head. exclude_keys leaves the first keys out of the averages (not renormalised: the weights stay fractions
    of the whole row), e.g. 1 to set aside an attention sink on the first token.
    Returns [layer, n_distances] (or [layer, head, n_distances]; without a layer axis, that axis is dropped),
    n_distances = min(n_key - exclude_keys, max_distance + 1) capped at n_query.
    """
    p, squeeze, n_query, n_key, offset, exclude_keys = _layered(pattern, exclude_keys)
    n_dist = min(n_query, n_key - exclude_keys)
    n_dist = n_dist if max_distance is None else min(n_dist, int(max_distance) + 1)
    out = np.empty(p.shape[:2] + (n_dist,), dtype=np.float64)
    for r in range(n_dist):
        # query i looks r back at key i + offset - r, which must be >= exclude_keys and >= 0
        first = max(r - offset + exclude_keys, r, 0)
        diag = np.diagonal(p, offset=offset - r, axis1=-2, axis2=-1)  # queries from max(r - offset, 0) on
        out[..., r] = diag[..., first - max(r - offset, 0):].mean(axis=-1, dtype=np.float64)
    out = out if per_head else out.mean(axis=1)
    return out[0] if squeeze else out


def attention_by_signed_distance(pattern, *, per_head: bool = False,
                                 exclude_keys: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mean attention weight at each signed query-key distance r = i - j, keys before the query (r > 0) and after
    it (r < 0): what a bidirectional model (an encoder such as BERT) is measured on. attention_by_distance is the
    r >= 0 half.

    pattern: [layer, head, query, key] (or [head, query, key]; the queries aligned to the last keys). Entry r is the
    mean of pattern[..., i, i - r] over every query i that has a key at i - r (not among the first exclude_keys
    keys), then over heads unless per_head. Returns (distances [n_r], from -(n_query - 1) to n_key - 1, and the
    means [layer, n_r] (or [layer, head, n_r]; without a layer axis, that axis is dropped)); NaN where no pair is
    left.
    """
    p, squeeze, n_query, n_key, offset, exclude_keys = _layered(pattern, exclude_keys)
    distances = np.arange(-(n_query - 1), n_key)
    out = np.full(p.shape[:2] + (len(distances),), np.nan)
    for index, r in enumerate(distances):
        k = offset - int(r)  # the diagonal holding (i, i + offset - r); it starts at key max(k, 0)
        diag = np.diagonal(p, offset=k, axis1=-2, axis2=-1)
        first = max(exclude_keys - max(k, 0), 0)
        if diag.shape[-1] > first:
            out[..., index] = diag[..., first:].mean(axis=-1, dtype=np.float64)
    out = out if per_head else out.mean(axis=1)
    return distances, out[0] if squeeze else out



def uniform_causal_pattern(n: int) -> np.ndarray:
    """[n, n] causal attention with no preference at all: query i gives 1/(i+1) to each of its keys."""
    return np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]


def uniform_causal_by_distance(n: int, *, exclude_keys: int = 0, window: int | None = None) -> np.ndarray:
    """The content-free, position-free baseline: query i spreads 1/(i+1) over its i+1 keys (1/min(i+1, w) over the
    last w keys under a sliding window w). By distance r, the mean over queries i >= r + exclude_keys of that weight
    (zero from r = w on), i.e. attention_by_distance of the uniform pattern without the n x n pattern.
    Returns [n - exclude_keys]. The mask alone makes it fall."""
    seen = np.arange(1, n + 1, dtype=np.float64)
    if window is not None:
        seen = np.minimum(seen, int(window))
    tail_sums = np.cumsum((1.0 / seen)[::-1])[::-1]  # sum_{i >= r} 1/seen(i)
    first = np.arange(n - int(exclude_keys)) + int(exclude_keys)
    means = tail_sums[first] / (n - first)
    return means if window is None else np.where(np.arange(len(first)) < int(window), means, 0.0)


def uniform_bidirectional_by_distance(n: int, *, exclude_keys: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The position-free baseline of a bidirectional model: every query spreads 1/n over all n keys, so at every
    signed distance r = i - j that has a pair (r from -(n - 1) to n - 1 - exclude_keys) the mean weight is 1/n;
    NaN beyond. attention_by_signed_distance of that uniform pattern, without the n x n pattern.
    Returns (distances [2n - 1], weights [2n - 1]). Unlike causal masking, it does not fall with distance."""
    distances = np.arange(-(n - 1), n)
    return distances, np.where(distances <= n - 1 - int(exclude_keys), 1.0 / n, np.nan)


def capture_by_distance(capture, *, signed: bool = False, per_head: bool = False, exclude_keys: int = 0,
                        block: int = 128, progress=None):
    """attention_by_distance (signed=False: r = i - j >= 0) or attention_by_signed_distance (signed=True) of every
    captured layer, read from the capture a block of query rows at a time (capture.layer_rows), in either store:
    the long-text store never holds an N x N array, so this measures a model at its full context.
    progress(done, total) is called after each layer. Returns what the dense functions return for the capture's
    [layer, head, query, key] pattern."""
    n = capture.n_tokens
    _check_exclude(exclude_keys, n)
    return _means(diagonal_sums(capture, exclude_keys, block=block, progress=progress)[1], n, int(exclude_keys),
                  signed=signed, per_head=per_head)


def diagonal_sums(capture, exclude_keys: int = 0, *, block: int = 128, progress=None):
    """(sums over every key, sums leaving the first exclude_keys keys out): each [layer, head, 2n - 1], the weights
    summed along each diagonal i - j = r (index r + n - 1), from one pass over the capture.

    Per block, the weights [head, rows, keys] are summed along every diagonal at once: with the keys reversed
    (k = n - 1 - j) a diagonal becomes an anti-diagonal t + k = const, and writing the rows into an array one column
    wider than the block and reading it back one element shorter per row shifts row t right by t, so each
    anti-diagonal becomes a column (the usual skew trick). The excluded keys' own weights are summed on the side
    and taken off."""
    n = capture.n_tokens
    exclude_keys = _check_exclude(exclude_keys, n)
    total = np.zeros((len(capture.layers), capture.n_heads, 2 * n - 1))
    excluded = np.zeros_like(total)
    for li, layer in enumerate(capture.layers):
        for a in range(0, n, block):
            b = min(n, a + block)
            m = b - a
            w = _rows(capture, layer, a, b)  # [head, m, keys 0 .. key_end - 1]; the keys after are all zero
            heads, key_end = w.shape[0], w.shape[-1]
            y = np.zeros((heads, m, n + m), dtype=np.float32)
            y[:, :, n - key_end:n] = w[:, :, ::-1]  # key k = n - 1 - j
            z = y.reshape(heads, m * (n + m))[:, :m * (n + m - 1)].reshape(heads, m, n + m - 1)
            # column c holds t + k = c, so r = (a + t) - (n - 1 - k) = a + c - (n - 1): index a + c
            total[li, :, a:a + n + m - 1] += z.sum(axis=1, dtype=np.float64)
            for j in range(min(exclude_keys, key_end)):  # key j's weights sit at r = i - j: index i - j + n - 1
                excluded[li, :, a - j + n - 1:b - j + n - 1] += w[:, :, j]
        if progress is not None:
            progress(li + 1, len(capture.layers))
    return total, total - excluded


def _check_exclude(exclude_keys, n: int) -> int:
    exclude_keys = int(exclude_keys)
    if not 0 <= exclude_keys < n:
        raise ValueError(f"exclude_keys must be in [0, {n}), got {exclude_keys}")
    return exclude_keys


def _means(sums, n: int, exclude_keys: int, *, signed: bool, per_head: bool):
    """capture_by_distance's result from diagonal_sums: each sum over the number of (query, key) pairs at its
    distance, counted in closed form (so the means are exactly those of the dense functions)."""
    r_all = np.arange(-(n - 1), n)
    first = np.maximum(0, r_all + exclude_keys)  # queries i with a key j = i - r in [exclude_keys, n)
    last = np.minimum(n - 1, n - 1 + r_all)
    counts = np.maximum(0, last - first + 1).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.where(counts > 0, counts, 1.0), np.nan)
    means = means if per_head else means.mean(axis=1)
    if signed:
        return r_all, means
    return means[..., n - 1:n - 1 + n - exclude_keys]


def _rows(capture, layer: int, start: int, stop: int) -> np.ndarray:
    """Weights of queries start .. stop - 1 over keys 0 .. key_end - 1, where key_end is one past the last key the
    mask lets any of them see: from q and k in the long-text store, a causal block costs only the keys up to its
    last query. The dense store gives every key."""
    if capture.pattern is None and capture.inputs:
        from attnviz.attention import layer_pattern

        return layer_pattern(capture.inputs[int(layer)], start, stop)[0].numpy()
    return np.asarray(capture.layer_rows(layer, start, stop), dtype=np.float32)


@dataclass(frozen=True)
class DistanceProfile:
    """What the Positional page draws for one capture. distances [n_r]; per_layer [layer, n_r]; groups: each
    captured layer's group name (its mask and RoPE base, as "sliding window 512, RoPE base 1e+04"; one group in most
    models); baselines {name: [n_r]}: position-free attention, the mask alone, one per mask among the groups;
    theory [n_r] (ALiBi alone, in weight units) or None; relative {name: [n_r]}: the RoFormer bound over its value
    at 0 for each RoPE base among the groups (for the right axis), empty without RoPE; curve_groups: {baseline or
    bound name: the group it belongs to}; theory_note: one phrase on which curves apply and why; near [layer, head]:
    each head's weight within 8 tokens (excluding itself); where:
    in words."""

    distances: np.ndarray
    per_layer: np.ndarray
    groups: list[str]
    baselines: dict[str, np.ndarray]
    theory: np.ndarray | None
    relative: dict[str, np.ndarray]
    curve_groups: dict[str, str]
    theory_note: str
    near: np.ndarray
    where: str


def measured_profile(capture, shape, *, exclude_keys: int = 0, progress=None) -> DistanceProfile:
    """The DistanceProfile of a capture of a model of this ModelShape (its scheme, heads, head_dim, RoPE base).
    A causal model is measured at r = i - j >= 0; a bidirectional one at signed distances, both sides.
    progress(done, total): after each layer of the (first) pass over the capture."""
    from attnviz import positional as P

    n = capture.n_tokens
    skip = int(exclude_keys)
    causal = bool(capture.causal)
    facts = [_facts(shape, layer) for layer in capture.layers]
    every, kept = diagonal_sums(capture, skip, progress=progress)  # one pass: with and without the first keys
    if causal:
        per_layer = _means(kept, n, skip, signed=False, per_head=False)
        distances = np.arange(per_layer.shape[-1])
        baselines, owners = _mask_baselines(facts, n, skip)
        # the weight within 8 tokens back, excluding the token itself (with nothing left out)
        near = _means(every, n, 0, signed=False, per_head=True)[..., 1: min(9, n)].sum(-1)
        where = "within 8 tokens back"
    else:
        distances, per_layer = _means(kept, n, skip, signed=True, per_head=False)
        baselines = {"uniform over all keys (no position)": uniform_bidirectional_by_distance(n, exclude_keys=skip)[1]}
        owners = {}
        per_head = _means(every, n, 0, signed=True, per_head=True)[1]
        close = (np.abs(distances) >= 1) & (np.abs(distances) <= 8)
        near = np.nan_to_num(per_head[..., close]).sum(-1)  # mean weight within 8 tokens either side
        where = "within 8 tokens either side"
    theory, relative = None, {}
    scheme = shape.position
    if scheme == "alibi" and causal:
        theory = P.alibi_by_distance(shape.heads, n, exclude_keys=skip)
        note = "the dashed line is softmax of the ALiBi bias alone, with no content scores"
    elif scheme == "alibi":
        note = ("the ALiBi prediction drawn for causal models does not apply to this bidirectional one, so no theory "
                "curve is drawn")
    elif scheme == "rope":
        relative, note, bound_owners = _rope_bounds(facts, distances, shape.head_dim)
        owners = {**owners, **bound_owners}
        note += "" if causal else "; it depends on |distance| only"
    elif scheme in ("sinusoidal", "learned"):
        added = ("the sinusoidal encoding of Vaswani et al." if scheme == "sinusoidal" else
                 "a learned position table")
        note = (f"this model adds {added} to its token embeddings once, at the input, so how attention falls with "
                "distance depends on the trained weights (W_q, W_k) and no formula predicts it: no theory curve is "
                "drawn, and the RoPE bound and ALiBi curves do not apply")
    else:
        note = "this model's positions are not RoPE or ALiBi, so no theory curve is drawn"
    return DistanceProfile(distances=distances, per_layer=per_layer, groups=[f.describe() for f in facts],
                           baselines=baselines, theory=theory, relative=relative, curve_groups=owners,
                           theory_note=note, near=near, where=where)


def _facts(shape, layer: int):
    """A layer's LayerFacts (a causal or full layer with the model's RoPE base where the shape has none)."""
    if shape.layer_facts:
        return shape.layer_facts[layer]
    return LayerFacts(mask="causal" if shape.causal else "full", rope_base=shape.rope_base)


def _mask_baselines(facts, n: int, skip: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The position-free baseline of each mask among the captured layers, causal or a sliding window w (chunked
    layers get none: their reach depends on the query's place in its chunk), and the group each belongs to."""
    curves, owners = {}, {}
    for f in facts:
        if f.mask not in ("sliding", "causal"):
            continue
        window = f.window if f.mask == "sliding" else None
        name = f"uniform over the last {window} keys (no position)" if window else "uniform causal (no position)"
        if name not in curves:
            curves[name] = uniform_causal_by_distance(n, exclude_keys=skip, window=window)
            owners[name] = f.describe()
    return curves, owners


def _rope_bounds(facts, distances, head_dim: int) -> tuple[dict[str, np.ndarray], str, dict[str, str]]:
    """The RoFormer bound over its value at 0 for each RoPE base among the captured layers, the note, and the
    group each bound belongs to."""
    from attnviz import positional as P

    bases = sorted({f.rope_base for f in facts})
    curves, owners = {}, {}
    for base in bases:
        bound = P.rope_decay_bound(np.abs(distances), head_dim, base)
        owners_of_base = [f.describe() for f in facts if f.rope_base == base]
        kinds = sorted({f.reach for f in facts if f.rope_base == base})
        label = f"RoFormer bound, base {base:g}" + (f" ({' / '.join(kinds)} layers)" if len(bases) > 1 else "")
        curves[label] = bound / P.rope_decay_bound(np.array([0.0]), head_dim, base)[0]
        owners[label] = owners_of_base[0]
    which = ("one per RoPE base, each layer beside its own" if len(bases) > 1 else f"base = {bases[0]:g}")
    lines = "the dashed lines (right axis) are" if len(bases) > 1 else "the dashed line (right axis) is"
    return curves, (f"{lines} the RoFormer bound for d_head = {head_dim}, {which}, divided by its value at "
                    "distance 0"), owners
