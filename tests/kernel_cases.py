"""Shared by the kernel tests: the parameter grid, seeded inputs, one run of the kernel and the stepper per case
(cached, so test_triton_attention and test_stepper share it), and the GPU-only marker.

Without CUDA every kernel call runs under the Triton interpreter (~8 ms per tile step on this machine), so the
parameter grid is a pairwise covering set rather than the full cross product: 24 cases in which every pair of values
of (N, head dim, BLOCK_M vs BLOCK_N, causal, dtype) occurs at least once (checked by test_cases_cover_every_pair).
"""

from __future__ import annotations

import functools

import pytest
import torch

from attnviz.kernels import INTERPRETED, flash_attention, reference_attention, tiled_steps

TOLERANCE = {"float32": 1e-5, "float16": 1e-2}


DTYPES = {"float32": torch.float32, "float16": torch.float16}


NS, HEAD_DIMS, RELATIONS = (1, 17, 100, 128, 130, 257), (16, 32, 64, 128), ("<", "=", ">")


CASES = [
    (1, 16, 16, 32, False, "float32", 2, 3),
    (1, 32, 16, 16, True, "float32", 1, 1),
    (1, 64, 32, 16, False, "float16", 1, 1),
    (1, 128, 16, 64, True, "float16", 1, 1),
    (17, 16, 32, 32, True, "float16", 2, 3),
    (17, 32, 64, 16, False, "float16", 1, 1),
    (17, 64, 32, 64, True, "float32", 1, 1),
    (17, 128, 64, 64, False, "float32", 1, 1),
    (100, 16, 64, 32, False, "float32", 1, 2),
    (100, 32, 16, 32, True, "float32", 1, 1),
    (100, 64, 16, 16, False, "float16", 1, 1),
    (100, 128, 32, 16, True, "float16", 1, 1),
    (128, 16, 16, 64, True, "float16", 1, 1),
    (128, 32, 32, 32, False, "float16", 1, 1),
    (128, 64, 64, 16, True, "float32", 1, 1),
    (128, 128, 32, 64, False, "float32", 1, 1),
    (130, 16, 64, 64, False, "float32", 1, 1),
    (130, 32, 64, 32, True, "float32", 1, 1),
    (130, 64, 16, 32, False, "float16", 1, 1),
    (130, 128, 16, 16, True, "float16", 1, 1),
    (257, 16, 32, 16, True, "float16", 1, 1),
    (257, 32, 16, 64, False, "float16", 1, 1),
    (257, 64, 32, 32, True, "float32", 1, 1),
    (257, 128, 64, 32, False, "float32", 1, 1),
]


PADDED_CASES = [(100, 48, 32, 16, True, "float32", 1, 1), (33, 80, 16, 32, False, "float16", 1, 2),
                (9, 8, 16, 16, True, "float32", 1, 1)]


ALL_CASES = CASES + PADDED_CASES


def case_id(case):
    n, d, bm, bn, causal, dtype, b, h = case
    return f"N{n}-d{d}-M{bm}-N{bn}-{'causal' if causal else 'full'}-{dtype}-b{b}h{h}"


def inputs(n, d, dtype, batch=1, heads=1, n_key=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    n_key = n if n_key is None else n_key
    q = torch.randn(batch, heads, n, d, generator=g)
    k, v = (torch.randn(batch, heads, n_key, d, generator=g) for _ in range(2))
    return tuple(x.to(DTYPES[dtype]) for x in (q, k, v))


@functools.lru_cache(maxsize=None)
def run_case(case):
    """The kernel's output and trace for one case, the stepper's steps and the float64 reference (run once)."""
    n, d, bm, bn, causal, dtype, batch, heads = case
    q, k, v = inputs(n, d, dtype, batch, heads)
    out, trace = flash_attention(q, k, v, causal=causal, block_m=bm, block_n=bn, trace=True)
    steps = list(tiled_steps(q, k, v, causal=causal, block_m=bm, block_n=bn))
    return out, trace, steps, reference_attention(q, k, v, causal=causal)


def needs_gpu(test):
    """Marks a test as GPU-only: it runs with `pytest -m gpu` on a CUDA machine and is skipped elsewhere."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED,
                                              reason="needs a CUDA GPU")(test))


GPU_DTYPES = [torch.float16, torch.bfloat16, torch.float32]


GPU_TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def gpu_inputs(n, d, dtype, *, n_key=None, batch=2, heads=3, seed=0):
    """Seeded standard-normal q, k, v made on the CPU (so the float64 reference sees the very same values)."""
    g = torch.Generator().manual_seed(seed)
    n_key = n if n_key is None else n_key
    q = torch.randn(batch, heads, n, d, generator=g)
    k, v = (torch.randn(batch, heads, n_key, d, generator=g) for _ in range(2))
    return tuple(x.to(dtype).cuda() for x in (q, k, v))


def gpu_error(out, q, k, v, causal, window=None):
    assert out.is_cuda and out.dtype == q.dtype and out.shape == q.shape
    return (out.double().cpu() - reference_attention(q, k, v, causal=causal, window=window)).abs().max().item()


def keys_read_by_definition(n, block_m, block_n, causal):
    """L, the keys all query blocks read together, from the definition: a query block reads whole key tiles of
    block_n up to the last key its last query may see (every key without the mask), the last tile cut at n."""
    total = 0
    for start in range(0, n, block_m):
        last_seen = min(start + block_m, n) - 1 if causal else n - 1
        total += min(-(-(last_seen + 1) // block_n) * block_n, n)
    return total
