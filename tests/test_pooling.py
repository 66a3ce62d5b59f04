"""attnviz.pooling.block_reduce against a loop over the blocks, for narrow blocks (gathered) and wide ones
(reduceat), with NaN cells and whole NaN blocks, along either of the last two axes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from attnviz.pooling import GATHER_WIDTH, block_reduce, pool_edges


@pytest.mark.parametrize("n, size", [(1800, 512), (100, 33), (4 * GATHER_WIDTH * 40, 40), (7, 7)])
@pytest.mark.parametrize("reduce, by_hand", [(np.fmax, np.nanmax), (np.fmin, np.nanmin)])
@pytest.mark.parametrize("axis", [-1, -2])
def test_each_block_reduced_as_a_loop_over_the_blocks_does(n, size, reduce, by_hand, axis):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((3, n, n + 5) if axis == -2 else (3, n + 5, n)).astype(np.float32)
    x[:, 2] = np.nan  # a NaN row
    x[..., 1] = np.nan  # a NaN column
    x[0, :4, :4] = np.nan  # a corner of NaN: a whole block NaN where blocks are narrow
    starts = pool_edges(n, size)[:-1]
    ends = [*starts[1:], n]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # nanmax of an all-NaN block warns; fmax does not
        expected = np.stack([by_hand(np.take(x, range(a, b), axis=axis), axis=axis) for a, b in zip(starts, ends)],
                            axis=axis)
    got = block_reduce(reduce, x, starts, axis=axis)
    assert got.dtype == x.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
