"""Naive attention vs torch's SDPA vs the Triton kernel (attnviz.kernels), every figure measured in this one run.

On a GPU: TFLOPS for N = 256 ... 8192 (d = 64, float16, batch 4 x 16 heads), with FLOPs = 4 N^2 d per head,
halved when causal, and the goal at N = 4096: Triton >= 5x naive and >= 0.8x SDPA. The Triton kernel is timed with
each of a few launch configs and the fastest is reported with its config.
Without a GPU the kernel runs under the Triton interpreter, so it prints the interpreter's cost per tile step (a
functional simulation, not a speed), then naive vs SDPA wall time and measured peak memory on the CPU.

    python benchmarks/kernel.py
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from attnviz.kernels import (  # noqa: E402
    INTERPRETED, forward_flops, device_peak_tflops, flash_attention, make_inputs, naive_attention, peak_cpu_bytes,
    tile_steps, time_call, two_pass_attention,
)

sdpa = torch.nn.functional.scaled_dot_product_attention


def cpu_benchmark(threads=1):
    # one thread: on a small shared machine two torch threads wait on each other and times swing by 10x and more
    torch.set_num_threads(threads)
    print(f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch thread(s); "
          f"torch {torch.__version__}; Triton kernel under the interpreter: {INTERPRETED}")
    print("\nTriton interpreter, cost per tile step (functional simulation: numpy on the CPU, not a speed)")
    print("  N    d  BLOCK_M x BLOCK_N  causal  steps  seconds  ms/step")
    q, k, v = make_inputs(16, 16)
    flash_attention(q, k, v, block_m=16, block_n=16)  # first call sets up the interpreter
    for block in (16, 32, 64):
        for causal in (False, True):
            q, k, v = make_inputs(256, 64)
            steps = tile_steps(256, 256, block_m=block, block_n=block, causal=causal)
            seconds = time_call(lambda: flash_attention(q, k, v, causal=causal, block_m=block, block_n=block),
                                repeats=1, warmup=0)
            print(f"{256:>4} {64:>3}  {block:>7} x {block:<7}  {causal!s:>6} {steps:>6} {seconds:>8.2f} "
                  f"{seconds / steps * 1e3:>8.2f}")

    print("\nNaive vs torch SDPA on the CPU, float32, d = 64, one head, median of 5 (causal)")
    print("     N  naive ms   SDPA ms  naive/SDPA")
    for n in (256, 512, 1024, 2048, 4096):
        q, k, v = make_inputs(n, 64)
        naive = time_call(lambda: naive_attention(q, k, v, causal=True), repeats=5)
        fused = time_call(lambda: sdpa(q, k, v, is_causal=True), repeats=5)
        print(f"{n:>6} {naive * 1e3:>9.2f} {fused * 1e3:>9.2f} {naive / fused:>11.1f}x")

    print("\nPeak memory (torch CPU allocator, torch.profiler), float32, d = 64, one head, causal")
    print("     N   naive MiB    SDPA MiB  two-pass tiled 64x64 MiB  naive/tiled")
    for n in (256, 512, 1024, 2048, 4096):
        q, k, v = make_inputs(n, 64)
        peaks = [peak_cpu_bytes(fn) / 2**20 for fn in (
            lambda: naive_attention(q, k, v, causal=True), lambda: sdpa(q, k, v, is_causal=True),
            lambda: two_pass_attention(q, k, v, causal=True, block_m=64, block_n=64))]
        print(f"{n:>6} {peaks[0]:>11.2f} {peaks[1]:>11.2f} {peaks[2]:>25.2f} {peaks[0] / peaks[2]:>11.1f}x")


# (BLOCK_M, BLOCK_N, num_warps, num_stages) tried at every size, as the Triton tutorial's autotuner does
GPU_CONFIGS = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 64, 4, 4), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 4)]


def gpu_benchmark(batch=4, heads=16, d=64, dtype="float16", sizes=(256, 512, 1024, 2048, 4096, 8192),
                  device="cuda"):
    from triton.testing import do_bench

    name = torch.cuda.get_device_name()
    peak = device_peak_tflops(name, dtype)
    memory = torch.cuda.get_device_properties(0).total_memory
    print(f"GPU: {name}; torch {torch.__version__}; batch {batch} x {heads} heads, d = {d}, {dtype}; "
          f"TFLOPS = 4 N^2 d per head (halved when causal) / time; Triton: the fastest of {len(GPU_CONFIGS)} "
          "launch configs (BLOCK_M x BLOCK_N / warps / stages)")
    print("     N  causal  naive TFLOPS  SDPA TFLOPS  Triton TFLOPS  Triton config  Triton/naive  Triton/SDPA"
          "  max|Triton-SDPA|")
    goal = None
    for causal in (False, True):
        for n in sizes:
            q, k, v = make_inputs(n, d, dtype=dtype, batch=batch, heads=heads, device=device)
            flops = forward_flops(n, n, d, causal=causal) * batch * heads
            timed = {}
            for bm, bn, warps, stages in GPU_CONFIGS:
                def run(bm=bm, bn=bn, warps=warps, stages=stages):
                    return flash_attention(q, k, v, causal=causal, block_m=bm, block_n=bn, num_warps=warps,
                                           num_stages=stages)
                try:
                    timed[(bm, bn, warps, stages)] = (do_bench(run), run)
                except ValueError:  # more shared memory than this GPU has
                    continue
            config, (triton_ms, best) = min(timed.items(), key=lambda item: item[1][0])
            sdpa_ms = do_bench(lambda: sdpa(q, k, v, is_causal=causal))
            # naive holds ~14 bytes per score (fp16 scores, fp32 softmax, fp16 pattern): skip it when that won't fit
            naive_fits = 14 * batch * heads * n * n < 0.5 * memory
            naive_ms = do_bench(lambda: naive_attention(q, k, v, causal=causal)) if naive_fits else float("nan")
            error = (best().float() - sdpa(q, k, v, is_causal=causal).float()).abs().max().item()
            t = [flops / ms / 1e9 for ms in (naive_ms, sdpa_ms, triton_ms)]
            label = f"{config[0]}x{config[1]}/{config[2]}/{config[3]}"
            print(f"{n:>6} {causal!s:>7} {t[0]:>13.1f} {t[1]:>12.1f} {t[2]:>14.1f} {label:>14} "
                  f"{naive_ms / triton_ms:>12.1f}x {sdpa_ms / triton_ms:>11.2f}x {error:>17.1e}")
            if n == 4096 and not causal:
                goal = (naive_ms / triton_ms, sdpa_ms / triton_ms, t[2])
    if goal:
        speedup, ratio, tflops = goal
        share = f", {tflops / peak:.0%} of the {peak:g} TFLOPS peak" if peak else ""
        verdict = "met" if speedup >= 5 and ratio >= 0.8 else "NOT met"
        print(f"\nGoal at N = 4096, d = 64, fp16 (Triton >= 5x naive, >= 0.8x SDPA): {verdict}: {speedup:.1f}x naive, "
              f"{ratio:.2f}x SDPA, {tflops:.0f} TFLOPS{share}")


if __name__ == "__main__":
    if torch.cuda.is_available() and not INTERPRETED:
        gpu_benchmark()
    else:
        cpu_benchmark()
