"""attnviz.kernels.stages: the stage bounds the stepper and the tile map share, against the causal mask written out
and against the stage the Triton kernel itself records for every step it runs (KernelTrace.stage)."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.attention import MaskRule, causal_mask
from attnviz.kernels import (
    TILE_FULL, TILE_MASKED, TILE_SKIPPED, TILE_WINDOW, flash_attention, keys_read, reference_attention,
    stage_bounds, tile_map, tile_steps,
)
from attnviz.kernels.stepper import online_attention, tiled_steps
from tests.kernel_cases import inputs


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("n,bm,bn", [(100, 16, 32), (64, 32, 16), (37, 16, 16)])
def test_tile_map_agrees_with_the_causal_mask(n, bm, bn, causal):
    # A tile is skipped when the mask hides all of it, runs without a mask when it hides none of it, and runs masked
    # otherwise, or when it is the ragged last key block (keys past n are masked off inside the kernel)
    codes = tile_map(n, n, block_m=bm, block_n=bn, causal=causal)
    visible = causal_mask(n) if causal else np.ones((n, n), dtype=bool)
    for qb, kb in np.ndindex(codes.shape):
        tile = visible[qb * bm:(qb + 1) * bm, kb * bn:(kb + 1) * bn]
        ragged = (kb + 1) * bn > n
        expected = TILE_SKIPPED if not tile.any() else TILE_FULL if tile.all() and not ragged else TILE_MASKED
        assert codes[qb, kb] == expected, (qb, kb)
    assert tile_steps(n, n, block_m=bm, block_n=bn, causal=causal) == int((codes != TILE_SKIPPED).sum())


# (n_query, n_key, BLOCK_M, BLOCK_N, causal): ragged key blocks, more and fewer keys than queries, one token
TRACED = [(48, 48, 16, 16, True), (37, 37, 16, 32, False), (40, 70, 32, 16, True), (70, 40, 16, 32, True),
          (33, 17, 16, 16, True), (100, 100, 32, 16, True), (1, 1, 16, 16, True), (20, 50, 16, 16, False)]


@pytest.mark.parametrize("n_query,n_key,bm,bn,causal", TRACED)
def test_tile_map_is_the_stage_the_kernel_ran_every_tile_in(n_query, n_key, bm, bn, causal):
    q, _, _ = inputs(n_query, 16, "float32")
    _, k, v = inputs(n_key, 16, "float32", seed=1)
    _, trace = flash_attention(q, k, v, causal=causal, block_m=bm, block_n=bn, trace=True)
    codes = tile_map(n_query, n_key, block_m=bm, block_n=bn, causal=causal)
    assert codes.shape == (-(-n_query // bm), trace.stage.shape[2])
    for qb, kb in np.ndindex(codes.shape):
        ran = trace.stage[0, 0, kb, qb * bm:(qb + 1) * bm]  # the block's real queries
        kernel = TILE_SKIPPED if np.isnan(ran).all() else int(ran[0])
        assert (ran == ran[0]).all() or np.isnan(ran).all(), (qb, kb, ran)
        assert codes[qb, kb] == kernel, (qb, kb, codes[qb, kb], kernel)
    assert {TILE_FULL, TILE_MASKED} <= set(codes.flat) or n_query == 1


def test_a_ragged_last_key_block_runs_masked_without_the_causal_mask():
    codes = tile_map(40, 40, block_m=16, block_n=16, causal=False)  # keys 32-39 fill half of the third block
    assert (codes[:, :2] == TILE_FULL).all() and (codes[:, 2] == TILE_MASKED).all()
    assert (tile_map(48, 48, block_m=16, block_n=16, causal=False) == TILE_FULL).all()


@pytest.mark.parametrize("n_query,n_key", [(48, 48), (37, 53), (53, 37), (16, 100)])
@pytest.mark.parametrize("bm,bn", [(16, 16), (32, 16), (16, 32)])
def test_stage_bounds_by_the_mask_query_by_query(n_query, n_key, bm, bn):
    """Stage 1 holds exactly the whole key blocks every query of the block sees; nothing at or past hi is seen by
    any of them; hi is where the last query's sight ends."""
    visible = causal_mask(n_query, n_key)
    for qb in range(-(-n_query // bm)):
        rows = visible[qb * bm:(qb + 1) * bm]
        lo, left, mid, hi = stage_bounds(qb, n_query=n_query, n_key=n_key, block_m=bm, block_n=bn, causal=True)
        assert lo == left == 0  # no window
        assert mid % bn == 0 and 0 <= mid <= hi <= n_key
        whole = [j for j in range(n_key // bn) if rows[:, j * bn:(j + 1) * bn].all()]
        assert mid == (max(whole) + 1) * bn if whole else mid == 0
        assert whole == list(range(len(whole)))
        assert not rows[:, hi:].any()
        assert hi == 0 or rows[-1, hi - 1]


# (n_query, n_key, BLOCK_M, BLOCK_N, window): windows narrower and wider than a block, one key, more keys than
# queries, and a window wider than the text
WINDOWED = [(70, 70, 16, 16, 20), (50, 90, 16, 32, 37), (64, 64, 32, 16, 1), (64, 64, 16, 16, 100),
            (100, 100, 16, 16, 48)]


@pytest.mark.parametrize("n_query,n_key,bm,bn,window", WINDOWED)
def test_a_sliding_window_in_the_kernel_and_the_stepper(n_query, n_key, bm, bn, window):
    """The kernel and its stepper with a window, against float64 under the window's mask; the tile map against
    the mask (a tile left of every row's window is TILE_WINDOW, never run) and against the stage the kernel
    recorded for every tile; the step and key counters against the tiles that ran."""
    q, _, _ = inputs(n_query, 16, "float32")
    _, k, v = inputs(n_key, 16, "float32", seed=1)
    want = reference_attention(q, k, v, causal=True, window=window)
    out, trace = flash_attention(q, k, v, causal=True, window=window, block_m=bm, block_n=bn, trace=True)
    np.testing.assert_allclose(out.double(), want, atol=2e-6)
    np.testing.assert_allclose(online_attention(q, k, v, causal=True, window=window, block_m=bm, block_n=bn),
                               want, atol=2e-6)
    visible = MaskRule(n_query, n_key, causal=True, window=window).rows(0, n_query)
    codes = tile_map(n_query, n_key, block_m=bm, block_n=bn, causal=True, window=window)
    for qb, kb in np.ndindex(codes.shape):
        tile = visible[qb * bm:(qb + 1) * bm, kb * bn:(kb + 1) * bn]
        ran = trace.stage[0, 0, kb, qb * bm:(qb + 1) * bm]
        if not tile.any():  # hidden from every row: never loaded, left of the window or right of the diagonal
            left_of_window = (kb + 1) * bn <= qb * bm + n_key - n_query - window + 1
            assert codes[qb, kb] == (TILE_WINDOW if left_of_window else TILE_SKIPPED) and np.isnan(ran).all()
        else:
            ragged = (kb + 1) * bn > n_key
            assert codes[qb, kb] == (TILE_FULL if tile.all() and not ragged else TILE_MASKED), (qb, kb)
            assert (ran == codes[qb, kb]).all()
    steps = [s for s in tiled_steps(q, k, v, causal=True, window=window, block_m=bm, block_n=bn)
             if (s.batch, s.head) == (0, 0)]
    assert len(steps) == tile_steps(n_query, n_key, block_m=bm, block_n=bn, causal=True, window=window) == int(
        np.isin(codes, (TILE_FULL, TILE_MASKED)).sum())
    assert keys_read(n_query, n_key, block_m=bm, block_n=bn, causal=True, window=window) == sum(
        s.k_stop - s.k_start for s in steps)
    if window < n_key // 2:
        assert (codes == TILE_WINDOW).any()


def test_a_window_without_the_causal_mask_is_refused():
    q, k, v = inputs(32, 16, "float32")
    with pytest.raises(ValueError, match="causal"):
        flash_attention(q, k, v, causal=False, window=8)
    with pytest.raises(ValueError, match="causal"):
        stage_bounds(0, n_query=32, n_key=32, block_m=16, block_n=16, causal=False, window=8)
