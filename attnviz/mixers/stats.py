"""Statistics of an implicit map that still mean something when its weights are signed and rows do not sum to 1.

Each is read on the shares a = |w| / (row sum of |w|): for query t, the fraction of its absolute weight that key s
carries, a causal row summing to 1 as a softmax row does. On those shares the softmax heads' own definitions apply
unchanged: attnviz.stats.previous_token_score, attnviz.stats.induction_score (targets from the text's repeats,
attnviz.stats.induction_targets) and attnviz.distance.attention_by_distance. Decay with distance is summed up by
the half-mass distance: the smallest r at which the mean row holds half its share within r tokens back.

map_stats reads a dense map. streamed_map_stats computes the same from the map's rows a block at a time (each
record's rows: attnviz.mixers.delta.delta_rule_rows, attnviz.mixers.kda.kda_rows, attnviz.mixers.ssd.ssd_rows), as
the softmax statistics stream a long text (attnviz.streamed): record_stats for one recorded layer, linear_stats for
every linear layer of a text, with no N x N array (8,192 tokens of a Qwen3-Next layer: benchmarks/mixers.py); the
tests hold the two equal."""

from __future__ import annotations

import functools

import numpy as np
import torch

from attnviz import stats
from attnviz.distance import attention_by_distance
from attnviz.cores import run_each
from attnviz.mixers.delta import head_groups
from attnviz.streamed import InductionMatch


def shares(w) -> np.ndarray:
    """|w| / row sum of |w|, float64, [head, query, key]; a row whose weights are all 0 stays 0."""
    a = np.abs(np.asarray(w, dtype=np.float64))
    total = a.sum(-1, keepdims=True)
    return np.divide(a, total, out=np.zeros_like(a), where=total > 0)


def half_mass_distance(profile: np.ndarray) -> np.ndarray:
    """profile [..., distance]: mean share at each distance r (attention_by_distance); the smallest r whose
    cumulative share reaches half the total, [...] ints."""
    cumulative = np.cumsum(profile, axis=-1)
    return np.argmax(cumulative >= 0.5 * cumulative[..., -1:], axis=-1)


def map_stats(w, token_ids) -> dict[str, np.ndarray]:
    """Per head of an implicit map w [head, query, key] over a text's token ids: prev_token and induction on the
    shares, the distance profile [head, distance] and the half-mass distance [head]."""
    a = shares(w)
    profile = attention_by_distance(a, per_head=True)
    return {"prev_token": stats.previous_token_score(a),
            "induction": stats.induction_score(a, stats.induction_targets(list(token_ids))),
            "distance_profile": profile, "half_mass_distance": half_mass_distance(profile)}


def streamed_map_stats(rows_of, heads: int, n: int, token_ids, *, block: int, dtype=torch.float32) -> dict:
    """map_stats of an implicit map [head, N, N] from its rows `block` at a time, never an N x N array.

    rows_of(into): the map's row blocks, (a, b, rows [head, b - a, b]) written into into(a, b) (delta_rule_rows or
    ssd_rows; b - a <= block). token_ids: the text's ids, or the InductionMatch that every layer of a text shares.
    Each block is turned into its shares in place (|w| / row sum) and read three ways: its
    diagonals (key = row - r) summed into the distance profile, whose r = 1 entry is prev_token (the same mean as
    attnviz.stats.previous_token_score); the shares on each row's induction targets (attnviz.streamed's
    InductionMatch, the softmax statistics' matching); the half-mass distance of the profile at the end. The
    diagonals are read through a strided view of the block laid out with one zero row before each head's rows
    (_Skewed), so no [rows, distance] array is made. A block's sums are in the map's dtype (torch sums float32
    pairwise: relative error about 1e-7; a float64 sum of float32 would first copy the block into float64), the
    totals over blocks in float64."""
    match = token_ids if isinstance(token_ids, InductionMatch) else InductionMatch(token_ids)
    skewed = _Skewed(heads, block, n, dtype)
    profile = torch.zeros(heads, n, dtype=torch.float64)
    induction = torch.zeros(heads, dtype=torch.float64)
    for a, b, rows in rows_of(skewed.into):
        total = rows.abs_().sum(-1)  # [head, rows]
        rows.mul_(torch.where(total > 0, 1 / total, 0)[..., None])  # the shares
        profile[:, :b] += skewed.by_distance(a, b).flip(-1)
        on_targets = torch.zeros(heads, b - a, dtype=dtype)
        match.add_matched(on_targets, rows, a, b, 0, b)
        induction += on_targets.sum(-1)
    profile = (profile / torch.arange(n, 0, -1, dtype=torch.float64)).numpy()  # n - r rows reach distance r
    with_targets = int(match.with_targets.sum())
    return {"prev_token": profile[:, 1] if n > 1 else np.full(heads, np.nan),
            "induction": induction.numpy() / with_targets if with_targets else np.full(heads, np.nan),
            "distance_profile": profile, "half_mass_distance": half_mass_distance(profile)}


def record_stats(record, token_ids, *, block: int | None = None, dtype=torch.float32) -> dict:
    """streamed_map_stats of one recorded linear mixer (attnviz.mixers.records: a gated delta rule, Kimi Delta
    Attention or Mamba2 call) on its text: its map's rows `block` at a time (default: the record's own block, the
    chunk of a delta rule), peak memory a few [head, block, N] arrays whatever N is. A group of heads per core
    (attnviz.mixers.delta.head_groups, each on one core), their statistics put side by side."""
    heads, n, block = record.heads, record.n_tokens, block or record.block
    rows_of = functools.partial(record.rows, block=block, dtype=dtype)
    match = token_ids if isinstance(token_ids, InductionMatch) else InductionMatch(token_ids)
    groups = head_groups(heads)
    parts: list = [None] * len(groups)

    def group(i: int) -> None:
        part = groups[i]
        parts[i] = streamed_map_stats(lambda into: rows_of(into=into, heads=part), len(range(heads)[part]), n,
                                      match, block=block, dtype=dtype)

    run_each(group, range(len(groups)))
    out = {key: np.concatenate([part[key] for part in parts]) for key in ("prev_token", "induction",
                                                                           "distance_profile")}
    return {**out, "half_mass_distance": half_mass_distance(out["distance_profile"])}


def linear_stats(records: dict, token_ids, **options) -> dict[int, dict]:
    """{layer: record_stats} of every recorded linear mixer of one text (attnviz.mixers.record.mixer_records), one
    layer at a time; the text's induction pairs are matched once for all of them. options: block, dtype."""
    match = InductionMatch(token_ids)
    return {layer: record_stats(record, match, **options) for layer, record in sorted(records.items())}


class _Skewed:
    """One flat buffer that holds a block of rows a .. b - 1 on keys 0 .. b - 1 as [head, 1 + rows, b], a zero row
    first in each head. Row i (query t = a + i) read from column i - (rows - 1) + m on, with stride b + 1 between
    rows, gives at m its key t - (b - 1 - m), distance b - 1 - m, for every row at once: a key before 0 falls in
    the row above at a column after that row's query (causal: 0) or in the zero row, never past the row's own
    query."""

    def __init__(self, heads: int, block: int, n: int, dtype):
        self.heads, self.flat = heads, torch.empty(heads * (min(block, n) + 1) * n, dtype=dtype)

    def _layout(self, a: int, b: int) -> torch.Tensor:
        return self.flat[:self.heads * (b - a + 1) * b].view(self.heads, b - a + 1, b)

    def into(self, a: int, b: int) -> torch.Tensor:
        """Where the rows a .. b - 1 go: [head, b - a, b], after a zeroed row per head."""
        layout = self._layout(a, b)
        layout[:, 0] = 0
        return layout[:, 1:]

    def by_distance(self, a: int, b: int) -> torch.Tensor:
        """[head, b]: at m, the block's sum over rows of the share at distance b - 1 - m."""
        size = b - a
        skew = torch.as_strided(self.flat, (self.heads, size, b), ((size + 1) * b, b + 1, 1), b - (size - 1))
        return skew.sum(1)
