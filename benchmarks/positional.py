"""Positional-encoding benchmark, ratios measured in this one run (the machine may be shared and noisy):

The ALiBi theory curve of the "Measured on models" section, mean attention weight against distance with position
alone, computed two ways for 16 heads at 1500 tokens (the page's longest text on a byte-level model):
  pattern: build the [head, query, key] softmax(ALiBi bias) patterns, then average their diagonals
           (attention_by_distance(alibi_pattern(...)));
  closed:  the geometric-series closed form (alibi_by_distance), which never builds an n x n array.
Both must agree to 1e-12; the ratios are of median wall time and of peak traced memory (tracemalloc).

Run: python benchmarks/positional.py
     python benchmarks/positional.py --quick    4 heads x 64 tokens, one repeat
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attnviz.distance import attention_by_distance
from attnviz.positional import alibi_by_distance, alibi_pattern

HEADS, N, REPEATS = 16, 1500, 5


def by_pattern(heads: int = HEADS, n: int = N) -> np.ndarray:
    return attention_by_distance(alibi_pattern(heads, n))


def closed_form(heads: int = HEADS, n: int = N) -> np.ndarray:
    return alibi_by_distance(heads, n)


def median_seconds(fn, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def peak_bytes(fn) -> int:
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the smallest case: 4 heads x 64 tokens, one repeat")
    args = parser.parse_args()
    heads, n, repeats = (4, 64, 1) if args.quick else (HEADS, N, REPEATS)
    pattern, closed = (lambda: by_pattern(heads, n)), (lambda: closed_form(heads, n))
    gap = float(np.abs(pattern() - closed()).max())
    assert gap < 1e-12, gap
    t_pattern, t_closed = median_seconds(pattern, repeats), median_seconds(closed, repeats)
    m_pattern, m_closed = peak_bytes(pattern), peak_bytes(closed)
    print(f"ALiBi position-only attention against distance, {heads} heads x {n} tokens (max difference {gap:.1e})")
    print(f"  time   pattern {t_pattern * 1e3:8.1f} ms   closed form {t_closed * 1e3:6.2f} ms   "
          f"ratio {t_pattern / t_closed:6.0f}x")
    print(f"  memory pattern {m_pattern / 2**20:8.1f} MiB  closed form {m_closed / 2**20:6.2f} MiB  "
          f"ratio {m_pattern / m_closed:6.0f}x")


if __name__ == "__main__":
    main()
