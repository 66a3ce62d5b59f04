"""Naive attention vs torch's SDPA vs the Triton kernel (attnviz.kernels), every figure measured in this one run.

On a GPU: TFLOPS for N = 256 ... 16,384, d = 64 and 128, causal and not, float16 and bfloat16 (batch 4 x 16 heads),
with FLOPs = 4 N^2 d per head, halved when causal, and the share of the device's data-sheet peak. torch SDPA is
timed with its FlashAttention-2 backend (the goal's yardstick) and with its cuDNN backend where it has one. The
Triton kernel is timed with each launch config of GPU_LAUNCH_CONFIGS and the fastest is reported with its config.
Goal at N = 4096, d = 64, float16, causal and not: Triton >= 5x naive and >= 0.8x SDPA (flash).
Without a GPU the kernel runs under the Triton interpreter, so it prints the interpreter's cost per tile step (a
functional simulation, not a speed), then naive vs SDPA wall time and measured peak memory on the CPU.

    python benchmarks/kernel.py                  the full run (GPU table, or the CPU tables without a GPU)
    python benchmarks/kernel.py --plan           print what the GPU run will do, run nothing
    python benchmarks/kernel.py --tune           on a GPU: every launch config of a wider grid at N = 4096
    python benchmarks/kernel.py --sizes 4096 --head-dims 64 --dtypes float16    a part of the GPU table
    python benchmarks/kernel.py --step-view      the Tiled kernel page's step view: built and serialised, its size
    python benchmarks/kernel.py --quick          the smallest case of the run: on a GPU N = 256, d = 64, float16;
                                                 on the CPU the interpreter at N = 64 and the tables at N = 256
"""

from __future__ import annotations

import argparse
import csv
import itertools
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from attnviz.kernels import (
    INTERPRETED, forward_flops, device_peak_tflops, flash_attention, make_inputs, naive_attention, peak_cpu_bytes,
    tile_steps, time_call, two_pass_attention,
)
from attnviz.kernels.limits import shared_memory_estimate, shared_memory_limit
from attnviz.kernels.triton_attention import GPU_LAUNCH_CONFIGS

sdpa = torch.nn.functional.scaled_dot_product_attention

SIZES = (256, 512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
DTYPES = ("float16", "bfloat16")
BATCH, HEADS = 4, 16
GOAL_N, GOAL_D, GOAL_DTYPE = 4096, 64, "float16"
# the wider grid --tune walks at N = 4096 (the Triton tutorial's autotuning space)
TUNE_CONFIGS = [c for c in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4)) if not (c[0] == 64
                                                                                                  and c[2] == 8)]
# naive holds ~14 bytes per score (16-bit scores, float32 softmax, 16-bit pattern): skipped where that won't fit
NAIVE_BYTES_PER_SCORE = 14


def cpu_benchmark(threads=1, interpreted_n=256, blocks=(16, 32, 64), sizes=(256, 512, 1024, 2048, 4096)):
    # one thread: on a small shared machine two torch threads wait on each other and times swing by 10x and more
    torch.set_num_threads(threads)
    print(f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch thread(s); "
          f"torch {torch.__version__}; Triton kernel under the interpreter: {INTERPRETED}")
    print("\nTriton interpreter, cost per tile step (functional simulation: numpy on the CPU, not a speed)")
    print("  N    d  BLOCK_M x BLOCK_N  causal  steps  seconds  ms/step")
    q, k, v = make_inputs(16, 16)
    flash_attention(q, k, v, block_m=16, block_n=16)  # first call sets up the interpreter
    n = interpreted_n
    for block in blocks:
        for causal in (False, True):
            q, k, v = make_inputs(n, 64)
            steps = tile_steps(n, n, block_m=block, block_n=block, causal=causal)
            seconds = time_call(lambda: flash_attention(q, k, v, causal=causal, block_m=block, block_n=block),
                                repeats=1, warmup=0)
            print(f"{n:>4} {64:>3}  {block:>7} x {block:<7}  {causal!s:>6} {steps:>6} {seconds:>8.2f} "
                  f"{seconds / steps * 1e3:>8.2f}")

    print("\nNaive vs torch SDPA on the CPU, float32, d = 64, one head, median of 5 (causal)")
    print("     N  naive ms   SDPA ms  naive/SDPA")
    for n in sizes:
        q, k, v = make_inputs(n, 64)
        naive = time_call(lambda: naive_attention(q, k, v, causal=True), repeats=5)
        fused = time_call(lambda: sdpa(q, k, v, is_causal=True), repeats=5)
        print(f"{n:>6} {naive * 1e3:>9.2f} {fused * 1e3:>9.2f} {naive / fused:>11.1f}x")

    print("\nPeak memory (torch CPU allocator, torch.profiler), float32, d = 64, one head, causal")
    print("     N   naive MiB    SDPA MiB  two-pass tiled 64x64 MiB  naive/tiled")
    for n in sizes:
        q, k, v = make_inputs(n, 64)
        peaks = [peak_cpu_bytes(fn) / 2**20 for fn in (
            lambda: naive_attention(q, k, v, causal=True), lambda: sdpa(q, k, v, is_causal=True),
            lambda: two_pass_attention(q, k, v, causal=True, block_m=64, block_n=64))]
        print(f"{n:>6} {peaks[0]:>11.2f} {peaks[1]:>11.2f} {peaks[2]:>25.2f} {peaks[0] / peaks[2]:>11.1f}x")


def fits(config, d, dtype):
    """Whether a launch config's K/V pipeline (and Hopper's Q tile) fits the GPU's shared memory."""
    bm, bn, _, stages = config
    return shared_memory_estimate(d, block_n=bn, block_m=bm, dtype=dtype, num_stages=stages) <= shared_memory_limit()


def plan(args):
    """What the GPU run will do, printed without running anything."""
    cells = list(itertools.product(args.dtypes, args.head_dims, (False, True), args.sizes))
    print(f"GPU plan: {len(cells)} cells = dtypes {list(args.dtypes)} x head dims {list(args.head_dims)} x "
          f"causal (False, True) x N {list(args.sizes)}; batch {BATCH} x {HEADS} heads")
    print(f"  each cell: inputs on the GPU, torch SDPA (flash backend; cuDNN backend where it runs), naive where "
          f"{NAIVE_BYTES_PER_SCORE} bytes per score fit in half the GPU's memory, and the Triton kernel with every "
          f"launch config below (BLOCK_M, BLOCK_N, num_warps, num_stages) that fits shared memory; "
          f"triton.testing.do_bench times each (its median)")
    for config in GPU_LAUNCH_CONFIGS:
        print(f"    {config}")
    compiles = len(set((dt, d, c) for dt, d, c, _ in cells)) * len(GPU_LAUNCH_CONFIGS)
    print(f"  compiles: up to {compiles} kernels (one per dtype x head dim x causal x config)")
    for dt, d in itertools.product(args.dtypes, args.head_dims):
        skipped = [n for n in args.sizes if NAIVE_BYTES_PER_SCORE * BATCH * HEADS * n * n > 0.5 * 80 * 2**30]
        print(f"  {dt}, d = {d}: on an 80 GiB GPU naive is skipped at N = {skipped}")
    print(f"  then: the goal line at N = {GOAL_N}, d = {GOAL_D}, {GOAL_DTYPE}, causal and not: Triton >= 5x naive "
          "and >= 0.8x SDPA (flash); --csv FILE also writes every cell")
    print(f"--tune: {len(TUNE_CONFIGS)} configs at N = {GOAL_N}, {GOAL_DTYPE}, d = {list(args.head_dims)}, causal "
          "and not, each timed and checked against SDPA")


def _bench(fn):
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100)


def _sdpa_ms(q, k, v, causal, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return _bench(lambda: sdpa(q, k, v, is_causal=causal))
    except RuntimeError:  # this backend does not take these inputs
        return float("nan")


def _triton_timings(q, k, v, causal, configs):
    """{config: ms} for every config that fits, and the fastest one's output."""
    d, dtype = q.shape[-1], str(q.dtype).removeprefix("torch.")
    timed = {}
    for bm, bn, warps, stages in configs:
        if not fits((bm, bn, warps, stages), d, dtype):
            continue

        def run(bm=bm, bn=bn, warps=warps, stages=stages):
            return flash_attention(q, k, v, causal=causal, block_m=bm, block_n=bn, num_warps=warps,
                                   num_stages=stages)
        try:
            timed[(bm, bn, warps, stages)] = _bench(run)
        except ValueError:  # more shared memory than this GPU has, found at compile time
            continue
    return timed


def _inputs(n, d, dtype, device="cuda"):
    g = torch.Generator(device=device).manual_seed(0)
    return tuple(torch.randn(BATCH, HEADS, n, d, generator=g, device=device, dtype=getattr(torch, dtype))
                 for _ in range(3))


def gpu_benchmark(args):
    name = torch.cuda.get_device_name()
    memory = torch.cuda.get_device_properties(0).total_memory
    import triton

    print(f"GPU: {name}, {memory / 2**30:.0f} GiB; torch {torch.__version__}, triton {triton.__version__}, "
          f"CUDA {torch.version.cuda}; batch {BATCH} x {HEADS} heads")
    print("TFLOPS = 4 N^2 d per head (halved when causal) / time, medians of triton.testing.do_bench; SDPA flash = "
          "torch SDPA's FlashAttention-2 backend, cuDNN = its cuDNN backend; Triton: the fastest launch config "
          "(BLOCK_M x BLOCK_N / warps / stages); max err = max |Triton - SDPA flash|")
    rows = []
    goal = {}
    started = time.perf_counter()
    for dtype, d in itertools.product(args.dtypes, args.head_dims):
        peak = device_peak_tflops(name, dtype)
        print(f"\n{dtype}, d = {d} (data-sheet peak {peak:g} TFLOPS)" if peak else f"\n{dtype}, d = {d}")
        print("     N  causal   naive  SDPA flash  SDPA cuDNN  Triton  Triton config  % peak  Triton/naive  "
              "Triton/flash  max err")
        for causal in (False, True):
            for n in args.sizes:
                q, k, v = _inputs(n, d, dtype)
                flops = forward_flops(n, n, d, causal=causal) * BATCH * HEADS
                timed = _triton_timings(q, k, v, causal, GPU_LAUNCH_CONFIGS)
                config = min(timed, key=timed.get)
                triton_ms = timed[config]
                flash_ms = _sdpa_ms(q, k, v, causal, "FLASH_ATTENTION")
                cudnn_ms = _sdpa_ms(q, k, v, causal, "CUDNN_ATTENTION")
                naive_fits = NAIVE_BYTES_PER_SCORE * BATCH * HEADS * n * n < 0.5 * memory
                naive_ms = _bench(lambda: naive_attention(q, k, v, causal=causal)) if naive_fits else float("nan")
                bm, bn, warps, stages = config
                out = flash_attention(q, k, v, causal=causal, block_m=bm, block_n=bn, num_warps=warps,
                                      num_stages=stages)
                from torch.nn.attention import SDPBackend, sdpa_kernel
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    error = (out.float() - sdpa(q, k, v, is_causal=causal).float()).abs().max().item()
                tflops = {key: flops / ms / 1e9 for key, ms in
                          (("naive", naive_ms), ("flash", flash_ms), ("cudnn", cudnn_ms), ("triton", triton_ms))}
                share = tflops["triton"] / peak if peak else float("nan")
                label = f"{bm}x{bn}/{warps}/{stages}"
                print(f"{n:>6} {causal!s:>7} {tflops['naive']:>7.1f} {tflops['flash']:>11.1f} "
                      f"{tflops['cudnn']:>11.1f} {tflops['triton']:>7.1f} {label:>14} {share:>7.1%} "
                      f"{naive_ms / triton_ms:>12.1f}x {flash_ms / triton_ms:>12.2f}x {error:>8.1e}", flush=True)
                rows.append(dict(dtype=dtype, d=d, n=n, causal=causal, naive_ms=naive_ms, flash_ms=flash_ms,
                                 cudnn_ms=cudnn_ms, triton_ms=triton_ms, triton_config=label,
                                 triton_tflops=tflops["triton"], flash_tflops=tflops["flash"],
                                 cudnn_tflops=tflops["cudnn"], naive_tflops=tflops["naive"], peak_share=share,
                                 max_error=error))
                if (n, d, dtype) == (GOAL_N, GOAL_D, GOAL_DTYPE):
                    goal[causal] = (naive_ms / triton_ms, flash_ms / triton_ms, tflops["triton"], share)
                q = k = v = out = None  # free the GPU memory before the next size
                torch.cuda.empty_cache()
    for causal, (speedup, ratio, tflops, share) in goal.items():
        verdict = "met" if speedup >= 5 and ratio >= 0.8 else "NOT met"
        print(f"Goal at N = {GOAL_N}, d = {GOAL_D}, {GOAL_DTYPE}, causal={causal} (Triton >= 5x naive, >= 0.8x SDPA "
              f"flash): {verdict}: {speedup:.1f}x naive, {ratio:.2f}x SDPA flash, {tflops:.0f} TFLOPS, "
              f"{share:.0%} of peak")
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def tune(args):
    """Every config of TUNE_CONFIGS at N = GOAL_N, fastest first, checked against SDPA (flash)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    print(f"GPU: {torch.cuda.get_device_name()}; tuning at N = {GOAL_N}, batch {BATCH} x {HEADS} heads")
    for dtype, d, causal in itertools.product(args.dtypes, args.head_dims, (False, True)):
        q, k, v = _inputs(GOAL_N, d, dtype)
        flops = forward_flops(GOAL_N, GOAL_N, d, causal=causal) * BATCH * HEADS
        flash_ms = _sdpa_ms(q, k, v, causal, "FLASH_ATTENTION")
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            expected = sdpa(q, k, v, is_causal=causal).float()
        timed = _triton_timings(q, k, v, causal, TUNE_CONFIGS)
        ranked = sorted(timed.items(), key=lambda item: item[1])
        print(f"\n{dtype}, d = {d}, causal={causal}: SDPA flash {flops / flash_ms / 1e9:.1f} TFLOPS; "
              f"{len(timed)} configs fit")
        for (bm, bn, warps, stages), ms in ranked[:8]:
            out = flash_attention(q, k, v, causal=causal, block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)
            error = (out.float() - expected).abs().max().item()
            print(f"  {bm:>3}x{bn:<3} warps {warps} stages {stages}: {flops / ms / 1e9:7.1f} TFLOPS "
                  f"({flash_ms / ms:.2f}x flash)  max err {error:.1e}", flush=True)
        if ranked:
            (bm, bn, warps, stages), ms = ranked[-1]
            print(f"  slowest: {bm}x{bn} warps {warps} stages {stages}: {flops / ms / 1e9:.1f} TFLOPS")


def step_view(repeats=5):
    """What the Tiled kernel page's step view costs the server when a setting or the Step slider moves: the view
    built (attnviz.kernels.steps_view.step_view: a window of steps, each a stop of its in-chart slider) and
    serialised as the page sends it (one_draw.spec, or the figure as it is when it holds too many numbers, then
    plotly.io.to_json as st.plotly_chart writes it), and its size. Medians over `repeats` steps of one run, at the
    page's default and at larger settings."""
    import statistics

    import plotly.io as pio

    from attnviz.kernels.steps_view import step_view as view, stepper_run
    from attnviz.figures import one_draw

    print("Step view of the Tiled kernel page, built and serialised (median over steps; causal, float32, d = 32)")
    print("      N  blocks      steps  stops  build ms  serialise ms      KB")
    for n, block in ((64, 16), (128, 16), (1024, 128)):
        run = stepper_run(n, 32, block_m=block, block_n=block, causal=True)
        view(run, 0)  # plotly's validators load on first use
        built, sent, size, stops = [], [], 0, 0
        for i in list(range(len(run.steps)))[::max(1, len(run.steps) // repeats)][:repeats]:
            start = time.perf_counter()
            fig, shown = view(run, i)
            built.append(time.perf_counter() - start)
            start = time.perf_counter()
            size = len(pio.to_json(one_draw.spec(fig) if one_draw.listed(fig) else fig, validate=False))
            sent.append(time.perf_counter() - start)
            stops = len(shown)
        print(f"{n:>7}  {block:>3} x {block:<3} {len(run.steps):>7} {stops:>6} {statistics.median(built) * 1e3:>9.0f}"
              f" {statistics.median(sent) * 1e3:>13.0f} {size / 1e3:>7.0f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", action="store_true", help="print what the GPU run will do and stop")
    parser.add_argument("--tune", action="store_true", help="on a GPU, time a wider grid of launch configs")
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    parser.add_argument("--head-dims", type=int, nargs="+", default=HEAD_DIMS)
    parser.add_argument("--dtypes", nargs="+", default=DTYPES, choices=("float16", "bfloat16"))
    parser.add_argument("--csv", help="also write every GPU cell to this CSV file")
    parser.add_argument("--step-view", action="store_true", help="time the page's step view, built and sent")
    parser.add_argument("--quick", action="store_true", help="the smallest case of the run")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.head_dims, args.dtypes = (256,), (64,), ("float16",)
    if args.step_view:
        return step_view()
    if args.plan:
        return plan(args)
    gpu = torch.cuda.is_available() and not INTERPRETED
    if args.tune:
        if not gpu:
            sys.exit("--tune needs a CUDA GPU")
        return tune(args)
    if gpu:
        gpu_benchmark(args)
    elif args.quick:
        cpu_benchmark(interpreted_n=64, blocks=(32,), sizes=(256,))
    else:
        cpu_benchmark()


if __name__ == "__main__":
    main()
