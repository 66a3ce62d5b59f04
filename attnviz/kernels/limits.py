"""What the page may run here, and why not: the kernel's step count, the Triton interpreter's time budget, the
shared memory a compiled launch needs against what the GPU gives one block, and the byte size of each dtype.
refusal() is the one check the Tiled kernel page makes before running anything."""

from __future__ import annotations

import torch

from .stages import stage_bounds
from .triton_attention import INTERPRETED, NUM_STAGES, UNAVAILABLE

# Under the interpreter a tile step costs a fixed few milliseconds of numpy plus a little per BLOCK_M * BLOCK_N *
# d_pad element: the estimate the page uses to refuse runs that would take minutes (benchmarks/kernel.py times it).
INTERPRETED_STEP_S = 8e-3
INTERPRETED_ELEMENT_S = 14e-9
MAX_INTERPRETED_SECONDS = 5.0
# kept for callers that quote a step count: the most 16 x 16 x 16 steps MAX_INTERPRETED_SECONDS allows
MAX_INTERPRETED_STEPS = int(MAX_INTERPRETED_SECONDS / (INTERPRETED_STEP_S + INTERPRETED_ELEMENT_S * 16 ** 3))
# The stepper keeps every step's tiles for display: past this many steps the page would hold too much.
MAX_STEPPER_STEPS = 4096
MAX_N = 8192
# Shared memory one block may use when no GPU is here to ask: 227 KiB, the opt-in limit of an H100 or H200.
DEFAULT_SHARED_MEMORY_BYTES = 227 * 1024
# bytes a value, by dtype name: the one table the page, the traffic counts and the shared-memory estimate read
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def tile_steps(n_query, n_key, *, block_m, block_n, causal, batch_heads=1, window=None) -> int:
    """How many (query block, key block) steps the kernel runs: key blocks right of the causal diagonal, and left of
    a sliding window, are skipped."""
    total = 0
    for q_block in range(-(-n_query // block_m)):
        b = stage_bounds(q_block, n_query=n_query, n_key=n_key, block_m=block_m, block_n=block_n, causal=causal,
                         window=window)
        total += max(-(-b.hi // block_n) - b.lo // block_n, 0)
    return total * batch_heads


def shared_memory_estimate(head_dim, *, block_n, dtype, num_stages=NUM_STAGES, block_m=None) -> int:
    """Bytes of shared memory the compiled kernel needs, estimated: the software pipeline keeps a K tile and a V
    tile ([BLOCK_N, d padded to a power of two >= 16], input dtype) for each of its num_stages key blocks,
    num_stages * 2 * BLOCK_N * d_pad * itemsize, and for 16-bit inputs Hopper's warp-group MMA also reads the Q tile
    ([BLOCK_M, d_pad]) from shared memory. For 16-bit inputs on sm_90 this is exactly what Triton allocates (a test
    compiles the kernel to check); Ampere keeps Q in registers and needs the Q tile less. For float32 (no tensor
    cores) Triton allocates between 0.6x and 1.2x of the K/V term, which is what is returned."""
    d_pad = max(16, 1 << (int(head_dim) - 1).bit_length())
    need = num_stages * 2 * block_n * d_pad * ITEMSIZE[dtype]
    if ITEMSIZE[dtype] == 2 and block_m is not None:
        need += block_m * d_pad * 2
    return need


def shared_memory_limit() -> int:
    """Shared memory one block may use on this GPU (the opt-in limit), or DEFAULT_SHARED_MEMORY_BYTES without one."""
    if torch.cuda.is_available():
        limit = getattr(torch.cuda.get_device_properties(0), "shared_memory_per_block_optin", None)
        if limit:
            return int(limit)
    return DEFAULT_SHARED_MEMORY_BYTES


def refusal(n, head_dim, *, block_m, block_n, causal, dtype, interpreted=INTERPRETED,
            shared_memory_bytes=None, window=None) -> str | None:
    """Why this size cannot be run here, or None when it can. The page shows the reason instead of running.

    shared_memory_bytes: the GPU's per-block limit (None: shared_memory_limit()); checked only when compiled,
    as the interpreter has no shared memory."""
    if interpreted and UNAVAILABLE:
        return UNAVAILABLE
    if n < 1 or head_dim < 1:
        return "N and the head dim must be at least 1."
    if n > MAX_N:
        return f"N = {n} is over {MAX_N}: the naive [N, N] score matrix would not be worth materialising here."
    if head_dim > 128:
        return f"Head dim {head_dim} is over 128, the largest the kernel supports."
    if dtype == "bfloat16" and interpreted:
        return ("bfloat16 is refused under the Triton interpreter, which computes bfloat16 tl.dot wrongly: "
                "pick float16 or float32 (bfloat16 works on a GPU).")
    if not interpreted:
        need = shared_memory_estimate(head_dim, block_n=block_n, dtype=dtype, block_m=block_m)
        q_tile = " and the Q tile" if ITEMSIZE[dtype] == 2 else ""
        limit = shared_memory_limit() if shared_memory_bytes is None else shared_memory_bytes
        if need > limit:
            return (f"BLOCK_N = {block_n} with head dim {head_dim} in {dtype} needs about {need / 1024:,.0f} KiB of "
                    f"shared memory ({NUM_STAGES} pipeline stages of a K and a V tile{q_tile}), more than the "
                    f"{limit / 1024:,.0f} KiB this GPU gives one block: lower BLOCK_N, the head dim, or use float16.")
    steps = tile_steps(n, n, block_m=block_m, block_n=block_n, causal=causal, window=window)
    if interpreted:
        seconds = interpreted_seconds(steps, head_dim, block_m=block_m, block_n=block_n)
        if seconds > MAX_INTERPRETED_SECONDS:
            return (f"{steps} tile steps of {block_m} × {block_n} × {head_dim} would take about {seconds:.0f} s under "
                    f"the Triton interpreter (no GPU here; ~{INTERPRETED_STEP_S * 1e3:.0f} ms per step plus "
                    f"~{INTERPRETED_ELEMENT_S * 1e9:.0f} ns per BLOCK_M·BLOCK_N·d element); the limit is "
                    f"{MAX_INTERPRETED_SECONDS:.0f} s. Lower N, the head dim or the blocks.")
    if steps > MAX_STEPPER_STEPS:
        return f"{steps} tile steps are too many to step through; the limit is {MAX_STEPPER_STEPS}. Raise the blocks."
    return None


def interpreted_seconds(steps, head_dim, *, block_m, block_n) -> float:
    """Estimated wall time of the kernel under the Triton interpreter: each tile step costs a fixed
    INTERPRETED_STEP_S plus INTERPRETED_ELEMENT_S per element of its BLOCK_M x BLOCK_N x d_pad products."""
    d_pad = max(16, 1 << (int(head_dim) - 1).bit_length())
    return steps * (INTERPRETED_STEP_S + INTERPRETED_ELEMENT_S * block_m * block_n * d_pad)
