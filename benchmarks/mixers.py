"""The implicit attention map of a Gated DeltaNet layer at 2,048 tokens against the FLOP count of its O(N² d) form.

Goal (issue 38): the map w[head, query, key] of a Gated DeltaNet layer at 2,048 tokens within 3x the time of
2·N²·dk FLOPs per head (every pair's q·k, the dense O(N² d) form) at this machine's measured float32 matmul rate.
The layer is Qwen3-Next-80B-A3B's shape: 16 key heads of 128, 32 value heads (the map has one per value head),
random inputs as the kernel receives them (q, k after the short convolution, beta in (0, 1)), in two decays:
- slow, g in (-0.02, 0]: no key is forgotten within 2,048 tokens, so every earlier key is carried to every query
  (the worst case: the whole N² (dk + dk²/chunk) / 2 of the chunkwise form is done);
- fast, g in (-0.1, 0]: a key's weight falls under 1e-18 after about 800 tokens and from there is 0 and no longer
  carried (delta.py's _bury), so the far keys cost nothing.

It prints, from one run, by the wall clock and by this process's CPU time (all threads' seconds added, which a busy
machine's other work inflates less): the float32 matmul rate (benchmarks/longcontext.py's yardstick, measured before
and after each case, the faster of the two: the harder limit), the seconds of attnviz.mixers.delta_rule_map (best of
8) into fresh memory ("map s") and into a preallocated array (its out argument: "into s"), the limit (2·N²·dk·heads
FLOPs at that rate), both ratios against the goal, and transformers' torch_chunk_gated_delta_rule on the same inputs
(the layer's own output, O(N) work, not its map: the peer that computes the layer), its seconds and the map's
multiple of them. The header gives the thread count and the load average: a shared machine's other work slows the
rate and the map unevenly (the figures mean most at a low load).

Second goal (issue 38): the statistics of every linear layer (distance profile, previous-token and induction scores
on |w|, half-mass distance: attnviz.mixers.stats.record_stats, the map's rows a block at a time) at 8,192 tokens
under 2 GiB peak. Layers are read one after another, so a model's peak is its largest layer's. Each layer runs in a
fresh Python process and reports that process's peak resident memory (VmHWM: everything, torch and the layer's
inputs included; not ru_maxrss, which keeps the parent's size at the fork), the resident memory just before the
statistics (imports and inputs) and the seconds; beside them, what the dense float32 map [head, N, N] alone would
take. Random inputs in the shapes of Qwen3-Next-80B-A3B's Gated DeltaNet (as above, g in (-0.02, 0]) and of a Mamba2
hybrid's SSD layer (Falcon-H1 / Nemotron-H scale: 64 heads, state 128, 1 group; --mamba-heads for more); the text
repeats itself after N / 2 tokens, so the induction score has targets.

    python benchmarks/mixers.py [--threads T] [--part speed] [--part memory]
    python benchmarks/mixers.py --quick     256 tokens for the speed part, 1,024 for the memory part (seconds, not
                                            figures)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from attnviz.mixers.delta import delta_rule_map
from benchmarks.longcontext import matmul_rate

GOAL = 3.0
GOAL_GIB = 2.0


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


def inputs(n: int, k_heads: int, v_heads: int, dk: int, dv: int, decay: float):
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(n, k_heads, dk, generator=gen), torch.randn(n, k_heads, dk, generator=gen)
    v = torch.randn(n, v_heads, dv, generator=gen)
    g = -decay * torch.rand(n, v_heads, generator=gen)
    beta = torch.rand(n, v_heads, generator=gen)
    return q, k, v, g, beta


def case(n: int, k_heads: int, v_heads: int, dk: int, size: int, decay: float) -> None:
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    q, k, v, g, beta = inputs(n, k_heads, v_heads, dk, dk, decay)
    before = matmul_rates(size)
    fresh = best_of(lambda: delta_rule_map(q, k, g, beta), repeats=8)
    out = torch.empty(v_heads, n, n)
    into = best_of(lambda: delta_rule_map(q, k, g, beta, out=out), repeats=8)
    wall_rate, cpu_rate = (max(x, y) for x, y in zip(before, matmul_rates(size)))  # the faster: the harder limit
    kernel = best_of(lambda: torch_chunk_gated_delta_rule(q[None], k[None], v[None], g=g[None], beta=beta[None],
                                                          use_qk_l2norm_in_kernel=True))
    flops = 2 * n * n * dk * v_heads  # every pair's q.k: the dense O(N^2 d) form
    for i, (clock, rate) in enumerate((("wall", wall_rate), ("cpu", cpu_rate))):
        limit = flops / rate
        ratios = [fresh[i] / limit, into[i] / limit]
        verdict = "met" if min(ratios) <= GOAL else "NOT met"
        print(f"{n:>6} {v_heads:>5} {decay:>5} {clock:>5} {rate / 1e9:>7.1f} {limit:>7.3f} {fresh[i]:>7.3f} "
              f"{ratios[0]:>6.2f} {into[i]:>7.3f} {ratios[1]:>6.2f} {verdict:>7} {kernel[i]:>8.3f} "
              f"{into[i] / kernel[i]:>6.2f}")


def _rss_mib(field: str = "VmRSS") -> float:
    """This process's resident memory (VmRSS) or its peak since it started (VmHWM), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _record(kind: str, n: int, heads: int):
    from attnviz.mixers.records import DeltaRuleRecord, SsdRecord

    gen = torch.Generator().manual_seed(0)
    if kind == "delta":
        q, k, _, g, beta = inputs(n, heads // 2, heads, 128, 1, 0.02)
        return DeltaRuleRecord(0, q, k, None, g, beta, True, None)
    dt, A = torch.randn(n, heads, generator=gen) - 3, -torch.rand(heads, generator=gen)
    B, C = (torch.randn(n, 1, 128, generator=gen) for _ in range(2))
    return SsdRecord(0, None, dt, A, B, C, None, None, True, (0.0, float("inf")), None)


def memory_child(kind: str, n: int, heads: int) -> None:
    """One layer's statistics in this process: prints a JSON line {before, peak (MiB), seconds}."""
    from attnviz.mixers.stats import record_stats

    record = _record(kind, n, heads)
    half = torch.randint(0, 50_000, (n - n // 2,), generator=torch.Generator().manual_seed(1))
    tokens = torch.cat([half, half])[:n].tolist()
    before = _rss_mib()
    started = time.perf_counter()
    stats = record_stats(record, tokens)
    seconds = time.perf_counter() - started
    assert stats["distance_profile"].shape == (heads, n)
    peak = _rss_mib("VmHWM")
    print(json.dumps({"before": before, "peak": peak, "seconds": seconds}))


def memory_case(kind: str, label: str, n: int, heads: int, threads: int | None) -> None:
    command = [sys.executable, __file__, "--child", kind, str(n), str(heads)]
    out = subprocess.run(command + (["--threads", str(threads)] if threads else []), capture_output=True,
                         text=True, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    dense, peak = heads * n * n * 4 / 2**30, got["peak"] / 1024
    print(f"{label:<28} {n:>6} {heads:>5} {dense:>9.2f} {got['before'] / 1024:>9.2f} {peak:>9.2f} "
          f"{'met' if peak < GOAL_GIB else 'NOT met':>8} {got['seconds']:>8.1f}")


def speed(quick: bool) -> None:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"float32 matmul rate: the faster of before and after each case; threads: {torch.get_num_threads()}, "
          f"load average {load}; by the wall clock and by this process's CPU time; goal: the map within {GOAL:g}x "
          "the limit")
    print("tokens heads decay clock GFLOP/s limit s   map s x lim  into s x lim    goal kernel s x kern")
    if quick:
        case(256, 2, 4, 128, 256, 0.02)
    else:
        for decay in (0.02, 0.1):
            case(2048, 16, 32, 128, 2048, decay)


def memory(quick: bool, mamba_heads: int, threads: int | None) -> None:
    n = 1024 if quick else 8192
    print("statistics of one linear layer's implicit map, a fresh process per layer; GiB; "
          f"goal: peak < {GOAL_GIB:g} GiB")
    print("layer                        tokens heads dense map    before      peak     goal  seconds")
    memory_case("delta", "Gated DeltaNet (Qwen3-Next)", n, 32, threads)
    memory_case("ssd", "Mamba2 SSD", n, mamba_heads, threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--part", action="append", choices=("speed", "memory"))
    parser.add_argument("--mamba-heads", type=int, default=64)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        memory_child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    parts = args.part or ["speed", "memory"]
    if "memory" in parts:  # first: a child starts from a small parent
        memory(args.quick, args.mamba_heads, args.threads)
    if "speed" in parts:
        speed(args.quick)


if __name__ == "__main__":
    main()
