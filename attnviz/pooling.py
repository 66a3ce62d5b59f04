"""Max-pool block edges shared by the figures (attnviz.figures.heads.max_pool) and the long-text views
(attnviz.views, attnviz.stats), so a map pooled from q and k block by block equals max_pool of the dense map.
numpy only: the figures import it."""

from __future__ import annotations

import numpy as np

MIN_REMAINING = 0.01  # with the sink hidden, rows with less weight than this off token 0 are left blank


def pool_edges(n: int, size: int) -> np.ndarray:
    """Block edges of max_pool: size + 1 rounded points from 0 to n (or 0..n when n <= size)."""
    if n <= size:
        return np.arange(n + 1)
    return np.linspace(0, n, size + 1).round().astype(int)


def block_reduce(reduce, x: np.ndarray, starts: np.ndarray, axis: int) -> np.ndarray:
    """reduce (np.fmax or np.fmin: NaN skipped unless a whole block is NaN) over each block of x along `axis`:
    blocks start at `starts`, the last one ending at the axis's end.

    Narrow blocks (at most GATHER_WIDTH wide) are reduced a position at a time: the j-th position of every block
    (a block narrower than the widest repeats its last, which neither fmax nor fmin minds) taken at once and
    reduced into the result, about 8x faster than reduceat's loop over blocks of 3 or 4 (1,800 keys pooled to
    512 pixels). Wider blocks go through reduceat, which then reads long runs."""
    size, starts = x.shape[axis], np.asarray(starts)
    ends = np.append(starts[1:], size)
    width = int((ends - starts).max()) if len(starts) else 0
    with np.errstate(invalid="ignore"):
        if width == 0 or width > GATHER_WIDTH:
            return reduce.reduceat(x, starts, axis=axis)
        index = np.minimum(starts[:, None] + np.arange(width), ends[:, None] - 1)  # [block, position]
        out = np.take(x, index[:, 0], axis=axis)
        for j in range(1, width):
            reduce(out, np.take(x, index[:, j], axis=axis), out=out)
        return out


GATHER_WIDTH = 8  # block_reduce reduces blocks up to this wide a position at a time
