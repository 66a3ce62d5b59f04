"""Which key blocks a query block visits, and how: the two stages of _attn_fwd, as one function.

The kernel (triton_attention._attn_fwd), the stepper (stepper.tiled_steps), the tile map (tile_map), the step
count (limits.tile_steps) and the traffic counts (traffic.py) all take their bounds from stage_bounds, so the
picture on the page is the loop the kernel runs. Pure Python: no torch, no Triton.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# tile_map codes, and the stage numbers the kernel writes to its trace (KernelTrace.stage)
TILE_SKIPPED, TILE_FULL, TILE_MASKED = 0, 1, 2


class StageBounds(NamedTuple):
    """Key positions [0, mid) run in stage 1 (no mask), [mid, hi) in stage 2 (masked); keys from hi on are never
    loaded. mid and hi are multiples of BLOCK_N, except hi, which may stop inside a block (the kernel's loop
    `for start_n in range(lo, hi, BLOCK_N)` still visits that block whole, masked)."""

    mid: int
    hi: int


def stage_bounds(q_block: int, *, n_query: int, n_key: int, block_m: int, block_n: int, causal: bool) -> StageBounds:
    """The bounds _attn_fwd gives _attn_fwd_inner for query block q_block, line for line.

    Stage 1 takes the key blocks that every query of the block sees in full: wholly inside the keys (n_key //
    block_n of them) and, when causal, wholly left of the diagonal for the block's first query (key j is visible to
    query i when j <= i + n_key - n_query). Stage 2 takes the rest up to hi: the blocks the diagonal runs through and
    the ragged last block. hi is n_key, or with the causal mask the last key the block's last real query sees, + 1.
    """
    offset = n_key - n_query  # causal_offset in the kernel
    start = q_block * block_m
    full_blocks = n_key // block_n
    if causal:
        full_blocks = min(full_blocks, max(start + offset + 1, 0) // block_n)
        hi = max(min(min(start + block_m, n_query) + offset, n_key), 0)
    else:
        hi = n_key
    return StageBounds(mid=full_blocks * block_n, hi=hi)


def tile_map(n_query, n_key, *, block_m, block_n, causal) -> np.ndarray:
    """[n_query_blocks, n_key_blocks] codes of how the kernel runs each tile: TILE_SKIPPED (never loaded: the
    causal mask hides it from every query of the block), TILE_FULL (stage 1, no mask) or TILE_MASKED (stage 2: the
    causal diagonal runs through it, or it is the ragged last block of keys)."""
    n_qb, n_kb = -(-n_query // block_m), -(-n_key // block_n)
    codes = np.full((n_qb, n_kb), TILE_SKIPPED, dtype=int)
    for i in range(n_qb):
        mid, hi = stage_bounds(i, n_query=n_query, n_key=n_key, block_m=block_m, block_n=block_n, causal=causal)
        codes[i, :mid // block_n] = TILE_FULL
        codes[i, mid // block_n:-(-hi // block_n)] = TILE_MASKED
    return codes


def keys_read(n_query, n_key, *, block_m, block_n, causal) -> int:
    """L: the key positions all query blocks load together (each block its key blocks up to hi, the last one cut
    at n_key). The tiled kernel reads L rows of K and L rows of V."""
    total = 0
    for i in range(-(-n_query // block_m)):
        hi = stage_bounds(i, n_query=n_query, n_key=n_key, block_m=block_m, block_n=block_n, causal=causal).hi
        total += min(-(-hi // block_n) * block_n, n_key)
    return total
