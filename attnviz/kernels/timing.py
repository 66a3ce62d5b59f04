"""Timing and peak memory of the ways of computing attention, each checked against float64, measured in one run.
(What may run at all, and the dtype sizes, are in limits.py.)

Under the Triton interpreter the kernel's time is a functional simulation (numpy, one tile step at a time): it is
reported as a cost per tile step, never as a speed. On a GPU it is a speed, reported in TFLOPS (4 N^2 d FLOPs,
halved when causal: a multiply-add counts as 2).
"""

from __future__ import annotations

import re
import statistics
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .limits import tile_steps
from .naive import naive_attention, reference_attention, two_pass_attention
from .stepper import online_attention
from .triton_attention import INTERPRETED, KERNEL_DEVICE, flash_attention

# A warm call slower than this is timed once, not as a median of several (after the untimed warm-up call).
SLOW_CALL_S = 0.2
# torch.profiler is process-wide: one measurement at a time
_PROFILER_LOCK = threading.Lock()
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Dense peaks from NVIDIA's data sheets, TFLOPS: tensor cores for 16-bit inputs, CUDA cores for float32 (the kernel
# computes float32 in IEEE precision, not TF32); data sheets quote tensor peaks with sparsity, halved here.
# Matched against torch.cuda.get_device_name() as whole words, the longest name first ("L40S" is not "L4").
PEAK_TFLOPS = (
    ("H100 PCIe", {"float16": 756.0, "bfloat16": 756.0, "float32": 51.0}),
    ("H100 NVL", {"float16": 835.5, "bfloat16": 835.5, "float32": 60.0}),
    ("H100", {"float16": 989.4, "bfloat16": 989.4, "float32": 66.9}),
    ("H200", {"float16": 989.4, "bfloat16": 989.4, "float32": 66.9}),
    ("A100", {"float16": 312.0, "bfloat16": 312.0, "float32": 19.5}),
    ("L40S", {"float16": 362.05, "bfloat16": 362.05, "float32": 91.6}),
    ("L4", {"float16": 121.0, "bfloat16": 121.0, "float32": 30.3}),
)


def forward_flops(n_query, n_key, d, *, causal=False) -> float:
    """FLOPs of one head's attention forward pass: 4 n_query n_key d (q k^T and p v, a multiply-add = 2 FLOPs),
    halved when causal, FlashAttention-2's count (attnviz.cost.attention_flops's "attention" term for one head)."""
    return 4.0 * n_query * n_key * d / (2.0 if causal else 1.0)


def device_peak_tflops(device_name: str, dtype: str) -> float | None:
    """The data-sheet peak for this GPU and dtype (PEAK_TFLOPS), or None for a GPU not in the table. A table name
    matches as whole words ("NVIDIA L40S" is not an L4, "NVIDIA GH200" not an H200), the longest match winning
    ("NVIDIA H100 NVL" is the NVL, not the SXM H100)."""
    for key, peaks in sorted(PEAK_TFLOPS, key=lambda row: -len(row[0])):
        if re.search(r"(?<![A-Za-z0-9])" + re.escape(key) + r"(?![A-Za-z0-9])", device_name, re.IGNORECASE):
            return peaks.get(dtype)
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
    with _PROFILER_LOCK, profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
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


def peak_bytes(fn, device=KERNEL_DEVICE) -> int | None:
    """Peak bytes fn() allocates on device above what was already held: torch.cuda's peak counter on a GPU,
    peak_cpu_bytes on the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return peak_cpu_bytes(fn)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - held


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


def compare_methods(n, head_dim, *, block_m, block_n, causal, dtype="float32", seed=0, repeats=5,
                    measure_memory=False, interpreted_call=None):
    """Runs naive, torch SDPA, two-pass tiled, the online-softmax stepper and the Triton kernel on the same seeded
    inputs [1, 1, n, head_dim]; checks each against float64 and times each, in this one call.
    measure_memory: also measure each torch method's peak CPU-allocator bytes (the first torch.profiler session
    in a process takes seconds). CPU times are taken on one torch thread (one_cpu_thread). interpreted_call: under
    the Triton interpreter, (seconds, output) of the kernel's one call on these inputs made already (the step
    view's, attnviz.kernels.steps_view.kernel_run), checked and reported instead of a second call. Returns
    list[MethodResult]."""
    with one_cpu_thread():
        return _compare_methods(n, head_dim, block_m=block_m, block_n=block_n, causal=causal, dtype=dtype, seed=seed,
                                repeats=repeats, measure_memory=measure_memory, interpreted_call=interpreted_call)


_THREADS_LOCK = threading.Lock()
_thread_users = 0  # how many one_cpu_thread blocks are running now, in any thread
_saved_threads = None  # torch's thread count before the first of them began


@contextmanager
def one_cpu_thread():
    """Runs the block on one torch CPU thread: on a small shared machine two threads wait on each other and CPU
    times swing tenfold. torch's thread count is process-wide, so concurrent blocks (two app sessions) share one
    use count under a lock: the first saves the count, the last restores it, whatever order they leave in."""
    global _thread_users, _saved_threads
    with _THREADS_LOCK:
        if _thread_users == 0:
            _saved_threads = torch.get_num_threads()
            torch.set_num_threads(1)
        _thread_users += 1
    try:
        yield
    finally:
        with _THREADS_LOCK:
            _thread_users -= 1
            if _thread_users == 0:
                torch.set_num_threads(_saved_threads)
                _saved_threads = None


def _compare_methods(n, head_dim, *, block_m, block_n, causal, dtype, seed, repeats, measure_memory,
                     interpreted_call):
    q, k, v = make_inputs(n, head_dim, dtype=dtype, seed=seed, device=KERNEL_DEVICE)
    reference = reference_attention(q, k, v, causal=causal)
    steps = tile_steps(n, n, block_m=block_m, block_n=block_n, causal=causal)
    where = "the CPU" if KERNEL_DEVICE.type == "cpu" else torch.cuda.get_device_name()
    results = []
    for name, (how, fn, tiled) in _torch_methods(q, k, v, causal=causal, block_m=block_m, block_n=block_n).items():
        seconds, out = measure(fn, repeats=repeats)
        error = (out.double().cpu() - reference).abs().max().item()
        peak = peak_bytes(fn, "cpu" if name.startswith("online") else KERNEL_DEVICE) if measure_memory else None
        on = "the CPU (the stepper always runs there)" if name.startswith("online") else where
        results.append(MethodResult(name, how, error, seconds, steps if tiled else None, peak, f"wall time on {on}"))
    kernel = lambda: flash_attention(q, k, v, causal=causal, block_m=block_m, block_n=block_n)  # noqa: E731
    if INTERPRETED:  # one call, checked and timed: nothing is compiled, and each call costs ~8 ms per tile step
        seconds, out = interpreted_call or timed_once(kernel)
    else:  # the first call compiles the kernel: untimed
        seconds, out = measure(kernel, repeats=repeats)
    error = (out.double().cpu() - reference).abs().max().item()
    if INTERPRETED:
        note = (f"functional simulation under the Triton interpreter: {seconds / steps * 1e3:.2f} ms per tile step, "
                "not a speed" + (" (the step view's call, with its debug trace)" if interpreted_call else ""))
    else:
        tflops = forward_flops(n, n, head_dim, causal=causal) / seconds / 1e12
        peak = device_peak_tflops(where, dtype)
        note = f"{tflops:.2f} TFLOPS on {where}"
        if peak:
            note += f", {tflops / peak:.1%} of its {peak:g} TFLOPS peak"
    # the interpreter's numpy buffers are not the kernel's memory: measured on a GPU only
    peak = peak_bytes(kernel) if measure_memory and not INTERPRETED else None
    results.append(MethodResult("fused Triton kernel", "the FlashAttention-2 forward pass in Triton, one pass, fused",
                                error, seconds, steps, peak, note))
    return results


def _torch_methods(q, k, v, *, causal, block_m, block_n):
    """name -> (what it does, a call, whether it is tiled) for the four torch ways of computing attention."""
    blocks = dict(block_m=block_m, block_n=block_n)
    return {
        "naive": ("softmax(Q K^T / sqrt(d)) V, the whole [N, N] matrix at once",
                  lambda: naive_attention(q, k, v, causal=causal), False),
        "torch SDPA": ("torch.nn.functional.scaled_dot_product_attention",
                       lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal), False),
        "two-pass tiled": ("tiles; pass 1 finds the row max, pass 2 sums and weights V (reads K twice)",
                           lambda: two_pass_attention(q, k, v, causal=causal, **blocks), True),
        "online softmax (stepper)": ("tiles in one pass, rescaling by alpha: the kernel's algorithm in torch",
                                     lambda: online_attention(q, k, v, causal=causal, **blocks), True),
    }


def peak_memory_scan(sizes, head_dim, *, block_m=64, block_n=64, causal=False, dtype="float32"):
    """Measured peak CPU-allocator bytes of naive vs two-pass tiled attention, [1, 1, N, head_dim], at each N.
    Returns {"naive": [...], "tiled": [...]} aligned with sizes."""
    peaks = {"naive": [], "tiled": []}
    for n in sizes:
        q, k, v = make_inputs(n, head_dim, dtype=dtype)
        peaks["naive"].append(peak_cpu_bytes(lambda: naive_attention(q, k, v, causal=causal)))
        peaks["tiled"].append(peak_cpu_bytes(
            lambda: two_pass_attention(q, k, v, causal=causal, block_m=block_m, block_n=block_n)))
    return peaks


def peak_memory_at(n, head_dim, *, block_m, block_n, causal, dtype="float32", seed=0) -> dict:
    """Measured peak CPU-allocator bytes of naive, torch SDPA, two-pass tiled and the stepper at one size.
    Returns {method name: bytes or None}."""
    q, k, v = make_inputs(n, head_dim, dtype=dtype, seed=seed)
    methods = _torch_methods(q, k, v, causal=causal, block_m=block_m, block_n=block_n)
    return {name: peak_cpu_bytes(fn) for name, (_, fn, _) in methods.items()}


def measure(fn, *, repeats=5):
    """(seconds, output) of fn: one untimed warm-up call first (on a GPU it compiles kernels and warms the
    allocator; its output is returned for checking), then one timed warm call; when that took under SLOW_CALL_S,
    the median of `repeats` more. CUDA is synchronised around every timed call."""
    out = fn()
    seconds, _ = timed_once(fn)
    if seconds < SLOW_CALL_S:
        seconds = time_call(fn, repeats=repeats, warmup=0)
    return seconds, out


def timed_once(fn):
    """(wall seconds, result) of one call of fn (the GPU synchronised before and after)."""
    _sync()
    start = time.perf_counter()
    result = fn()
    _sync()
    return time.perf_counter() - start, result


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()
