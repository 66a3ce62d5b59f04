"""Timing, peak memory and size limits for the four ways of computing attention, measured in one run.

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

from .naive import naive_attention, reference_attention, two_pass_attention
from .stages import stage_bounds
from .stepper import online_attention
from .triton_attention import INTERPRETED, KERNEL_DEVICE, NUM_STAGES, flash_attention

# Under the interpreter a tile step costs ~8 ms of numpy plus ~14 ns per BLOCK_M * BLOCK_N * d_pad element
# (measured on a busy 2-core machine: 16 x 16 x 16 tiles 8 ms a step, 128 x 128 x 128 tiles 37 ms a step).
INTERPRETED_STEP_S = 8e-3
INTERPRETED_ELEMENT_S = 14e-9
MAX_INTERPRETED_SECONDS = 5.0
# kept for callers that quote a step count: the most 16 x 16 x 16 steps MAX_INTERPRETED_SECONDS allows
MAX_INTERPRETED_STEPS = int(MAX_INTERPRETED_SECONDS / (INTERPRETED_STEP_S + INTERPRETED_ELEMENT_S * 16 ** 3))
# A warm call slower than this is timed once, not as a median of several (after the untimed warm-up call).
SLOW_CALL_S = 0.2
# The stepper keeps every step's tiles for display: past this many steps the page would hold too much.
MAX_STEPPER_STEPS = 4096
MAX_N = 8192
# Shared memory one block may use when no GPU is here to ask: 227 KiB, the opt-in limit of an H100 or H200.
DEFAULT_SHARED_MEMORY_BYTES = 227 * 1024
# bytes a value, by dtype name: the one table the page, the traffic counts and the shared-memory estimate read
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
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


def tile_steps(n_query, n_key, *, block_m, block_n, causal, batch_heads=1) -> int:
    """How many (query block, key block) steps the kernel runs: key blocks right of the causal diagonal are skipped."""
    total = 0
    for q_block in range(-(-n_query // block_m)):
        hi = stage_bounds(q_block, n_query=n_query, n_key=n_key, block_m=block_m, block_n=block_n, causal=causal).hi
        total += -(-hi // block_n)
    return total * batch_heads


def forward_flops(n_query, n_key, d, *, causal=False) -> float:
    """FLOPs of one head's attention forward pass: 4 n_query n_key d (q k^T and p v, a multiply-add = 2 FLOPs),
    halved when causal, FlashAttention-2's count (attnviz.cost.attention_flops's "attention" term for one head)."""
    return 4.0 * n_query * n_key * d / (2.0 if causal else 1.0)


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
            shared_memory_bytes=None) -> str | None:
    """Why this size cannot be run here, or None when it can. The page shows the reason instead of running.

    shared_memory_bytes: the GPU's per-block limit (None: shared_memory_limit()); checked only when compiled,
    as the interpreter has no shared memory."""
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
    steps = tile_steps(n, n, block_m=block_m, block_n=block_n, causal=causal)
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
                    measure_memory=False):
    """Runs naive, torch SDPA, two-pass tiled, the online-softmax stepper and the Triton kernel on the same seeded
    inputs [1, 1, n, head_dim]; checks each against float64 and times each, in this one call.
    measure_memory: also measure each torch method's peak CPU-allocator bytes (the first torch.profiler session
    in a process takes seconds). CPU times are taken on one torch thread (one_cpu_thread). Returns
    list[MethodResult]."""
    with one_cpu_thread():
        return _compare_methods(n, head_dim, block_m=block_m, block_n=block_n, causal=causal, dtype=dtype, seed=seed,
                                repeats=repeats, measure_memory=measure_memory)


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


def _compare_methods(n, head_dim, *, block_m, block_n, causal, dtype, seed, repeats, measure_memory):
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
        seconds, out = _timed(kernel)
    else:  # the first call compiles the kernel: untimed
        seconds, out = measure(kernel, repeats=repeats)
    error = (out.double().cpu() - reference).abs().max().item()
    if INTERPRETED:
        note = (f"functional simulation under the Triton interpreter: {seconds / steps * 1e3:.2f} ms per tile step, "
                "not a speed")
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
    seconds, _ = _timed(fn)
    if seconds < SLOW_CALL_S:
        seconds = time_call(fn, repeats=repeats, warmup=0)
    return seconds, out


def _timed(fn):
    """(wall seconds, result) of one call."""
    _sync()
    start = time.perf_counter()
    result = fn()
    _sync()
    return time.perf_counter() - start, result


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()
