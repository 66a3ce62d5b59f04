"""Softmax-page benchmarks, each a ratio measured in this one run (the machine may be shared and noisy):

1. per-row Jacobian norm: the Frobenius closed form the page shows against the spectral norm by eigendecomposition,
   256 rows of n keys (why the page shows the Frobenius norm).
2. the gradient reaching q for 256 queries, 512 keys, d_k = 1024: chain rule (used by the d_k sweep) against
   torch.autograd through scaled_dot_product_attention (used for the per-row demonstration).
3. the whole d_k sweep behind the page's curves (20 values of d_k, 256 queries, both variants): seconds, the wait
   after changing the number of keys, the seed or the temperature (changing d_k alone reuses the cached sweep).

Each timing is the median of alternating repeats. Run: python benchmarks/softmax.py
(--quick: the smallest case of each, 8 keys, d_k = 16, one repeat)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attnviz import softmax as sm

ROWS = 256


def median_times(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds per call of each function, calls alternating so that load changes hit all alike."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def jacobian_norms(n: int, repeats: int | None = None) -> tuple[float, float]:
    p = sm.softmax(np.random.default_rng(0).standard_normal((ROWS, n)) * 3)
    fro, spectral = sm.jacobian_norm(p), sm.jacobian_norm(p, ord="spectral")
    assert np.all(spectral <= fro + 1e-12) and np.all(fro <= np.sqrt(n - 1) * spectral + 1e-12)
    t = median_times({"fro": lambda: sm.jacobian_norm(p), "spectral": lambda: sm.jacobian_norm(p, ord="spectral")},
                     repeats=repeats or (5 if n <= 32 else 3))
    return t["fro"], t["spectral"]


def gradients(n_keys: int = 512, d_k: int = 1024, repeats: int = 7) -> tuple[float, float]:
    q, k = sm.random_qk(ROWS, n_keys, d_k, seed=0)
    rng = np.random.default_rng(2)
    v, g = rng.standard_normal((n_keys, 16)), rng.standard_normal((ROWS, 16))
    scale = 1 / np.sqrt(d_k)
    np.testing.assert_allclose(sm.query_gradient_chain_rule(q, k, v, g, scale=scale),
                               sm.query_gradient(q, k, v, g, scale=scale), rtol=1e-8, atol=1e-12)
    t = median_times({"chain": lambda: sm.query_gradient_chain_rule(q, k, v, g, scale=scale),
                      "autograd": lambda: sm.query_gradient(q, k, v, g, scale=scale)}, repeats=repeats)
    return t["chain"], t["autograd"]


def sweep_seconds(n_keys: int, repeats: int = 3) -> float:
    dims = sm.log_spaced_dims(1, 1024, per_octave=2)
    return median_times({"sweep": lambda: sm.saturation_sweep(dims, n_queries=ROWS, n_keys=n_keys, seed=0)},
                        repeats=repeats)["sweep"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the smallest case of each, one repeat")
    args = parser.parse_args()
    keys, (n_keys, d_k), sweep_keys, repeats = (((8,), (32, 16), (32,), 1) if args.quick
                                                else ((8, 32, 128), (512, 1024), (32, 512), None))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; medians of alternating repeats, one run")
    print(f"\n1. per-row softmax Jacobian norm, {ROWS} rows")
    for n in keys:
        fro, spectral = jacobian_norms(n, repeats)
        print(f"   n = {n:4d} keys: Frobenius closed form {fro * 1e3:8.3f} ms, spectral (eigvalsh) "
              f"{spectral * 1e3:9.1f} ms, spectral / Frobenius = {spectral / fro:8.0f}x")
    chain, auto = gradients(n_keys, d_k, repeats or 7)
    print(f"\n2. gradient reaching q, {ROWS} queries x {n_keys} keys, d_k = {d_k}: chain rule {chain * 1e3:.1f} ms, "
          f"autograd {auto * 1e3:.1f} ms, autograd / chain rule = {auto / chain:.2f}x")
    print(f"\n3. the page's d_k sweep (20 values of d_k, {ROWS} queries, scaled and unscaled)")
    for n in sweep_keys:
        print(f"   n = {n:4d} keys: {sweep_seconds(n, repeats or 3):.2f} s")


if __name__ == "__main__":
    main()
