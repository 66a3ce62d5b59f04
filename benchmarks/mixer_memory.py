"""Peak memory of the statistics of a linear layer's implicit map at 8,192 tokens, against the goal of 2 GiB.

Goal (issue 38): the statistics of every linear layer (distance profile, previous-token and induction scores on |w|,
half-mass distance: attnviz.mixers.stats.record_stats) at 8,192 tokens under 2 GiB peak. Layers are read one after
another, so a model's peak is its largest layer's. Each case runs in a fresh Python process and reports that
process's peak resident memory (ru_maxrss: everything, torch and the layer's inputs included), the resident memory
just before the statistics (imports and inputs), and the seconds; beside them, what the dense float32 map
[head, N, N] alone would take. Random inputs as the kernels receive them, in the layer shapes of:
- Qwen3-Next-80B-A3B's Gated DeltaNet: 16 key heads of 128, 32 value heads of 128;
- a Mamba2 hybrid's SSD layer (Falcon-H1 / Nemotron-H scale): 64 heads of 64, state 128, 1 group (--mamba-heads
  for more).
The text repeats itself after 4,096 tokens, so the induction score has targets.

    python benchmarks/mixer_memory.py
    python benchmarks/mixer_memory.py --quick     1,024 tokens (seconds, not figures)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GOAL_GIB = 2.0


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _record(kind: str, n: int, heads: int):
    import torch

    from attnviz.mixers.records import DeltaRuleRecord, SsdRecord

    gen = torch.Generator().manual_seed(0)
    if kind == "delta":
        q, k = (torch.randn(n, heads // 2, 128, generator=gen) for _ in range(2))
        g, beta = -0.02 * torch.rand(n, heads, generator=gen), torch.rand(n, heads, generator=gen)
        return DeltaRuleRecord(0, q, k, None, g, beta, True, None)
    dt, A = torch.randn(n, heads, generator=gen) - 3, -torch.rand(heads, generator=gen)
    B, C = (torch.randn(n, 1, 128, generator=gen) for _ in range(2))
    return SsdRecord(0, None, dt, A, B, C, None, None, True, (0.0, float("inf")), None)


def child(kind: str, n: int, heads: int) -> None:
    """One case in this process: prints a JSON line {before, peak (MiB), seconds}."""
    import torch

    from attnviz.mixers.stats import record_stats

    record = _record(kind, n, heads)
    half = torch.randint(0, 50_000, (n // 2,), generator=torch.Generator().manual_seed(1))
    tokens = torch.cat([half, half])[:n].tolist()
    before = _rss_mib()
    started = time.perf_counter()
    stats = record_stats(record, tokens)
    seconds = time.perf_counter() - started
    assert stats["distance_profile"].shape == (heads, n)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"before": before, "peak": peak, "seconds": seconds,
                      "induction": float(stats["induction"].mean()), "half_mass": int(stats["half_mass_distance"].max())}))


def case(kind: str, label: str, n: int, heads: int) -> None:
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(n), str(heads)], capture_output=True,
                         text=True, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    dense = heads * n * n * 4 / 2**30
    peak = got["peak"] / 1024
    print(f"{label:<28} {n:>6} {heads:>5} {dense:>9.2f} {got['before'] / 1024:>9.2f} {peak:>9.2f} "
          f"{'met' if peak < GOAL_GIB else 'NOT met':>8} {got['seconds']:>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--mamba-heads", type=int, default=64)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    n = 1024 if args.quick else 8192
    print(f"statistics of one linear layer's implicit map, a fresh process per case; GiB; goal: peak < {GOAL_GIB} GiB")
    print("layer                        tokens heads dense map    before      peak     goal  seconds")
    case("delta", "Gated DeltaNet (Qwen3-Next)", n, 32)
    case("ssd", "Mamba2 SSD", n, args.mamba_heads)


if __name__ == "__main__":
    main()
