"""attnviz.kernels.triton_attention: the Triton kernel against a float64 reference (attnviz.attention in float64),
its edge cases (masked rows, ragged sizes, large logits, padding), its refusals, the choice of the interpreter, the
ahead-of-time compile for CUDA targets, and the GPU-only checks (marked gpu, skipped without CUDA)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from attnviz.attention import causal_mask
from attnviz.kernels import (
    INTERPRETED, KERNEL_DEVICE, flash_attention, naive_attention, online_attention, reference_attention, refusal,
    tiled_steps,
)
from attnviz.kernels.triton_attention import GPU_LAUNCH_CONFIGS
from tests.kernel_cases import (
    ALL_CASES, CASES, DTYPES, GPU_DTYPES, GPU_TOLERANCE, HEAD_DIMS, NS, RELATIONS, TOLERANCE, case_id, gpu_error,
    gpu_inputs, inputs, needs_gpu, run_case,
)


def test_cases_cover_every_pair():
    values = [NS, HEAD_DIMS, RELATIONS, (False, True), ("float32", "float16")]
    rows = [(n, d, "<" if bm < bn else "=" if bm == bn else ">", causal, dtype)
            for n, d, bm, bn, causal, dtype, _, _ in CASES]
    for a, b in itertools.combinations(range(len(values)), 2):
        seen = {(r[a], r[b]) for r in rows}
        assert seen == set(itertools.product(values[a], values[b])), (a, b)


@pytest.mark.parametrize("case", ALL_CASES, ids=case_id)
def test_flash_attention_matches_float64_reference(case):
    out, _, _, reference = run_case(case)
    assert out.dtype == DTYPES[case[5]] and out.shape == reference.shape
    assert (out.double() - reference).abs().max().item() < TOLERANCE[case[5]]


@pytest.mark.parametrize("case", ALL_CASES, ids=case_id)
def test_running_max_never_decreases_and_running_sum_is_positive(case):
    _, trace, _, _ = run_case(case)
    m, l = trace.m_i, trace.l_i  # [batch, head, key_block, query]
    both = ~np.isnan(m[:, :, 1:]) & ~np.isnan(m[:, :, :-1])
    assert np.all(m[:, :, 1:][both] >= m[:, :, :-1][both])
    # in self-attention every query sees key 0 on its first step, and the max term alone adds exp(0) = 1 to l
    assert np.all(l[~np.isnan(l)] >= 1.0 - 1e-6)


def test_no_nan_when_a_whole_tile_row_is_masked():
    n, d, bm, bn = 100, 32, 64, 16
    q, k, v = inputs(n, d, "float32")
    steps = list(tiled_steps(q, k, v, causal=True, block_m=bm, block_n=bn))
    assert any(np.isneginf(s.scores).all(axis=1).any() for s in steps), "no tile with a fully masked row: vacuous"
    out, trace = flash_attention(q, k, v, causal=True, block_m=bm, block_n=bn, trace=True)
    assert torch.isfinite(out).all()
    ran = ~np.isnan(trace.l_i)
    assert np.isfinite(trace.l_i[ran]).all() and not np.isnan(trace.m_i[ran]).any()
    assert (out.double() - reference_attention(q, k, v, causal=True)).abs().max() < 1e-5


def test_queries_that_see_no_key_get_zero_like_the_reference():
    # causal with more queries than keys: the first n_query - n_key queries see nothing (causal_mask's alignment)
    q, k, v = inputs(40, 32, "float32", n_key=20)
    assert not causal_mask(40, 20)[:20].any()
    out = flash_attention(q, k, v, causal=True, block_m=16, block_n=16)
    reference = reference_attention(q, k, v, causal=True)
    assert torch.isfinite(out).all() and (out[..., :20, :] == 0).all()
    assert (out.double() - reference).abs().max() < 1e-5
    assert (naive_attention(q, k, v, causal=True).double() - reference).abs().max() < 1e-5


@pytest.mark.parametrize("n_query,n_key", [(40, 70), (70, 40)])
def test_different_query_and_key_lengths(n_query, n_key):
    q, k, v = inputs(n_query, 16, "float32", n_key=n_key)
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
        q, k, v = inputs(n_query, 16, "float32", n_key=n_key, seed=n_key)
        out = flash_attention(q, k, v, causal=True, block_m=bm, block_n=bn)
        assert (out.double() - reference_attention(q, k, v, causal=True)).abs().max() < 1e-5, n_key


@pytest.mark.parametrize("causal", [False, True])
def test_values_all_one_give_output_all_one(causal):
    # each output row is a convex combination of value rows, so V = 1 must give O = 1 whatever the scores
    q, k, _ = inputs(70, 32, "float32")
    v = torch.ones_like(k)
    out = flash_attention(q * 3, k * 3, v, causal=causal, block_m=32, block_n=16)
    assert torch.allclose(out, torch.ones_like(out), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_logits_scaled_by_100_do_not_overflow(dtype):
    q, k, v = inputs(70, 32, dtype)
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
    q, k, v = inputs(n, d, "float32", batch, heads)
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
    q, k, v = (x.to(torch.bfloat16) for x in inputs(16, 16, "float32"))
    with pytest.raises(ValueError, match="bfloat16"):
        flash_attention(q, k, v)
    assert "bfloat16" in refusal(64, 64, block_m=16, block_n=16, causal=False, dtype="bfloat16")


def test_bad_inputs_are_refused_with_a_reason():
    q, k, v = inputs(16, 16, "float32")
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


@pytest.mark.skipif(not INTERPRETED, reason="the interpreter's options: on a GPU the kernel compiles")
def test_the_interpreter_skips_overflow_checks_and_the_numbers_are_the_same_bit_for_bit(monkeypatch):
    """Without the integer overflow checks Triton builds (and drops, outside debug builds), the kernel's output and
    trace are the ones it gives with them, bit for bit, on a causal, ragged, sliding-window case."""
    import dataclasses

    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    assert builder.options.sanitize_overflow is False
    q, k, v = (torch.randn(1, 2, 70, 24, generator=torch.Generator().manual_seed(i)) for i in range(3))
    run = dict(causal=True, block_m=16, block_n=32, trace=True, window=24)
    fast, fast_trace = flash_attention(q, k, v, **run)
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, sanitize_overflow=True))
    checked, checked_trace = flash_attention(q, k, v, **run)
    assert torch.equal(fast, checked)
    for name in ("m_i", "l_i", "stage"):
        np.testing.assert_array_equal(getattr(fast_trace, name), getattr(checked_trace, name), err_msg=name)


@pytest.mark.skipif(not INTERPRETED, reason="the interpreter's own overheads: on a GPU the kernel compiles")
def test_the_interpreter_swaps_the_same_builtins_when_it_finds_them_once(monkeypatch):
    """kernels.interpreted.builtins_found_once: the builtins it swaps before a launch and before a device function's
    call are the very ones Triton's own search swaps, and the kernel's output and trace are the same bit for bit."""
    import triton.language as tl
    from triton.runtime import interpreter

    import attnviz.kernels.triton_attention as ta
    from attnviz.kernels import interpreted

    assert interpreter._patch_builtin.__module__ == interpreted.__name__, "installed when the kernels are imported"

    def swapped(fn) -> list[tuple[int, str]]:
        with ta.LAUNCH_LOCK:  # the swaps are global: no kernel may run meanwhile
            scope = interpreter._patch_lang(fn)
            names = [(id(obj), name) for obj, name, _ in scope._changes]
            scope.restore()
        return names

    def run():
        q, k, v = (torch.randn(1, 2, 70, 24, generator=torch.Generator().manual_seed(i)) for i in range(3))
        return flash_attention(q, k, v, causal=True, block_m=16, block_n=32, trace=True, window=24)

    functions = [ta._attn_fwd.fn, ta._attn_fwd_inner.fn, tl.max.fn, tl.sum.fn]
    fast, found_once = run(), [swapped(fn) for fn in functions]
    monkeypatch.setattr(interpreter, "_patch_builtin", interpreter._patch_builtin.searching)  # Triton's own
    assert [swapped(fn) for fn in functions] == found_once and all(found_once)
    searched = run()
    assert torch.equal(fast[0], searched[0])
    for name in ("m_i", "l_i", "stage"):
        np.testing.assert_array_equal(getattr(fast[1], name), getattr(searched[1], name), err_msg=name)


@pytest.mark.slow
def test_kernel_runs_when_the_kernels_come_first_and_torch_imports_triton_after():
    """A process that imports attnviz.kernels first, then torch and transformers, which may import triton.language
    (building a model does, through torch._dynamo): the interpreter was chosen before, so the kernel runs."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    code = ("import attnviz.kernels, torch\n"
            "from torch.utils.flop_counter import FlopCounterMode\n"
            "from transformers import GPT2Config, GPT2LMHeadModel\n"
            "GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=10))\n"
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


def test_triton_imported_before_the_kernels_is_told_not_a_traceback():
    """triton.language imported without TRITON_INTERPRET before attnviz.kernels: without a GPU the interpreted kernel
    cannot call triton.language's compiled functions, and the kernels say so (a warning at import, the refusal the
    page shows, the error flash_attention raises); with a GPU the kernel compiles and nothing is refused."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    code = ("import torch, triton.language, warnings\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    import attnviz.kernels as k\n"
            "q = torch.randn(1, 1, 20, 16, device=k.KERNEL_DEVICE)\n"
            "try:\n"
            "    k.flash_attention(q, q, q, block_m=16, block_n=16)\n"
            "    ran = 'ran'\n"
            "except RuntimeError as exc:\n"
            "    ran = str(exc)\n"
            "reason = k.refusal(20, 16, block_m=16, block_n=16, causal=False, dtype='float32')\n"
            "print(repr((torch.cuda.is_available(), k.UNAVAILABLE, [str(w.message) for w in caught], ran, reason)))\n")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 0, result.stderr[-2000:]
    cuda, unavailable, warned, ran, reason = eval(result.stdout.strip().splitlines()[-1])
    if cuda:
        assert (unavailable, ran, reason) == (None, "ran", None)
    else:
        assert "triton.language was imported before TRITON_INTERPRET=1" in unavailable
        assert unavailable in warned and ran == unavailable and reason == unavailable


COMPILE_FOR_GPU = """
import os, sys
os.environ["TRITON_INTERPRET"] = "0"
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attnviz.kernels import triton_attention as ta
from attnviz.kernels.limits import shared_memory_estimate
fn = ta._attn_fwd
CONSTEXPRS = ("HEAD_DIM", "D_PAD", "BLOCK_M", "BLOCK_N", "CAUSAL", "TRACE", "PRECISION", "HAS_WINDOW")
# What Triton's launcher specialises for contiguous [b, h, n, d] tensors: an integer argument equal to 1 becomes a
# constant, pointers and integers that are multiples of 16 are marked so; without it loads cannot be vectorised
UNIT_STRIDES = {"stride_qk": 1, "stride_kk": 1, "stride_vk": 1, "stride_ok": 1}
ALIGNED = [p for p in fn.arg_names if p in ("Q", "K", "V", "Out", "TraceM", "TraceL")
           or (p.startswith("stride") and p not in UNIT_STRIDES)]
for dtype, d, block_m, block_n, causal, trace, precision, window in [
        ("fp16", 64, 128, 64, True, False, "tf32", False), ("fp16", 64, 128, 64, False, False, "tf32", False),
        ("fp32", 48, 64, 32, False, True, "ieee", False), ("bf16", 128, 128, 64, True, False, "tf32", False),
        ("fp16", 64, 128, 64, True, False, "tf32", True)]:
    values = dict(zip(CONSTEXPRS, (d, triton.next_power_of_2(d), block_m, block_n, causal, trace, precision,
                                   window)))
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


@needs_gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [16, 24, 48, 64, 80, 128])
def test_gpu_kernel_matches_float64_at_ragged_sizes_and_every_head_dim(d, causal, dtype):
    # float32 takes smaller blocks: its K/V tiles are twice as large in shared memory
    blocks = [(128, 64), (64, 32), (16, 128)] if dtype != torch.float32 else [(64, 32), (32, 64)]
    for n in (1, 17, 100, 257, 1000, 1031):
        q, k, v = gpu_inputs(n, d, dtype, seed=n)
        for block_m, block_n in blocks:
            error = gpu_error(flash_attention(q, k, v, causal=causal, block_m=block_m, block_n=block_n), q, k, v,
                               causal)
            assert error < GPU_TOLERANCE[dtype], (n, block_m, block_n, error)


@needs_gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
def test_gpu_unmasked_and_masked_stages_meet_at_every_diagonal_offset(dtype):
    # the compiled kernel's stage boundary at every (n_key - n_query) from -BLOCK_N to +BLOCK_N, with the
    # benchmark's block shape (BLOCK_M = 2 BLOCK_N) and more keys than queries and fewer
    n_query, (bm, bn) = 200, ((128, 64) if dtype != torch.float32 else (64, 32))
    for n_key in range(n_query - bn, n_query + bn + 1):
        q, k, v = gpu_inputs(n_query, 64, dtype, n_key=n_key, batch=1, heads=2, seed=n_key)
        error = gpu_error(flash_attention(q, k, v, causal=True, block_m=bm, block_n=bn), q, k, v, True)
        assert error < GPU_TOLERANCE[dtype], (n_key, error)


@needs_gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
def test_gpu_sliding_window_matches_float64(dtype):
    """The compiled kernel with a sliding window narrower than a block, wider than several, and wider than the
    text, at ragged sizes and with more keys than queries."""
    bm, bn = (128, 64) if dtype != torch.float32 else (64, 32)
    for n, n_key, window in ((1000, 1000, 37), (1031, 1031, 300), (257, 400, 96), (100, 100, 512)):
        q, k, v = gpu_inputs(n, 64, dtype, n_key=n_key, seed=window)
        error = gpu_error(flash_attention(q, k, v, causal=True, window=window, block_m=bm, block_n=bn), q, k, v,
                          True, window)
        assert error < GPU_TOLERANCE[dtype], (n, n_key, window, error)


@needs_gpu
@pytest.mark.parametrize("config", GPU_LAUNCH_CONFIGS, ids=lambda c: "{}x{}-w{}-s{}".format(*c))
def test_gpu_every_benchmarked_launch_config_is_correct(config):
    # the benchmark reports the fastest of these configs: each must compute the right thing, at d = 64 and 128
    bm, bn, warps, stages = config
    for d, causal, dtype in itertools.product((64, 128), (False, True), (torch.float16, torch.bfloat16)):
        q, k, v = gpu_inputs(1000, d, dtype, seed=d)
        try:
            out = flash_attention(q, k, v, causal=causal, block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)
        except ValueError as exc:  # refused for want of shared memory: the benchmark skips it too
            assert "shared memory" in str(exc)
            continue
        assert gpu_error(out, q, k, v, causal) < GPU_TOLERANCE[dtype], (d, causal, dtype)


@needs_gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
def test_gpu_canary_padding_around_the_output_is_untouched(dtype):
    # head dim 48 is padded to 64 and N = 300 to three blocks of 128: an unmasked store would land in the canary
    batch, heads, n, d = 2, 3, 300, 48
    bm, bn = (128, 64) if dtype != torch.float32 else (64, 32)
    q, k, v = gpu_inputs(n, d, dtype, batch=batch, heads=heads)
    canary = 1234.0  # exactly representable in every dtype here
    padded = torch.full((batch, heads, n + 128, d + 48), canary, dtype=dtype, device="cuda")
    out = padded[:, :, 64:64 + n, 16:16 + d]  # canary before and after, in both dimensions
    for causal in (False, True):
        flash_attention(q, k, v, causal=causal, block_m=bm, block_n=bn, out=out)
        outside = torch.ones_like(padded, dtype=torch.bool)
        outside[:, :, 64:64 + n, 16:16 + d] = False
        assert (padded[outside] == canary).all()
        assert gpu_error(out, q, k, v, causal) < GPU_TOLERANCE[dtype]
