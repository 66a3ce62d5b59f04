"""The implicit attention map of a Gated DeltaNet layer at 2,048 tokens against the FLOP count of its O(N² d) form.

Goal (issue 38): the map w[head, query, key] of a Gated DeltaNet layer at 2,048 tokens within 3x the time of
2·N²·dk FLOPs per head (every pair's q·k, the dense O(N² d) form) at this machine's measured float32 matmul rate.
The layer is Qwen3-Next-80B-A3B's shape: 16 key heads of 128, 32 value heads (the map has one per value head),
random inputs as the kernel receives them (q, k after the short convolution, g <= 0, beta in (0, 1)).

It prints, from one run, by the wall clock and by this process's CPU time (all threads' seconds added, which a busy
machine's other work does not inflate): the float32 matmul rate (benchmarks/longcontext.py's yardstick, measured
just before), the seconds of attnviz.mixers.delta_rule_map (best of 3), the limit (2·N²·dk·heads FLOPs at that
rate), their ratio against the goal, the ratio against the causal half (N²·dk·heads), the chunkwise form's own
FLOPs for the earlier keys (N²(dk + dk²/chunk) per head) at the rate, and transformers'
torch_chunk_gated_delta_rule on the same inputs (the layer's own output, not its map), wall seconds, for scale.

    python benchmarks/mixers.py
    python benchmarks/mixers.py --quick     256 tokens, 4 value heads, a 256³ matmul rate (seconds, not figures)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from attnviz.mixers.delta import CHUNK, delta_rule_map
from benchmarks.longcontext import matmul_rate

GOAL = 3.0


def best_of(fn, repeats: int = 3) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of fn, the best of `repeats` after one warm-up run."""
    fn()
    wall = cpu = float("inf")
    for _ in range(repeats):
        started, used = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - started), min(cpu, time.process_time() - used)
    return wall, cpu


def matmul_rates(size: int) -> tuple[float, float]:
    """The float32 matmul rate in FLOP/s by the wall clock (benchmarks/longcontext.py's matmul_rate) and by this
    process's CPU time (all threads' seconds added: the rate a busy machine's other work does not lower)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    _, cpu = best_of(lambda: torch.matmul(a, b), repeats=7)
    return matmul_rate(size), 2 * size**3 / cpu


def inputs(n: int, k_heads: int, v_heads: int, dk: int, dv: int):
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(n, k_heads, dk, generator=gen), torch.randn(n, k_heads, dk, generator=gen)
    v = torch.randn(n, v_heads, dv, generator=gen)
    g = -0.1 * torch.rand(n, v_heads, generator=gen)
    beta = torch.rand(n, v_heads, generator=gen)
    return q, k, v, g, beta


def case(n: int, k_heads: int, v_heads: int, dk: int, size: int) -> None:
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    q, k, v, g, beta = inputs(n, k_heads, v_heads, dk, dk)
    wall_rate, cpu_rate = matmul_rates(size)
    wall, cpu = best_of(lambda: delta_rule_map(q, k, g, beta))
    flops = 2 * n * n * dk * v_heads  # every pair's q.k: the dense O(N^2 d) form
    own = n * n * (dk + dk * dk / CHUNK) * v_heads  # the earlier keys' multiply-adds x 2 FLOPs, half the pairs
    kernel, _ = best_of(lambda: torch_chunk_gated_delta_rule(q[None], k[None], v[None], g=g[None], beta=beta[None],
                                                             use_qk_l2norm_in_kernel=True))
    for clock, seconds, rate in (("wall", wall, wall_rate), ("cpu", cpu, cpu_rate)):
        ratio = seconds / (flops / rate)
        print(f"{n:>6} {v_heads:>6} {dk:>4} {clock:>5} {rate / 1e9:>7.1f} {seconds:>8.3f} {flops / rate:>8.3f} "
              f"{ratio:>8.2f} {'met' if ratio <= GOAL else 'NOT met':>8} {2 * ratio:>8.2f} {own / rate:>7.3f} "
              f"{kernel:>9.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    print(f"float32 matmul rate measured before each case, {torch.get_num_threads()} threads, by the wall clock and "
          "by this process's CPU time")
    print("tokens  heads   dk clock  GFLOP/s    map s  limit s  x limit  goal 3x x causal   own s  kernel s")
    if quick:
        case(256, 2, 4, 128, 256)
    else:
        case(2048, 16, 32, 128, 2048)


if __name__ == "__main__":
    main()
