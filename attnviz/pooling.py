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
