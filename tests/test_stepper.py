"""attnviz.kernels.stepper: the torch stepper against the float64 reference, its state against the kernel's own
trace step by step (which steps ran, in which stage, with which m_i and l_i), and its per-step counters."""

from __future__ import annotations

import ast
import inspect
import textwrap

import numpy as np
import pytest
import torch

from attnviz import cost
from attnviz.kernels import (
    TILE_SKIPPED, flash_attention, forward_flops, tile_map, tile_steps, tiled_steps,
)
from attnviz.kernels import stepper
from attnviz.kernels import triton_attention as ta
from tests.kernel_cases import ALL_CASES, TOLERANCE, case_id, gpu_error, gpu_inputs, inputs, needs_gpu, run_case


@pytest.mark.parametrize("case", ALL_CASES, ids=case_id)
def test_stepper_matches_float64_reference(case):
    n, d, bm, bn, causal, dtype, _, _ = case
    _, _, steps, reference = run_case(case)
    out = torch.zeros(reference.shape, dtype=torch.float64)
    for s in steps:
        if s.last:
            out[s.batch, s.head, s.q_start:s.q_stop] = torch.from_numpy(s.out).double()
    assert (out - reference).abs().max().item() < TOLERANCE[dtype]


@pytest.mark.parametrize("case", ALL_CASES, ids=case_id)
def test_trace_equals_tiled_steps(case):
    _, trace, steps, _ = run_case(case)
    ran = ~np.isnan(trace.l_i)  # [batch, head, key_block, query]
    seen = np.zeros_like(ran)
    for s in steps:
        rows = slice(s.q_start, s.q_stop)
        np.testing.assert_allclose(trace.m_i[s.batch, s.head, s.k_block, rows], s.m_i, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(trace.l_i[s.batch, s.head, s.k_block, rows], s.l_i, rtol=1e-5, atol=1e-5)
        # and in the same stage: 1 without masks, 2 masked
        assert (trace.stage[s.batch, s.head, s.k_block, rows] == (2 if s.masked else 1)).all(), (s.q_block, s.k_block)
        seen[s.batch, s.head, s.k_block, rows] = True
    assert np.array_equal(ran, seen), "the kernel and the stepper ran different (query block, key block) steps"


def test_every_step_of_the_kernel_appears_in_the_trace_and_skipped_ones_do_not():
    n, bm, bn = 100, 16, 32
    _, trace, _, _ = run_case((100, 32, 16, 32, True, "float32", 1, 1))
    codes = tile_map(n, n, block_m=bm, block_n=bn, causal=True)
    for qb, kb in np.ndindex(codes.shape):
        ran = ~np.isnan(trace.l_i[0, 0, kb, qb * bm:(qb + 1) * bm])
        assert ran.all() if codes[qb, kb] != TILE_SKIPPED else not ran.any(), (qb, kb)


def test_step_counters_add_up_to_the_whole_computation():
    n, d, bm, bn = 70, 16, 32, 16
    q, k, v = inputs(n, d, "float16")
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
    q, k, v = inputs(40, 16, "float32")
    previous = None
    for s in tiled_steps(q, k, v, block_m=32, block_n=16):
        if not s.first:
            np.testing.assert_allclose(s.m_prev, previous.m_i)
            np.testing.assert_allclose(s.acc_rescaled, previous.acc * np.exp(previous.m_i - s.m_i)[:, None],
                                       rtol=1e-6)
        previous = s


@needs_gpu
def test_gpu_trace_equals_the_stepper_and_large_logits_stay_finite():
    q, k, v = gpu_inputs(300, 64, torch.float32, batch=1, heads=2)
    out, trace = flash_attention(q, k, v, causal=True, block_m=64, block_n=32, trace=True)
    seen = np.zeros_like(~np.isnan(trace.l_i))
    for s in tiled_steps(q, k, v, causal=True, block_m=64, block_n=32):
        rows = slice(s.q_start, s.q_stop)
        np.testing.assert_allclose(trace.m_i[s.batch, s.head, s.k_block, rows], s.m_i, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(trace.l_i[s.batch, s.head, s.k_block, rows], s.l_i, rtol=1e-5, atol=1e-5)
        # the compiled kernel's stage, as the interpreted one's in test_trace_equals_tiled_steps
        assert (trace.stage[s.batch, s.head, s.k_block, rows] == (2 if s.masked else 1)).all()
        seen[s.batch, s.head, s.k_block, rows] = True
    assert np.array_equal(~np.isnan(trace.l_i), seen)
    q, k = q.half() * 10, k.half() * 10  # scores x 100: exp without subtracting the max would overflow
    v = v.half()
    out = flash_attention(q, k, v, causal=True, block_m=128, block_n=64)
    assert torch.isfinite(out).all() and gpu_error(out, q, k, v, True) < 1e-2


def _assigned(fn) -> set[str]:
    """The names a function assigns (its state and temporaries), read from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return {t.id for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AugAssign))
            for t in ast.walk(node.targets[0] if isinstance(node, ast.Assign) else node.target)
            if isinstance(t, ast.Name)}


def test_the_stepper_mirrors_the_kernels_two_functions_with_its_names():
    """The stepper's _attn_fwd_inner takes the state the kernel's takes, in its order, and keeps the kernel's
    names (no l_new / acc_new); its _attn_fwd calls it three times, for a sliding window's masked left edge, the
    unmasked and the masked stage, as the kernel's _attn_fwd does."""
    kernel_inner, kernel_fwd = (getattr(f, "fn", f) for f in (ta._attn_fwd_inner, ta._attn_fwd))
    assert list(inspect.signature(stepper._attn_fwd_inner).parameters)[:4] == \
        list(inspect.signature(kernel_inner).parameters)[:4] == ["acc", "l_i", "m_i", "q"]
    state = {"m_ij", "m_shift", "p", "l_ij", "alpha", "l_i", "acc", "m_i", "qk"}
    assert state <= _assigned(kernel_inner) and state <= _assigned(stepper._attn_fwd_inner)
    assert not {"l_new", "acc_new"} & _assigned(stepper._attn_fwd_inner)
    for fwd in (kernel_fwd, stepper._attn_fwd):
        source = inspect.getsource(fwd)
        assert source.count("_attn_fwd_inner(acc, l_i, m_i, q") == 3, fwd


def test_each_query_block_runs_its_unmasked_stage_then_its_masked_stage():
    q, k, v = inputs(100, 16, "float32")
    steps = list(tiled_steps(q, k, v, causal=True, block_m=32, block_n=16))
    for qb in range(4):
        stages = [s.masked for s in steps if s.q_block == qb]
        assert stages == sorted(stages) and stages[-1], (qb, stages)  # False ... False, True ... True
        codes = tile_map(100, 100, block_m=32, block_n=16, causal=True)[qb]
        assert stages == [codes[s.k_block] == 2 for s in steps if s.q_block == qb]
        # a mask that hides nothing changes nothing: unmasked steps see every score
        assert not any(np.isneginf(s.scores).any() for s in steps if s.q_block == qb and not s.masked)


def test_trace_difference_reads_the_steps_own_rows_of_the_trace():
    from dataclasses import replace

    from attnviz.kernels import trace_difference

    _, trace, steps, _ = run_case(ALL_CASES[4])  # batch 2, heads 3: the step's own (batch, head) must be read
    assert all(max(trace_difference(trace, s)) < 1e-5 for s in steps)
    step = steps[-1]
    moved = replace(trace, m_i=trace.m_i.copy())
    moved.m_i[step.batch, step.head, step.k_block, step.q_stop - 1] += 0.25
    gap_m, gap_l = trace_difference(moved, step)
    assert abs(gap_m - 0.25) < 1e-5 and gap_l < 1e-5
