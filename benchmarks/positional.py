"""Positional-encoding benchmark, ratios measured in this one run (the machine may be shared and noisy):

The ALiBi theory curve of the "Measured on models" section, mean attention weight against distance with position
alone, computed two ways for 16 heads at 1500 tokens (the page's longest text on a byte-level model):
  pattern: build the [head, query, key] softmax(ALiBi bias) patterns, then average their diagonals
           (attention_by_distance(alibi_pattern(...)));
  closed:  the geometric-series closed form (alibi_by_distance), which never builds an n x n array.
Both must agree to 1e-12; the ratios are of median wall time and of peak traced memory (tracemalloc).

Run: python benchmarks/positional.py
"""

from __future__ import annotations

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


def by_pattern() -> np.ndarray:
    return attention_by_distance(alibi_pattern(HEADS, N))


def closed_form() -> np.ndarray:
    return alibi_by_distance(HEADS, N)


def median_seconds(fn) -> float:
    times = []
    for _ in range(REPEATS):
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
    gap = float(np.abs(by_pattern() - closed_form()).max())
    assert gap < 1e-12, gap
    t_pattern, t_closed = median_seconds(by_pattern), median_seconds(closed_form)
    m_pattern, m_closed = peak_bytes(by_pattern), peak_bytes(closed_form)
    print(f"ALiBi position-only attention against distance, {HEADS} heads x {N} tokens "
          f"(max difference {gap:.1e})")
    print(f"  time   pattern {t_pattern * 1e3:8.1f} ms   closed form {t_closed * 1e3:6.2f} ms   "
          f"ratio {t_pattern / t_closed:6.0f}x")
    print(f"  memory pattern {m_pattern / 2**20:8.1f} MiB  closed form {m_closed / 2**20:6.2f} MiB  "
          f"ratio {m_pattern / m_closed:6.0f}x")


if __name__ == "__main__":
    main()
