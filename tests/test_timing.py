"""attnviz.kernels.timing: peak-memory measurement, the five-method comparison, the one-thread guard, warm-call
timing and the data-sheet peaks."""

from __future__ import annotations

import pytest
import torch

from attnviz.kernels import INTERPRETED, compare_methods, peak_cpu_bytes
from tests.kernel_cases import needs_gpu


def test_peak_cpu_bytes_measures_a_known_allocation():
    def hold_one_mebibyte():
        x = torch.ones(1 << 18)  # 2^18 float32 = 1 MiB
        return float(x.max())

    peak = peak_cpu_bytes(hold_one_mebibyte)
    assert (1 << 20) <= peak < (1 << 20) + (1 << 16)


def test_compare_methods_checks_every_method():
    results = compare_methods(48, 16, block_m=16, block_n=16, causal=True, repeats=1)
    assert [r.method for r in results] == ["naive", "torch SDPA", "two-pass tiled", "online softmax (stepper)",
                                           "fused Triton kernel"]
    assert all(r.error < 1e-5 and r.seconds > 0 for r in results)
    if INTERPRETED:
        assert "not a speed" in results[-1].note


@pytest.mark.skipif(not INTERPRETED, reason="the step view's call stands in for the interpreter's only")
def test_the_step_views_interpreted_call_reports_what_a_fresh_call_would():
    """The page hands compare_methods the step view's traced kernel call (kernel_run) rather than interpreting the
    kernel twice: the kernel row's error must be a fresh call's, and its time the call's own."""
    from attnviz.kernels.steps_view import kernel_run

    run = kernel_run(40, 16, block_m=16, block_n=16, causal=True, seed=3)
    fresh = compare_methods(40, 16, block_m=16, block_n=16, causal=True, seed=3, repeats=1)[-1]
    reused = compare_methods(40, 16, block_m=16, block_n=16, causal=True, seed=3, repeats=1,
                             interpreted_call=run.kernel_call)[-1]
    assert reused.error == fresh.error and reused.error == pytest.approx(run.kernel_error, abs=1e-7)
    assert reused.seconds == run.kernel_call[0] > 0


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
    """On a clock of its own that only the timed functions move, so load on the machine cannot change a number."""
    from types import SimpleNamespace

    from attnviz.kernels import timing

    clock = [0.0]
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    syncs = []
    monkeypatch.setattr(timing, "_sync", lambda: syncs.append(1))
    calls = []

    def cold_then_warm():  # the first call is a slow "compile", later calls are fast
        calls.append(1)
        clock[0] += 0.3 if len(calls) == 1 else 0.01
        return "first" if len(calls) == 1 else "later"

    seconds, out = timing.measure(cold_then_warm, repeats=3)
    assert out == "first"  # the warm-up's output is the one checked
    assert seconds == pytest.approx(0.01)  # the 0.3 s cold call is not the time
    assert len(calls) == 1 + 1 + 3  # warm-up, one warm probe, then a median of 3
    assert len(syncs) == 2 * 4  # synchronised before and after each of the 4 timed calls

    slow_calls = []

    def slow():
        slow_calls.append(1)
        clock[0] += timing.SLOW_CALL_S + 0.05

    seconds, _ = timing.measure(slow, repeats=3)
    assert seconds == pytest.approx(timing.SLOW_CALL_S + 0.05) and len(slow_calls) == 2  # timed once, after warm-up


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
