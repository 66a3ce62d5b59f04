"""attnviz.compare: two maps compared a block of rows at a time equal the dense figures' pooling
(figures.heads.max_pool, max_abs_pool) and views.map_difference of the whole maps, taken from a dense capture of the
model's own eager weights; and its memory estimate covers what it allocates."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from attnviz import compare, views
from attnviz.capture import capture_attention
from attnviz.figures.heads import max_abs_pool, max_pool
from attnviz.models import load_model

TEXT = "The cat sat on the mat because it was warm. " * 8  # 353 tokens of the byte tokenizer


@pytest.fixture(scope="module")
def captures():
    loaded = load_model("toy-llama-gqa")
    return capture_attention(loaded, TEXT), capture_attention(loaded, TEXT, store="qk")


def rows_of(capture, layer, head):
    if head is None:
        return lambda a, b: capture.layer_rows(layer, a, b).mean(0)
    return lambda a, b: capture.head_pattern(layer, head, rows=(a, b))


@pytest.mark.parametrize("hide_sink", [False, True])
@pytest.mark.parametrize("size", [16, 50, 1000])  # pooled, pooled with uneven blocks, whole (n = 353)
@pytest.mark.parametrize("maps", [((0, 1), (1, 3)), ((1, None), (0, None))], ids=["heads", "layer means"])
def test_block_by_block_equals_the_dense_pooling_and_summary(captures, hide_sink, size, maps):
    dense, qk = captures
    n = dense.n_tokens
    (la, ha), (lb, hb) = maps
    got = compare.compare_maps(rows_of(qk, la, ha), n, rows_of(qk, lb, hb), n, size, hide_sink=hide_sink,
                               rows_at_once=37)
    a = dense.pattern[la, ha] if ha is not None else dense.pattern[la].mean(0)
    b = dense.pattern[lb, hb] if hb is not None else dense.pattern[lb].mean(0)
    if hide_sink:
        a, b = views.sink_hidden(a), views.sink_hidden(b)
    np.testing.assert_allclose(got.a, max_pool(a, size), atol=1e-5, equal_nan=True)
    np.testing.assert_allclose(got.b, max_pool(b, size), atol=1e-5, equal_nan=True)
    d = a.astype(np.float64) - b
    np.testing.assert_allclose(got.diff, max_abs_pool(d, size), atol=1e-5, equal_nan=True)
    expected = views.map_difference(a, b)
    assert got.summary["rows"] == expected["rows"] and got.summary["all_rows"] == expected["all_rows"]
    assert got.summary["max"] == pytest.approx(expected["max"], abs=1e-5)
    assert got.summary["total_variation"] == pytest.approx(expected["total_variation"], abs=1e-5)
    assert got.bound == pytest.approx(np.nanmax(np.abs(d)), abs=1e-5)
    # the pass length changes nothing but float32's last bits (a pass's softmax sums the keys its rows may see):
    # one pass of every row gives the same
    whole = compare.compare_maps(rows_of(qk, la, ha), n, rows_of(qk, lb, hb), n, size, hide_sink=hide_sink,
                                 rows_at_once=n)
    np.testing.assert_allclose(whole.diff, got.diff, rtol=0, atol=3e-7, equal_nan=True)
    np.testing.assert_array_equal(np.isnan(whole.diff), np.isnan(got.diff))


def test_maps_of_different_lengths_are_pooled_apart_with_no_difference(captures):
    dense, _ = captures
    short = capture_attention(load_model("toy-llama-gqa"), TEXT[:100])
    got = compare.compare_maps(rows_of(dense, 0, 1), dense.n_tokens, rows_of(short, 0, 1), short.n_tokens, 64)
    assert got.diff is None and got.summary is None
    np.testing.assert_array_equal(got.a, max_pool(dense.pattern[0, 1], 64))
    np.testing.assert_array_equal(got.b, max_pool(short.pattern[0, 1], 64))


def test_the_memory_estimate_covers_what_a_comparison_allocates(monkeypatch):
    """compare_bytes against torch's allocator (the weights computed from q and k) plus numpy's (tracemalloc: the
    rows, sink-hidden copies, the difference), each at its own peak, for two layer means of a 3,000-token text. The
    passes run one at a time here (one worker: torch's profiler sees the calling thread's allocations only); each
    pass in flight holds its own buffers, so the estimate for more workers counts them that many times."""
    from attnviz import cores
    from attnviz.kernels.timing import peak_cpu_bytes

    loaded = load_model("toy-llama-gqa")
    qk = capture_attention(loaded, ("The cat sat on the mat. " * 130)[:3000], store="qk")
    n = qk.n_tokens
    assert n > 2048
    monkeypatch.setattr(cores, "workers", lambda: 1)

    def run():
        return compare.compare_maps(rows_of(qk, 0, None), n, rows_of(qk, 1, None), n, 512, hide_sink=True,
                                    heads=(qk.n_heads, qk.n_heads))

    torch_peak = peak_cpu_bytes(run)
    tracemalloc.start()
    run()
    _, numpy_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    estimate = compare.compare_bytes(n, n, heads_a=qk.n_heads, heads_b=qk.n_heads)
    assert estimate == compare.compare_bytes(n, n, heads_a=qk.n_heads, heads_b=qk.n_heads, in_flight=1)
    assert torch_peak is not None and torch_peak + numpy_peak <= estimate, (torch_peak, numpy_peak, estimate)
    two = compare.compare_bytes(n, n, heads_a=qk.n_heads, heads_b=qk.n_heads, in_flight=2)
    pooled = 5 * 512 * 512 * 8
    assert two - pooled == 2 * (estimate - pooled)


def test_the_estimate_counts_no_more_passes_in_flight_than_run_at_once(monkeypatch):
    """One pass of every row (a head of 1,800 tokens) or maps of different lengths (pooled one after the other) hold
    one pass's buffers, whatever the cores; many passes hold one per core."""
    from attnviz import cores

    monkeypatch.setattr(cores, "workers", lambda: 2)
    assert compare.rows_per_pass(1800, 1) >= 1800
    assert compare.compare_bytes(1800, 1800) == compare.compare_bytes(1800, 1800, in_flight=1)
    assert compare.compare_bytes(1800, 900) == compare.compare_bytes(1800, 900, in_flight=1)
    assert compare.rows_per_pass(1800, 9) < 1800
    assert compare.compare_bytes(1800, 1800, heads_a=9, heads_b=9) == \
        compare.compare_bytes(1800, 1800, heads_a=9, heads_b=9, in_flight=2)
