"""Which key blocks a query block visits, and how: the two stages of _attn_fwd, as one function.

The kernel (triton_attention._attn_fwd), the stepper (stepper.tiled_steps), the tile map (tile_map), the step
count (limits.tile_steps) and the traffic counts (traffic.py) all take their bounds from stage_bounds, so the
picture on the page is the loop the kernel runs. Pure Python: no torch, no Triton.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# tile_map codes, and the stage numbers the kernel writes to its trace (KernelTrace.stage); TILE_WINDOW: never
# loaded because a sliding window hides it from every query of the block (left of the window)
TILE_SKIPPED, TILE_FULL, TILE_MASKED, TILE_WINDOW = 0, 1, 2, 3


class StageBounds(NamedTuple):
    """Key positions [lo, left) run masked (the left edge of a sliding window), [left, mid) in stage 1 (no mask),
    [mid, hi) in stage 2 (masked); keys before lo and from hi on are never loaded. lo, left and mid are multiples
    of BLOCK_N; hi may stop inside a block (the kernel's loop `for start_n in range(lo, hi, BLOCK_N)` still visits
    that block whole, masked). Without a window lo = left = 0."""

    lo: int
    left: int
    mid: int
    hi: int


def stage_bounds(q_block: int, *, n_query: int, n_key: int, block_m: int, block_n: int, causal: bool,
                 window: int | None = None) -> StageBounds:
    """The bounds _attn_fwd gives _attn_fwd_inner for query block q_block, line for line.

    Stage 1 takes the key blocks that every query of the block sees in full: wholly inside the keys (n_key //
    block_n of them) and, when causal, wholly left of the diagonal for the block's first query (key j is visible to
    query i when j <= i + n_key - n_query). Stage 2 takes the rest up to hi: the blocks the diagonal runs through and
    the ragged last block. hi is n_key, or with the causal mask the last key the block's last real query sees, + 1.
    window (causal only): query i also sees only keys j > i + offset - window, so the blocks wholly left of the
    block's first query's window are never loaded (lo), and those the window's edge cuts run masked [lo, left).
    """
    if window is not None and (not causal or window < 1):
        raise ValueError("a sliding window needs the causal mask and at least 1 key")
    offset = n_key - n_query  # causal_offset in the kernel
    start = q_block * block_m
    last = min(start + block_m, n_query) - 1  # the block's last real query
    full_blocks = n_key // block_n
    lo = left = 0
    if causal:
        full_blocks = min(full_blocks, max(start + offset + 1, 0) // block_n)
        hi = max(min(last + 1 + offset, n_key), 0)
        if window:
            lo = min(max(start + offset - window + 1, 0) // block_n * block_n, full_blocks * block_n)
            left = min(max(-(-max(last + offset - window + 1, 0) // block_n) * block_n, lo), full_blocks * block_n)
    else:
        hi = n_key
    return StageBounds(lo=lo, left=left, mid=full_blocks * block_n, hi=hi)


def tile_map(n_query, n_key, *, block_m, block_n, causal, window=None) -> np.ndarray:
    """[n_query_blocks, n_key_blocks] codes of how the kernel runs each tile: TILE_SKIPPED (never loaded: the
    causal mask hides it from every query of the block), TILE_WINDOW (never loaded: left of every query's sliding
    window), TILE_FULL (stage 1, no mask) or TILE_MASKED (masked: the causal diagonal or the window's edge runs
    through it, or it is the ragged last block of keys)."""
    n_qb, n_kb = -(-n_query // block_m), -(-n_key // block_n)
    codes = np.full((n_qb, n_kb), TILE_SKIPPED, dtype=int)
    for i in range(n_qb):
        b = stage_bounds(i, n_query=n_query, n_key=n_key, block_m=block_m, block_n=block_n, causal=causal,
                         window=window)
        codes[i, :b.lo // block_n] = TILE_WINDOW
        codes[i, b.lo // block_n:b.left // block_n] = TILE_MASKED
        codes[i, b.left // block_n:b.mid // block_n] = TILE_FULL
        codes[i, b.mid // block_n:-(-b.hi // block_n)] = TILE_MASKED
    return codes


def keys_read(n_query, n_key, *, block_m, block_n, causal, window=None) -> int:
    """L: the key positions all query blocks load together (each block its key blocks from lo up to hi, the last
    one cut at n_key). The tiled kernel reads L rows of K and L rows of V."""
    total = 0
    for i in range(-(-n_query // block_m)):
        b = stage_bounds(i, n_query=n_query, n_key=n_key, block_m=block_m, block_n=block_n, causal=causal,
                         window=window)
        total += max(min(-(-b.hi // block_n) * block_n, n_key) - b.lo, 0)
    return total
