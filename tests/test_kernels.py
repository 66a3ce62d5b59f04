"""attnviz.kernels: the Triton kernel, the stepper and the two-pass version against a float64 reference
(attnviz.attention in float64), the kernel's own trace against the stepper, and the kernel's edge cases.

Without CUDA every kernel call here runs under the Triton interpreter (~8 ms per tile step on this machine), so the parameter grid
is a pairwise covering set rather than the full cross product: 24 cases in which every pair of values of
(N, head dim, BLOCK_M vs BLOCK_N, causal, dtype) occurs at least once (checked by test_cases_cover_every_pair).
"""

from __future__ import annotations

import functools
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from attnviz import cost
from attnviz.attention import causal_mask
from attnviz.kernels import (
    INTERPRETED, KERNEL_DEVICE, TILE_FULL, TILE_PARTIAL, TILE_SKIPPED, forward_flops, compare_methods,
    flash_attention, naive_attention, online_attention, peak_cpu_bytes, reference_attention, refusal, tile_map,
    tile_steps, tiled_steps, two_pass_attention,
)
from attnviz.kernels.triton_attention import GPU_LAUNCH_CONFIGS

TOLERANCE = {"float32": 1e-5, "float16": 1e-2}
DTYPES = {"float32": torch.float32, "float16": torch.float16}
NS, HEAD_DIMS, RELATIONS = (1, 17, 100, 128, 130, 257), (16, 32, 64, 128), ("<", "=", ">")

# (n, head_dim, block_m, block_n, causal, dtype, batch, heads)
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
# head dims that are not powers of two (padded inside the kernel), and one under 16
PADDED_CASES = [(100, 48, 32, 16, True, "float32", 1, 1), (33, 80, 16, 32, False, "float16", 1, 2),
                (9, 8, 16, 16, True, "float32", 1, 1)]
ALL_CASES = CASES + PADDED_CASES


def _case_id(case):
    n, d, bm, bn, causal, dtype, b, h = case
    return f"N{n}-d{d}-M{bm}-N{bn}-{'causal' if causal else 'full'}-{dtype}-b{b}h{h}"


def _inputs(n, d, dtype, batch=1, heads=1, n_key=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    n_key = n if n_key is None else n_key
    q = torch.randn(batch, heads, n, d, generator=g)
    k, v = (torch.randn(batch, heads, n_key, d, generator=g) for _ in range(2))
    return tuple(x.to(DTYPES[dtype]) for x in (q, k, v))


@functools.lru_cache(maxsize=None)
def _run(case):
    """The kernel's output and trace for one case, the stepper's steps and the float64 reference (run once)."""
    n, d, bm, bn, causal, dtype, batch, heads = case
    q, k, v = _inputs(n, d, dtype, batch, heads)
    out, trace = flash_attention(q, k, v, causal=causal, block_m=bm, block_n=bn, trace=True)
    steps = list(tiled_steps(q, k, v, causal=causal, block_m=bm, block_n=bn))
    return out, trace, steps, reference_attention(q, k, v, causal=causal)


def test_cases_cover_every_pair():
    values = [NS, HEAD_DIMS, RELATIONS, (False, True), ("float32", "float16")]
    rows = [(n, d, "<" if bm < bn else "=" if bm == bn else ">", causal, dtype)
            for n, d, bm, bn, causal, dtype, _, _ in CASES]
    for a, b in itertools.combinations(range(len(values)), 2):
        seen = {(r[a], r[b]) for r in rows}
        assert seen == set(itertools.product(values[a], values[b])), (a, b)


@pytest.mark.parametrize("case", ALL_CASES, ids=_case_id)
def test_flash_attention_matches_float64_reference(case):
    out, _, _, reference = _run(case)
    assert out.dtype == DTYPES[case[5]] and out.shape == reference.shape
    assert (out.double() - reference).abs().max().item() < TOLERANCE[case[5]]


@pytest.mark.parametrize("case", ALL_CASES, ids=_case_id)
def test_stepper_matches_float64_reference(case):
    n, d, bm, bn, causal, dtype, _, _ = case
    _, _, steps, reference = _run(case)
    out = torch.zeros(reference.shape, dtype=torch.float64)
    for s in steps:
        if s.last:
            out[s.batch, s.head, s.q_start:s.q_stop] = torch.from_numpy(s.out).double()
    assert (out - reference).abs().max().item() < TOLERANCE[dtype]


@pytest.mark.parametrize("case", ALL_CASES, ids=_case_id)
def test_trace_equals_tiled_steps(case):
    _, trace, steps, _ = _run(case)
    ran = ~np.isnan(trace.l_i)  # [batch, head, key_block, query]
    seen = np.zeros_like(ran)
    for s in steps:
        rows = slice(s.q_start, s.q_stop)
        np.testing.assert_allclose(trace.m_i[s.batch, s.head, s.k_block, rows], s.m_i, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(trace.l_i[s.batch, s.head, s.k_block, rows], s.l_i, rtol=1e-5, atol=1e-5)
        seen[s.batch, s.head, s.k_block, rows] = True
    assert np.array_equal(ran, seen), "the kernel and the stepper ran different (query block, key block) steps"


@pytest.mark.parametrize("case", ALL_CASES, ids=_case_id)
def test_running_max_never_decreases_and_running_sum_is_positive(case):
    _, trace, _, _ = _run(case)
    m, l = trace.m_i, trace.l_i  # [batch, head, key_block, query]
    both = ~np.isnan(m[:, :, 1:]) & ~np.isnan(m[:, :, :-1])
    assert np.all(m[:, :, 1:][both] >= m[:, :, :-1][both])
    # in self-attention every query sees key 0 on its first step, and the max term alone adds exp(0) = 1 to l
    assert np.all(l[~np.isnan(l)] >= 1.0 - 1e-6)


def test_every_step_of_the_kernel_appears_in_the_trace_and_skipped_ones_do_not():
    n, bm, bn = 100, 16, 32
    _, trace, _, _ = _run((100, 32, 16, 32, True, "float32", 1, 1))
    codes = tile_map(n, n, block_m=bm, block_n=bn, causal=True)
    for qb, kb in np.ndindex(codes.shape):
        ran = ~np.isnan(trace.l_i[0, 0, kb, qb * bm:(qb + 1) * bm])
        assert ran.all() if codes[qb, kb] != TILE_SKIPPED else not ran.any(), (qb, kb)


def test_no_nan_when_a_whole_tile_row_is_masked():
    n, d, bm, bn = 100, 32, 64, 16
    q, k, v = _inputs(n, d, "float32")
    steps = list(tiled_steps(q, k, v, causal=True, block_m=bm, block_n=bn))
    assert any(np.isneginf(s.scores).all(axis=1).any() for s in steps), "no tile with a fully masked row: vacuous"
    out, trace = flash_attention(q, k, v, causal=True, block_m=bm, block_n=bn, trace=True)
    assert torch.isfinite(out).all()
    ran = ~np.isnan(trace.l_i)
    assert np.isfinite(trace.l_i[ran]).all() and not np.isnan(trace.m_i[ran]).any()
    assert (out.double() - reference_attention(q, k, v, causal=True)).abs().max() < 1e-5


def test_queries_that_see_no_key_get_zero_like_the_reference():
    # causal with more queries than keys: the first n_query - n_key queries see nothing (causal_mask's alignment)
    q, k, v = _inputs(40, 32, "float32", n_key=20)
    assert not causal_mask(40, 20)[:20].any()
    out = flash_attention(q, k, v, causal=True, block_m=16, block_n=16)
    reference = reference_attention(q, k, v, causal=True)
    assert torch.isfinite(out).all() and (out[..., :20, :] == 0).all()
    assert (out.double() - reference).abs().max() < 1e-5
    assert (naive_attention(q, k, v, causal=True).double() - reference).abs().max() < 1e-5


@pytest.mark.parametrize("n_query,n_key", [(40, 70), (70, 40)])
def test_different_query_and_key_lengths(n_query, n_key):
    q, k, v = _inputs(n_query, 16, "float32", n_key=n_key)
    for causal in (False, True):
        reference = reference_attention(q, k, v, causal=causal)
        out = flash_attention(q, k, v, causal=causal, block_m=32, block_n=16)
        assert (out.double() - reference).abs().max() < 1e-5
        stepped = online_attention(q, k, v, causal=causal, block_m=32, block_n=16)
        assert (stepped.double() - reference).abs().max() < 1e-5


def test_unmasked_and_masked_stages_meet_at_every_diagonal_offset():
    # The kernel runs key blocks left of the causal diagonal without masks and the rest with them; the boundary
    # depends on (n_key - n_query) mod BLOCK_N, so every offset from -BLOCK_N to +BLOCK_N is checked.
    n_query, bm, bn = 48, 32, 16
    for n_key in range(n_query - bn, n_query + bn + 1):
        q, k, v = _inputs(n_query, 16, "float32", n_key=n_key, seed=n_key)
        out = flash_attention(q, k, v, causal=True, block_m=bm, block_n=bn)
        assert (out.double() - reference_attention(q, k, v, causal=True)).abs().max() < 1e-5, n_key


@pytest.mark.parametrize("causal", [False, True])
def test_values_all_one_give_output_all_one(causal):
    # each output row is a convex combination of value rows, so V = 1 must give O = 1 whatever the scores
    q, k, _ = _inputs(70, 32, "float32")
    v = torch.ones_like(k)
    out = flash_attention(q * 3, k * 3, v, causal=causal, block_m=32, block_n=16)
    assert torch.allclose(out, torch.ones_like(out), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_logits_scaled_by_100_do_not_overflow(dtype):
    q, k, v = _inputs(70, 32, dtype)
    q = q * 10  # the scores are q k^T / sqrt(d), so q * 10 and k * 10 scale them by 100
    k = k * 10
    scores = (q.double() @ k.double().transpose(-2, -1)) / np.sqrt(32)
    assert torch.isinf(torch.exp(scores.float())).any(), "exp without the max subtraction would not overflow"
    out = flash_attention(q, k, v, causal=True, block_m=16, block_n=32)
    assert torch.isfinite(out).all()
    # softmax(100 s) is nearly one-hot: an error of eps |s| in a score moves weights by ~eps |s|, hence the 1e-4
    tolerance = 1e-4 if dtype == "float32" else 1e-2
    assert (out.double() - reference_attention(q, k, v, causal=True)).abs().max() < tolerance


def test_canary_padding_around_the_output_is_untouched():
    # head dim 48 is padded to 64 and N = 100 to two blocks of 64: unmasked stores would land in the canary
    batch, heads, n, d, bm, bn = 2, 2, 100, 48, 64, 32
    q, k, v = _inputs(n, d, "float32", batch, heads)
    canary = 12345.0
    padded = torch.full((batch, heads, n + 64, d + 32), canary, device=KERNEL_DEVICE)
    out = padded[:, :, :n, :d]
    flash_attention(q, k, v, causal=True, block_m=bm, block_n=bn, out=out)
    outside = torch.ones_like(padded, dtype=torch.bool)
    outside[:, :, :n, :d] = False
    assert (padded[outside] == canary).all()
    assert (out.double().cpu() - reference_attention(q, k, v, causal=True)).abs().max() < 1e-5


@pytest.mark.skipif(not INTERPRETED, reason="the refusal applies only under the Triton interpreter")
def test_bfloat16_is_refused_under_the_interpreter():
    q, k, v = (x.to(torch.bfloat16) for x in _inputs(16, 16, "float32"))
    with pytest.raises(ValueError, match="bfloat16"):
        flash_attention(q, k, v)
    assert "bfloat16" in refusal(64, 64, block_m=16, block_n=16, causal=False, dtype="bfloat16")


def test_bad_inputs_are_refused_with_a_reason():
    q, k, v = _inputs(16, 16, "float32")
    with pytest.raises(ValueError, match="power of two"):
        flash_attention(q, k, v, block_m=24)
    with pytest.raises(ValueError, match="shapes"):
        flash_attention(q, k[..., :8], v)
    with pytest.raises(ValueError, match="dtype"):
        flash_attention(q, k.double(), v)


def test_interpreter_is_chosen_on_import_without_cuda():
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    code = "import torch, attnviz.kernels as k; print(k.INTERPRETED == (not torch.cuda.is_available()))"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.stdout.strip().endswith("True"), result.stderr


def test_kernel_runs_when_torch_imported_triton_before_the_kernels():
    """The app imports attnviz first, then torch and transformers, which may import triton.language (and decorate
    its standard library) long before attnviz.kernels: the interpreter must already be chosen by then."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    code = ("import attnviz, torch\n"
            "from torch.utils.flop_counter import FlopCounterMode\n"
            "import triton.language\n"
            "from attnviz.kernels import flash_attention, naive_attention\n"
            "q = torch.randn(1, 1, 20, 16)\n"
            "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
            "q = q.to(device)\n"
            "err = (flash_attention(q, q, q, block_m=16, block_n=16) - naive_attention(q, q, q)).abs().max().item()\n"
            "print('max error', err)\n")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 0, result.stderr[-2000:]
    assert float(result.stdout.split()[-1]) < 1e-5


@pytest.mark.parametrize("causal", [False, True])
def test_naive_and_two_pass_match_float64_reference(causal):
    q, k, v = _inputs(75, 32, "float32")
    reference = reference_attention(q, k, v, causal=causal)
    assert (naive_attention(q, k, v, causal=causal).double() - reference).abs().max() < 1e-5
    tiled = two_pass_attention(q, k, v, causal=causal, block_m=32, block_n=16)
    assert (tiled.double() - reference).abs().max() < 1e-5
    # against torch's own implementation too
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert torch.allclose(naive_attention(q, k, v, causal=causal), sdpa, atol=1e-5)


@pytest.mark.parametrize("n,bm,bn", [(100, 16, 32), (64, 32, 16), (37, 16, 16)])
def test_tile_map_agrees_with_the_causal_mask(n, bm, bn):
    codes = tile_map(n, n, block_m=bm, block_n=bn, causal=True)
    visible = causal_mask(n)
    for qb, kb in np.ndindex(codes.shape):
        tile = visible[qb * bm:(qb + 1) * bm, kb * bn:(kb + 1) * bn]
        expected = TILE_SKIPPED if not tile.any() else TILE_FULL if tile.all() else TILE_PARTIAL
        assert codes[qb, kb] == expected, (qb, kb)
    assert tile_steps(n, n, block_m=bm, block_n=bn, causal=True) == int((codes != TILE_SKIPPED).sum())


def test_step_counters_add_up_to_the_whole_computation():
    n, d, bm, bn = 70, 16, 32, 16
    q, k, v = _inputs(n, d, "float16")
    steps = list(tiled_steps(q, k, v, block_m=bm, block_n=bn))
    assert len(steps) == tile_steps(n, n, block_m=bm, block_n=bn, causal=False) == 3 * 5
    # for one head, attnviz.cost's attention term with d_model = d is the same 4 N^2 d
    assert sum(s.flops for s in steps) == forward_flops(n, n, d)
    assert forward_flops(n, n, d) == cost.attention_flops(seq_len=n, d_model=d)["attention"]
    assert forward_flops(n, n, d, causal=True) == cost.attention_flops(seq_len=n, d_model=d, causal=True)["attention"]
    # Q read once, K and V once per query block (3 blocks), O written once; 2 bytes a value
    assert sum(s.bytes_loaded for s in steps) == (n * d + 3 * 2 * n * d) * 2
    assert sum(s.bytes_stored for s in steps) == n * d * 2
    assert [s.index for s in steps] == list(range(len(steps)))


def test_alpha_rescales_the_previous_state():
    q, k, v = _inputs(40, 16, "float32")
    previous = None
    for s in tiled_steps(q, k, v, block_m=32, block_n=16):
        if not s.first:
            np.testing.assert_allclose(s.m_prev, previous.m_i)
            np.testing.assert_allclose(s.acc_rescaled, previous.acc * np.exp(previous.m_i - s.m_i)[:, None],
                                       rtol=1e-6)
        previous = s


def test_peak_cpu_bytes_measures_a_known_allocation():
    def hold_one_mebibyte():
        x = torch.ones(1 << 18)  # 2^18 float32 = 1 MiB
        return float(x.max())

    peak = peak_cpu_bytes(hold_one_mebibyte)
    assert (1 << 20) <= peak < (1 << 20) + (1 << 16)


def test_naive_holds_the_square_matrix_and_tiled_does_not():
    q, k, v = _inputs(512, 32, "float32")
    naive = peak_cpu_bytes(lambda: naive_attention(q, k, v))
    tiled = peak_cpu_bytes(lambda: two_pass_attention(q, k, v, block_m=64, block_n=64))
    assert naive >= 512 * 512 * 4  # at least one float32 [N, N] matrix
    assert tiled < naive / 4


def test_compare_methods_checks_every_method():
    results = compare_methods(48, 16, block_m=16, block_n=16, causal=True, repeats=1)
    assert [r.method for r in results] == ["naive", "torch SDPA", "two-pass tiled", "online softmax (stepper)",
                                           "fused Triton kernel"]
    assert all(r.error < 1e-5 and r.seconds > 0 for r in results)
    if INTERPRETED:
        assert "not a speed" in results[-1].note


def test_refusal_accepts_the_default_and_refuses_slow_sizes():
    assert refusal(64, 64, block_m=16, block_n=16, causal=False, dtype="float32") is None
    assert refusal(100_000, 64, block_m=16, block_n=16, causal=False, dtype="float32") is not None
    if INTERPRETED:
        assert "interpreter" in refusal(2048, 64, block_m=16, block_n=16, causal=False, dtype="float32")


H100_SHARED = 227 * 1024  # bytes per block, opt-in, from NVIDIA's H100 tuning guide


def test_refusal_refuses_blocks_that_need_more_shared_memory_than_the_gpu_has():
    # by hand: 3 pipeline stages x (K tile + V tile) x 128 keys x 128 dims x 4 bytes = 393,216 B > 232,448 B
    # (Triton's own sm_90 compile of this kernel reports exactly 393,216 B of shared memory for this case)
    reason = refusal(256, 128, block_m=128, block_n=128, causal=True, dtype="float32", interpreted=False,
                     shared_memory_bytes=H100_SHARED)
    assert reason is not None and "shared memory" in reason and "384 KiB" in reason and "227 KiB" in reason
    # 3 x 2 x 64 x 128 x 4 = 196,608 B fits; float16 halves the tile but adds the Q tile on Hopper:
    # 3 x 2 x 128 x 128 x 2 + 128 x 128 x 2 = 229,376 B, just fits
    assert refusal(256, 128, block_m=128, block_n=64, causal=True, dtype="float32", interpreted=False,
                   shared_memory_bytes=H100_SHARED) is None
    assert refusal(256, 128, block_m=128, block_n=128, causal=True, dtype="float16", interpreted=False,
                   shared_memory_bytes=H100_SHARED) is None
    # head dim 100 is padded to 128 inside the kernel, so it costs what 128 costs
    assert refusal(256, 100, block_m=16, block_n=128, causal=False, dtype="float32", interpreted=False,
                   shared_memory_bytes=H100_SHARED) is not None
    # the interpreter has no shared memory: the same size is not refused for it there
    assert refusal(256, 128, block_m=128, block_n=128, causal=True, dtype="float32", interpreted=True) is None


def test_interpreter_budget_counts_the_tile_size_not_just_the_steps():
    # 2048 / 128 = 16 query blocks x 16 key blocks = 256 steps (full mask). By hand, at 8 ms a step plus 14 ns per
    # 128 x 128 x 128 element: 256 x (0.008 + 14e-9 x 2,097,152) = 256 x 0.03736 = 9.56 s, over the 5 s budget
    reason = refusal(2048, 128, block_m=128, block_n=128, causal=False, dtype="float32", interpreted=True)
    assert reason is not None and "about 10 s" in reason and "interpreter" in reason
    # the same 256 steps with d = 16: 256 x (0.008 + 14e-9 x 262,144) = 256 x 0.01167 = 2.99 s, allowed
    assert refusal(2048, 16, block_m=128, block_n=128, causal=False, dtype="float32", interpreted=True) is None
    # 16 x 16 tiles, d = 16, N = 512: 32 x 32 = 1024 steps x (0.008 + 14e-9 x 4096) = 8.25 s, refused
    assert "about 8 s" in refusal(512, 16, block_m=16, block_n=16, causal=False, dtype="float32", interpreted=True)


def test_kernel_page_shows_an_error_when_the_kernel_refuses(monkeypatch):
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    import attnviz.kernels as kn

    def refuse(*args, **kwargs):
        raise ValueError("BLOCK_M = 128, BLOCK_N = 128 with head dim 128 need more shared memory than this GPU has")

    monkeypatch.setattr(kn, "flash_attention", refuse)
    st.cache_resource.clear()
    st.cache_data.clear()
    from attnviz.ui import PAGES

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    page = os.path.join(root, next(p.script for p in PAGES if p.url_path == "kernel"))
    at = AppTest.from_file(page, default_timeout=120)
    at.run()
    st.cache_resource.clear()
    assert not at.exception, at.exception
    assert any("shared memory" in e.value and "smaller BLOCK_N" in e.value for e in at.error)


def test_kernel_page_measures_memory_once_per_head_dim_not_per_n(monkeypatch):
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    import attnviz.kernels as kn
    from attnviz.ui import PAGES

    scans = []
    real_scan = kn.peak_memory_scan
    monkeypatch.setattr(kn, "peak_memory_scan", lambda *a, **k: scans.append(a) or real_scan(*a, **k))
    st.cache_data.clear()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    at = AppTest.from_file(os.path.join(root, next(p.script for p in PAGES if p.url_path == "kernel")),
                           default_timeout=180)
    at.run()
    at.toggle(key="kernel_memory").set_value(True).run()
    assert not at.exception, at.exception
    n = at.slider(key="kernel_n").value
    naive = next(m for m in at.metric if m.label.startswith("naive"))
    # naive holds at least the float32 [N, N] score matrix
    assert float(naive.value.split()[0].replace(",", "")) * 2**20 >= n * n * 4 * 0.99
    at.slider(key="kernel_n").set_value(n + 1).run()
    assert not at.exception, at.exception
    assert f"N = {n + 1}" in " ".join(m.label for m in at.metric)
    assert len(scans) == 1, "the scan over N was measured again when only N moved"
    st.cache_data.clear()


COMPILE_FOR_GPU = """
import os, sys
os.environ["TRITON_INTERPRET"] = "0"
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attnviz.kernels import triton_attention as ta
from attnviz.kernels.timing import shared_memory_estimate
fn = ta._attn_fwd
CONSTEXPRS = ("HEAD_DIM", "D_PAD", "BLOCK_M", "BLOCK_N", "CAUSAL", "TRACE", "PRECISION")
# What Triton's launcher specialises for contiguous [b, h, n, d] tensors: an integer argument equal to 1 becomes a
# constant, pointers and integers that are multiples of 16 are marked so; without it loads cannot be vectorised
UNIT_STRIDES = {"stride_qk": 1, "stride_kk": 1, "stride_vk": 1, "stride_ok": 1}
ALIGNED = [p for p in fn.arg_names if p in ("Q", "K", "V", "Out", "TraceM", "TraceL")
           or (p.startswith("stride") and p not in UNIT_STRIDES)]
for dtype, d, block_m, block_n, causal, trace, precision in [
        ("fp16", 64, 128, 64, True, False, "tf32"), ("fp16", 64, 128, 64, False, False, "tf32"),
        ("fp32", 48, 64, 32, False, True, "ieee"), ("bf16", 128, 128, 64, True, False, "tf32")]:
    values = dict(zip(CONSTEXPRS, (d, triton.next_power_of_2(d), block_m, block_n, causal, trace, precision)))
    values.update(UNIT_STRIDES)
    signature = {p: "*" + dtype if p in ("Q", "K", "V", "Out") else "*fp32" if p.startswith("Trace")
                 else "fp32" if p == "sm_scale" else "constexpr" if p in values else "i32" for p in fn.arg_names}
    source = ASTSource(fn=fn, signature=signature,
                       constexprs={(fn.arg_names.index(k),): v for k, v in values.items()},
                       attrs={(fn.arg_names.index(p),): [["tt.divisibility", 16]] for p in ALIGNED})
    for arch in (80, 90) if dtype == "fp16" else (90,):
        kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                                options={"num_warps": 4, "num_stages": ta.NUM_STAGES})
        ptx = kernel.asm["ptx"]
        assert kernel.asm["cubin"], (dtype, arch)
        if dtype == "fp16":
            # tensor cores (mma.sync on Ampere, warp-group wgmma on Hopper) and K/V tiles copied to shared memory
            # asynchronously, ahead of use (software pipelining): without them the kernel is several times slower
            assert ("wgmma.mma_async" if arch == 90 else "mma.sync") in ptx, (dtype, arch, causal)
            assert "cp.async" in ptx, (dtype, arch, causal)
        if arch == 90 and dtype != "fp32":
            # the page's shared-memory check uses this estimate; Triton's compile is the independent figure
            estimate = shared_memory_estimate(d, block_n=block_n, block_m=block_m,
                                              dtype="float16" if dtype == "fp16" else "bfloat16")
            assert kernel.metadata.shared == estimate, (dtype, d, block_m, block_n, kernel.metadata.shared, estimate)
print("compiled")
"""


def test_the_same_kernel_compiles_for_cuda_gpus_with_tensor_cores_and_pipelined_loads():
    # Triton compiles ahead of time for a named target (sm_80, sm_90) with its bundled ptxas: no GPU needed
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", COMPILE_FOR_GPU], capture_output=True, text=True, timeout=300,
                            cwd=root, env={**os.environ, "PYTHONPATH": root, "TRITON_DEFAULT_FP_FUSION": "1"})
    assert result.stdout.strip().endswith("compiled"), result.stderr[-3000:]


def needs_gpu(test):
    """Marks a test as GPU-only: it runs with `pytest -m gpu` on a CUDA machine and is skipped elsewhere."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED,
                                              reason="needs a CUDA GPU")(test))


GPU_DTYPES = [torch.float16, torch.bfloat16, torch.float32]
GPU_TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def _gpu_inputs(n, d, dtype, *, n_key=None, batch=2, heads=3, seed=0):
    """Seeded standard-normal q, k, v made on the CPU (so the float64 reference sees the very same values)."""
    g = torch.Generator().manual_seed(seed)
    n_key = n if n_key is None else n_key
    q = torch.randn(batch, heads, n, d, generator=g)
    k, v = (torch.randn(batch, heads, n_key, d, generator=g) for _ in range(2))
    return tuple(x.to(dtype).cuda() for x in (q, k, v))


def _gpu_error(out, q, k, v, causal):
    assert out.is_cuda and out.dtype == q.dtype and out.shape == q.shape
    return (out.double().cpu() - reference_attention(q, k, v, causal=causal)).abs().max().item()


@needs_gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [16, 24, 48, 64, 80, 128])
def test_gpu_kernel_matches_float64_at_ragged_sizes_and_every_head_dim(d, causal, dtype):
    # float32 takes smaller blocks: its K/V tiles are twice as large in shared memory
    blocks = [(128, 64), (64, 32), (16, 128)] if dtype != torch.float32 else [(64, 32), (32, 64)]
    for n in (1, 17, 100, 257, 1000, 1031):
        q, k, v = _gpu_inputs(n, d, dtype, seed=n)
        for block_m, block_n in blocks:
            error = _gpu_error(flash_attention(q, k, v, causal=causal, block_m=block_m, block_n=block_n), q, k, v,
                               causal)
            assert error < GPU_TOLERANCE[dtype], (n, block_m, block_n, error)


@needs_gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
def test_gpu_unmasked_and_masked_stages_meet_at_every_diagonal_offset(dtype):
    # the compiled kernel's stage boundary at every (n_key - n_query) from -BLOCK_N to +BLOCK_N, with the
    # benchmark's block shape (BLOCK_M = 2 BLOCK_N) and more keys than queries and fewer
    n_query, (bm, bn) = 200, ((128, 64) if dtype != torch.float32 else (64, 32))
    for n_key in range(n_query - bn, n_query + bn + 1):
        q, k, v = _gpu_inputs(n_query, 64, dtype, n_key=n_key, batch=1, heads=2, seed=n_key)
        error = _gpu_error(flash_attention(q, k, v, causal=True, block_m=bm, block_n=bn), q, k, v, True)
        assert error < GPU_TOLERANCE[dtype], (n_key, error)


@needs_gpu
@pytest.mark.parametrize("config", GPU_LAUNCH_CONFIGS, ids=lambda c: "{}x{}-w{}-s{}".format(*c))
def test_gpu_every_benchmarked_launch_config_is_correct(config):
    # the benchmark reports the fastest of these configs: each must compute the right thing, at d = 64 and 128
    bm, bn, warps, stages = config
    for d, causal, dtype in itertools.product((64, 128), (False, True), (torch.float16, torch.bfloat16)):
        q, k, v = _gpu_inputs(1000, d, dtype, seed=d)
        try:
            out = flash_attention(q, k, v, causal=causal, block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)
        except ValueError as exc:  # refused for want of shared memory: the benchmark skips it too
            assert "shared memory" in str(exc)
            continue
        assert _gpu_error(out, q, k, v, causal) < GPU_TOLERANCE[dtype], (d, causal, dtype)


@needs_gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
def test_gpu_canary_padding_around_the_output_is_untouched(dtype):
    # head dim 48 is padded to 64 and N = 300 to three blocks of 128: an unmasked store would land in the canary
    batch, heads, n, d = 2, 3, 300, 48
    bm, bn = (128, 64) if dtype != torch.float32 else (64, 32)
    q, k, v = _gpu_inputs(n, d, dtype, batch=batch, heads=heads)
    canary = 1234.0  # exactly representable in every dtype here
    padded = torch.full((batch, heads, n + 128, d + 48), canary, dtype=dtype, device="cuda")
    out = padded[:, :, 64:64 + n, 16:16 + d]  # canary before and after, in both dimensions
    for causal in (False, True):
        flash_attention(q, k, v, causal=causal, block_m=bm, block_n=bn, out=out)
        outside = torch.ones_like(padded, dtype=torch.bool)
        outside[:, :, 64:64 + n, 16:16 + d] = False
        assert (padded[outside] == canary).all()
        assert _gpu_error(out, q, k, v, causal) < GPU_TOLERANCE[dtype]


@needs_gpu
def test_gpu_trace_equals_the_stepper_and_large_logits_stay_finite():
    q, k, v = _gpu_inputs(300, 64, torch.float32, batch=1, heads=2)
    out, trace = flash_attention(q, k, v, causal=True, block_m=64, block_n=32, trace=True)
    seen = np.zeros_like(~np.isnan(trace.l_i))
    for s in tiled_steps(q, k, v, causal=True, block_m=64, block_n=32):
        rows = slice(s.q_start, s.q_stop)
        np.testing.assert_allclose(trace.m_i[s.batch, s.head, s.k_block, rows], s.m_i, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(trace.l_i[s.batch, s.head, s.k_block, rows], s.l_i, rtol=1e-5, atol=1e-5)
        seen[s.batch, s.head, s.k_block, rows] = True
    assert np.array_equal(~np.isnan(trace.l_i), seen)
    q, k = q.half() * 10, k.half() * 10  # scores x 100: exp without subtracting the max would overflow
    v = v.half()
    out = flash_attention(q, k, v, causal=True, block_m=128, block_n=64)
    assert torch.isfinite(out).all() and _gpu_error(out, q, k, v, True) < 1e-2


@needs_gpu
def test_gpu_compare_methods_reports_tflops_on_the_device():
    results = compare_methods(512, 64, block_m=128, block_n=64, causal=True, dtype="float16", repeats=3)
    assert all(r.error < 1e-2 for r in results), [(r.method, r.error) for r in results]
    kernel = results[-1]
    assert "TFLOPS on" in kernel.note and torch.cuda.get_device_name() in kernel.note


def test_one_cpu_thread_restores_the_count_when_sessions_overlap():
    import threading

    from attnviz.kernels.timing import one_cpu_thread

    original = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
        seen = {}

        def session_a():  # enters first, leaves first, while b is still inside
            with one_cpu_thread():
                a_in.set()
                b_in.wait(5)
                seen["a"] = torch.get_num_threads()
            a_out.set()

        def session_b():  # enters second (after a set 1 thread), leaves last
            a_in.wait(5)
            with one_cpu_thread():
                b_in.set()
                a_out.wait(5)
                seen["b after a left"] = torch.get_num_threads()

        threads = [threading.Thread(target=session_a), threading.Thread(target=session_b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert seen == {"a": 1, "b after a left": 1}
        # without a shared count, b would have saved "1" on entry and left the process at one thread
        assert torch.get_num_threads() == 2
        # an exception inside still restores it
        with pytest.raises(RuntimeError), one_cpu_thread():
            raise RuntimeError
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(original)


def test_measure_times_warm_calls_only_and_keeps_the_first_output(monkeypatch):
    import time

    from attnviz.kernels import timing

    syncs = []
    monkeypatch.setattr(timing, "_sync", lambda: syncs.append(1))
    calls = []

    def cold_then_warm():  # the first call is a slow "compile", later calls are fast
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.3)
            return "first"
        return "later"

    seconds, out = timing.measure(cold_then_warm, repeats=3)
    assert out == "first"  # the warm-up's output is the one checked
    assert seconds < 0.1  # the 0.3 s cold call is not the time
    assert len(calls) == 1 + 1 + 3  # warm-up, one warm probe, then a median of 3
    assert len(syncs) == 2 * 4  # synchronised before and after each of the 4 timed calls

    slow_calls = []
    seconds, _ = timing.measure(lambda: slow_calls.append(time.sleep(0.25)), repeats=3)
    assert seconds >= 0.25 and len(slow_calls) == 2  # a slow warm call is timed once, after the warm-up


@pytest.mark.parametrize("name,dtype,peak", [
    ("NVIDIA L4", "float16", 121.0),  # L4 data sheet: 242 TFLOPS FP16 with sparsity
    ("NVIDIA L40S", "float16", 362.05),  # not the L4's: 733 with sparsity
    ("NVIDIA L40S", "float32", 91.6),
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989.4),  # SXM: 1,979 with sparsity
    ("NVIDIA H100 PCIe", "float16", 756.0),  # 1,513 with sparsity
    ("NVIDIA H100 NVL", "float32", 60.0),  # not the SXM's 67
    ("NVIDIA H200", "float32", 66.9),
    ("NVIDIA A100-SXM4-80GB", "float32", 19.5),  # a hyphen ends the word
    ("NVIDIA GH200 480GB", "float16", None),  # not an H200 by substring
    ("NVIDIA GeForce RTX 4090", "float16", None),
])
def test_device_peak_tflops_matches_whole_names_longest_first(name, dtype, peak):
    from attnviz.kernels import device_peak_tflops

    assert device_peak_tflops(name, dtype) == peak


def test_naive_traffic_by_hand_and_by_the_tensors_naive_attention_makes():
    from attnviz.kernels import naive_traffic

    # Unfused naive attention: S = Q K^T reads Q, K and writes S; softmax reads S and writes P; P V reads P, V and
    # writes O. By hand for N_q = 3, N_k = 5, d = 4, 2-byte values: reads 24 (Q) + 40 (K) + 30 (S) + 30 (P) + 40 (V)
    # = 164 B = (N_q + 2 N_k) d b + 2 N_q N_k b; writes 30 (S) + 30 (P) + 24 (O) = 84 B = N_q d b + 2 N_q N_k b.
    assert naive_traffic(3, 5, 4, 2) == {"read": 164, "written": 84}
    # the same from the nbytes of the tensors each step of naive attention reads and writes
    q, k, v = torch.randn(1, 1, 37, 16), torch.randn(1, 1, 53, 16), torch.randn(1, 1, 53, 16)
    s = q @ k.transpose(-2, -1)
    p = torch.softmax(s, dim=-1)
    o = p @ v
    reads = q.nbytes + k.nbytes + s.nbytes + p.nbytes + v.nbytes
    writes = s.nbytes + p.nbytes + o.nbytes
    assert naive_traffic(37, 53, 16, 4) == {"read": reads, "written": writes}


@needs_gpu
def test_gpu_kernel_page_shows_gpu_timings_with_the_device_name():
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from attnviz.ui import PAGES

    st.cache_data.clear()
    st.cache_resource.clear()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    at = AppTest.from_file(os.path.join(root, next(p.script for p in PAGES if p.url_path == "kernel")),
                           default_timeout=300)
    at.run()
    at.slider(key="kernel_n").set_value(1024)
    at.select_slider(key="kernel_d").set_value(64)
    at.select_slider(key="kernel_block_m").set_value(128)
    at.select_slider(key="kernel_block_n").set_value(64)
    at.selectbox(key="kernel_dtype").set_value("bfloat16")
    at.run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    table = at.dataframe[0].value
    kernel = table[table["method"] == "fused Triton kernel"].iloc[0]
    assert float(kernel["max |O − O_float64|"]) < 3e-2
    assert "TFLOPS on " + torch.cuda.get_device_name() in kernel["how to read the time"]
    assert not any("interpreter" in i.value for i in at.info)
    st.cache_data.clear()
    st.cache_resource.clear()
