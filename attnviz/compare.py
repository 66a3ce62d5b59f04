"""Two attention maps compared a block of query rows at a time, at any length: each map max-pooled as the Heads page
draws it, their difference pooled with its sign, and the exact summary of the full maps, without ever holding
either [n, n] map whole.

A map is given as rows(start, stop) -> [rows, key] float32 weights: a slice of a dense capture, or computed from
the layer's q and k (capture.head_pattern, or the mean over heads of capture.layer_rows). Every pass takes whole
blocks of attnviz.pooling.pool_edges, so the pooled maps equal attnviz.figures.heads.max_pool and max_abs_pool of the
full maps, and the summary equals attnviz.views.map_difference (tests/test_compare.py checks both).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from attnviz import cores
from attnviz.pooling import block_reduce, pool_edges
from attnviz.views import sink_hidden

Rows = Callable[[int, int], np.ndarray]  # rows(start, stop) -> [stop - start, key] weights
PASS_BYTES = 16 * 2**20  # one pass of a map's rows holds about this much of the [heads, rows, key] weights


@dataclass(frozen=True)
class PooledComparison:
    """a, b: each map max-pooled to at most `size` pixels a side (the map itself when it is that short), with the
    sink hidden when asked; diff: A − B pooled the same way, each block's entry of largest magnitude with its sign
    (None when the maps differ in size); bound: the largest |A − B| of the full maps (0 when none); summary:
    attnviz.views.map_difference of the full maps (None when the sizes differ or every row is blank in A or B)."""

    a: np.ndarray
    b: np.ndarray
    diff: np.ndarray | None
    bound: float
    summary: dict | None


def rows_per_pass(n: int, heads: int = 1) -> int:
    """Query rows one pass computes for a map of n keys read from `heads` heads: PASS_BYTES of float32 weights."""
    return max(1, PASS_BYTES // (4 * max(1, n) * max(1, heads)))


def compare_bytes(n_a: int, n_b: int, *, heads_a: int = 1, heads_b: int = 1, size: int = 512,
                  in_flight: int | None = None) -> int:
    """Estimated peak bytes of compare_maps beyond the captures: per pass in flight (in_flight; default one per
    core, cores.workers, and no more than there are passes: one when the maps differ in length),
    a pass's weights of each map as computed from q and k ([heads, rows, key] float32 scores, mask and softmax:
    three copies), the map's rows and the sink-hidden copy, the difference, its magnitude and the copy the pooling
    gathers (pooling.block_reduce), float32, counted as 16 bytes a weight; then the pooled maps and the pooled
    difference's two halves."""
    def one(n, heads):
        return min(n, rows_per_pass(n, heads)) * n * 4 * (3 * heads + 2)

    rows = min(n_a, n_b, rows_per_pass(n_a, heads_a), rows_per_pass(n_b, heads_b))
    m = min(max(n_a, n_b), size)
    if in_flight is None:
        in_flight = 1 if n_a != n_b else min(cores.workers(), -(-n_a // rows))
    return in_flight * (one(n_a, heads_a) + one(n_b, heads_b) + 2 * rows * max(n_a, n_b) * 8) + 5 * m * m * 8


def compare_maps(rows_a: Rows, n_a: int, rows_b: Rows, n_b: int, size: int, *, hide_sink: bool = False,
                 heads: tuple[int, int] = (1, 1), rows_at_once: int | None = None) -> PooledComparison:
    """The two maps pooled to `size`, their pooled signed difference and the exact summary, from rows_at_once
    query rows of each map at a time (rounded to whole pooled blocks; default: rows_per_pass of the larger map,
    `heads` being how many heads each map's rows are read from). The passes run on every core (cores.run_each:
    a core busy elsewhere takes fewer of them), each into its own rows of the pooled maps."""
    if rows_at_once is None:
        rows_at_once = min(rows_per_pass(n_a, heads[0]), rows_per_pass(n_b, heads[1]))

    def shown(rows: Rows, a: int, b: int) -> np.ndarray:
        w = np.asarray(rows(a, b), dtype=np.float32)
        return sink_hidden(w) if hide_sink else w

    if n_a != n_b:
        return PooledComparison(a=_pooled(lambda a, b: shown(rows_a, a, b), n_a, size, rows_at_once),
                                b=_pooled(lambda a, b: shown(rows_b, a, b), n_b, size, rows_at_once),
                                diff=None, bound=0.0, summary=None)
    m = len(pool_edges(n_a, size)) - 1
    pooled_a, pooled_b = np.empty((m, m), np.float32), np.empty((m, m), np.float32)
    diff = np.empty((m, m), np.float64)
    passes = list(_passes(n_a, size, rows_at_once))
    parts = [(0.0, 0.0, 0)] * len(passes)  # per pass: largest |A - B|, summed total variation, rows compared

    def one_pass(k: int) -> None:
        i, j, a, b, row_starts, key_starts = passes[k]
        wa, wb = shown(rows_a, a, b), shown(rows_b, a, b)
        pooled_a[i:j] = _pool(np.fmax, wa, row_starts, key_starts)
        pooled_b[i:j] = _pool(np.fmax, wb, row_starts, key_starts)
        d = wa - wb  # float32: within 6e-8 of the float64 difference, at half the memory traffic
        high, low = _pool(np.fmax, d, row_starts, key_starts), _pool(np.fmin, d, row_starts, key_starts)
        diff[i:j] = np.where(np.nan_to_num(-low) > np.nan_to_num(high), low, high)
        both = ~np.isnan(d).any(-1)  # rows blank (hidden sink) in neither map
        if both.any():
            gap = np.abs(d[both])
            parts[k] = (float(gap.max()), float(0.5 * gap.sum(-1, dtype=np.float64).sum()), int(both.sum()))

    cores.run_each(one_pass, range(len(passes)))
    largest = max(part[0] for part in parts)
    tv_sum, compared = sum(part[1] for part in parts), sum(part[2] for part in parts)  # in pass order
    summary = None if not compared else {"max": largest, "total_variation": tv_sum / compared, "rows": compared,
                                         "all_rows": compared == n_a}
    return PooledComparison(a=pooled_a, b=pooled_b, diff=diff, bound=largest, summary=summary)


def _pooled(rows: Rows, n: int, size: int, rows_at_once: int) -> np.ndarray:
    """One map max-pooled to `size`, a pass of rows at a time."""
    m = len(pool_edges(n, size)) - 1
    out = np.empty((m, m), np.float32)
    for i, j, a, b, row_starts, key_starts in _passes(n, size, rows_at_once):
        out[i:j] = _pool(np.fmax, rows(a, b), row_starts, key_starts)
    return out


def _passes(n: int, size: int, rows_at_once: int) -> Iterator[tuple]:
    """(i, j, a, b, row_starts, key_starts): pooled block rows i .. j - 1 cover query rows a .. b - 1 (about
    rows_at_once, at least one block); row_starts are their block starts relative to a, key_starts every block's."""
    edges = pool_edges(n, size)
    i = 0
    while i < len(edges) - 1:
        j = i + 1
        while j < len(edges) - 1 and edges[j + 1] - edges[i] <= rows_at_once:
            j += 1
        a, b = int(edges[i]), int(edges[j])
        yield i, j, a, b, edges[i:j] - a, edges[:-1]
        i = j


def _pool(reduce, w: np.ndarray, row_starts: np.ndarray, key_starts: np.ndarray) -> np.ndarray:
    """reduce (np.fmax or np.fmin: NaN skipped unless a whole block is NaN) over each block of w [rows, key]."""
    return block_reduce(reduce, block_reduce(reduce, w, key_starts, axis=-1), row_starts, axis=-2)
