"""Timing, peak memory and size limits for the four ways of computing attention, measured in one run.

Under the Triton interpreter the kernel's time is a functional simulation (numpy, one tile step at a time): it is
reported as a cost per tile step, never as a speed. On a GPU it is a speed, reported in TFLOPS (4 N^2 d FLOPs,
halved when causal: a multiply-add counts as 2).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from .naive import naive_attention, reference_attention, two_pass_attention
from .stepper import key_block_range, online_attention
from .triton_attention import INTERPRETED, KERNEL_DEVICE, flash_attention

# Under the interpreter one tile step costs ~4 ms of numpy: 1024 steps is a few seconds.
MAX_INTERPRETED_STEPS = 1024
# The stepper keeps every step's tiles for display: past this many steps the page would hold too much.
MAX_STEPPER_STEPS = 4096
MAX_N = 8192
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def tile_steps(n_query, n_key, *, block_m, block_n, causal, batch_heads=1) -> int:
    """How many (query block, key block) steps the kernel runs: key blocks right of the causal diagonal are skipped."""
    total = 0
    for q_block in range(-(-n_query // block_m)):
        hi = key_block_range(q_block, n_query=n_query, n_key=n_key, block_m=block_m, causal=causal)
        total += -(-hi // block_n)
    return total * batch_heads


def attention_flops(n_query, n_key, d, *, causal=False) -> float:
    """4 n_query n_key d (q k^T and p v, a multiply-add = 2 FLOPs), halved when causal (FlashAttention-2's count)."""
    return 4.0 * n_query * n_key * d / (2.0 if causal else 1.0)


def refusal(n, head_dim, *, block_m, block_n, causal, dtype, interpreted=INTERPRETED) -> str | None:
    """Why this size cannot be run here, or None when it can. The page shows the reason instead of running."""
    if n < 1 or head_dim < 1:
        return "N and the head dim must be at least 1."
    if n > MAX_N:
        return f"N = {n} is over {MAX_N}: the naive [N, N] score matrix would not be worth materialising here."
    if head_dim > 128:
        return f"Head dim {head_dim} is over 128, the largest the kernel supports."
    if dtype == "bfloat16" and interpreted:
        return ("bfloat16 is refused under the Triton interpreter, which computes bfloat16 tl.dot wrongly: "
                "pick float16 or float32 (bfloat16 works on a GPU).")
    steps = tile_steps(n, n, block_m=block_m, block_n=block_n, causal=causal)
    if interpreted and steps > MAX_INTERPRETED_STEPS:
        return (f"{steps} tile steps would take about {steps * 4 / 1000:.0f} s or more under the Triton interpreter "
                f"(~4 ms per step, no GPU here); the limit is {MAX_INTERPRETED_STEPS}. Lower N or raise BLOCK_M / "
                "BLOCK_N.")
    if steps > MAX_STEPPER_STEPS:
        return f"{steps} tile steps are too many to step through; the limit is {MAX_STEPPER_STEPS}. Raise the blocks."
    return None


def time_call(fn, *, repeats=3, warmup=1) -> float:
    """Median wall time of fn() in seconds over `repeats` runs after `warmup` runs (CUDA is synchronised)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        _sync()
        start = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def peak_cpu_bytes(fn) -> int | None:
    """Peak bytes held by torch's CPU allocator while fn() runs, above what was held when it started, from the
    allocation events of torch.profiler (profile_memory=True). None when the profiler records no allocations."""
    from torch.profiler import ProfilerActivity, profile

    try:
        from torch._C._profiler import _EventType
    except ImportError:
        return None
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    if not events:
        return None
    held = peak = 0
    for _, size in sorted(events):
        held += size
        peak = max(peak, held)
    return peak


def make_inputs(n, head_dim, *, dtype="float32", seed=0, batch=1, heads=1, device="cpu"):
    """Seeded q, k, v [batch, heads, n, head_dim], standard normal, in the given dtype."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, head_dim, generator=g) for _ in range(3))
    return tuple(x.to(device=device, dtype=DTYPES[dtype]) for x in (q, k, v))


@dataclass(frozen=True)
class MethodResult:
    """One way of computing attention, run, checked against float64 and timed in the same run.

    error: max |O - O_float64|; seconds: median wall time; steps: tile steps (None for untiled methods);
    peak_bytes: measured peak of torch's CPU allocator (None where not measured); note: how to read the time.
    """

    method: str
    how: str
    error: float
    seconds: float
    steps: int | None
    peak_bytes: int | None
    note: str


def compare_methods(n, head_dim, *, block_m, block_n, causal, dtype="float32", seed=0, repeats=3):
    """Runs naive, torch SDPA, two-pass tiled, the online-softmax stepper and the Triton kernel on the same seeded
    inputs [1, 1, n, head_dim]; checks each against float64 and times each. Returns list[MethodResult]."""
    q, k, v = make_inputs(n, head_dim, dtype=dtype, seed=seed)
    reference = reference_attention(q, k, v, causal=causal)
    steps = tile_steps(n, n, block_m=block_m, block_n=block_n, causal=causal)
    blocks = dict(block_m=block_m, block_n=block_n)
    methods = [
        ("naive", "softmax(Q K^T / sqrt(d)) V, the whole [N, N] matrix at once",
         lambda: naive_attention(q, k, v, causal=causal), None),
        ("torch SDPA", "torch.nn.functional.scaled_dot_product_attention",
         lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal), None),
        ("two-pass tiled", "tiles; pass 1 finds the row max, pass 2 sums and weights V (reads K twice)",
         lambda: two_pass_attention(q, k, v, causal=causal, **blocks), steps),
        ("online softmax (stepper)", "tiles in one pass, rescaling by alpha: the kernel's algorithm in torch",
         lambda: online_attention(q, k, v, causal=causal, **blocks), steps),
    ]
    results = []
    for name, how, fn, n_steps in methods:
        error = (fn().double().cpu() - reference).abs().max().item()
        seconds = time_call(fn, repeats=repeats)
        results.append(MethodResult(name, how, error, seconds, n_steps, peak_cpu_bytes(fn), "wall time on the CPU"))
    kq, kk, kv = (x.to(KERNEL_DEVICE) for x in (q, k, v))
    kernel = lambda: flash_attention(kq, kk, kv, causal=causal, **blocks)  # noqa: E731
    error = (kernel().double().cpu() - reference).abs().max().item()
    seconds = time_call(kernel, repeats=1 if INTERPRETED else repeats)
    if INTERPRETED:
        note = (f"functional simulation under the Triton interpreter: {seconds / steps * 1e3:.2f} ms per tile step, "
                "not a speed")
    else:
        tflops = attention_flops(n, n, head_dim, causal=causal) / seconds / 1e12
        note = f"{tflops:.2f} TFLOPS on {torch.cuda.get_device_name()}"
    results.append(MethodResult("fused Triton kernel", "the FlashAttention-2 forward pass in Triton, one pass, fused",
                                error, seconds, steps, None, note))
    return results


def peak_memory_scan(sizes, head_dim, *, block_m=64, block_n=64, causal=False, dtype="float32"):
    """Measured peak CPU-allocator bytes of naive vs two-pass tiled attention at each N in sizes.
    Returns {"naive": [...], "tiled": [...]} aligned with sizes."""
    peaks = {"naive": [], "tiled": []}
    for n in sizes:
        q, k, v = make_inputs(n, head_dim, dtype=dtype)
        peaks["naive"].append(peak_cpu_bytes(lambda: naive_attention(q, k, v, causal=causal)))
        peaks["tiled"].append(peak_cpu_bytes(
            lambda: two_pass_attention(q, k, v, causal=causal, block_m=block_m, block_n=block_n)))
    return peaks


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()
