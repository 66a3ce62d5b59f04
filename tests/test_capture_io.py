"""attnviz.capture.files: capture files streamed a block of rows at a time, read back by numpy and safetensors' own
readers, and round trips that keep the model's layer and head numbers."""

from __future__ import annotations

import io
import tracemalloc

import numpy as np
import pytest

from attnviz.capture import files as capture_io
from attnviz.capture import CaptureError, capture_attention
from attnviz.capture.files import (capture_to_bytes, export_bytes, export_to_temporary_file, load_capture,
                                save_capture, write_capture)
from attnviz.models import load_model
from attnviz.stats import head_stats

TEXT = "The cat sat on the mat. The cat sat on the mat."


@pytest.fixture(scope="module")
def caps():
    loaded = load_model("toy-llama-gqa")  # 2 layers x 4 heads, 2 KV heads
    return capture_attention(loaded, TEXT, with_scores=True), capture_attention(loaded, TEXT, store="qk")


def _expected(dense, layers, heads):
    lw = dense.layers if layers is None else layers
    hw = list(range(dense.n_heads)) if heads is None else heads
    return dense.pattern[np.ix_([dense.index_of(i) for i in lw], hw)], lw, hw


@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
def test_every_export_reads_back_with_the_formats_own_readers(caps, fmt):
    from safetensors.numpy import load as st_load

    dense, qk = caps
    for cap in (dense, qk):
        for layers, heads, dtype in (([1], [3], np.float32), ([0], None, np.float16), (None, [1, 2], np.float32)):
            data = capture_to_bytes(cap, fmt, layers=layers, heads=heads, dtype=dtype)
            arrays = dict(np.load(io.BytesIO(data))) if fmt == "npz" else st_load(data)
            expected, lw, hw = _expected(dense, layers, heads)
            assert arrays["pattern"].dtype == dtype and arrays["pattern"].shape == expected.shape
            np.testing.assert_allclose(arrays["pattern"], expected, atol=2e-6 if dtype == np.float32 else 1e-3)
            assert arrays["layers"].tolist() == lw and arrays["heads"].tolist() == hw
            assert arrays["kv_head_of"].tolist() == [dense.kv_head_of[h] for h in hw]
            assert arrays["token_ids"].tolist() == dense.token_ids
            if cap is dense:  # scores were captured: they travel with the pattern, for the same heads
                np.testing.assert_array_equal(arrays["scores"], dense.scores[np.ix_(
                    [dense.index_of(i) for i in lw], hw)])


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_a_partial_export_keeps_the_models_head_numbers(caps, tmp_path, suffix):
    dense, _ = caps
    path = tmp_path / f"part{suffix}"
    with open(path, "wb") as fh:
        write_capture(dense, fh, suffix[1:], layers=[1], heads=[3, 1])
    back = load_capture(path)
    assert back.layers == [1] and back.head_numbers == [1, 3]  # sorted, the model's numbers, not 0 and 1
    np.testing.assert_array_equal(back.pattern[0], dense.pattern[1, [1, 3]])
    assert back.kv_head_of == [dense.kv_head_of[1], dense.kv_head_of[3]]
    table = head_stats(back)
    assert table["head"].tolist() == [1, 3]
    full = head_stats(dense)
    np.testing.assert_allclose(table["entropy"], full[(full.layer == 1) & full["head"].isin([1, 3])]["entropy"],
                               atol=1e-6)
    # written again from the file, the numbers hold; a whole capture has no renumbering to keep
    again = load_capture(_rewrite(back, tmp_path / f"again{suffix}"))
    assert again.head_numbers == [1, 3]
    assert load_capture(_rewrite(dense, tmp_path / f"all{suffix}")).head_numbers == [0, 1, 2, 3]


def _rewrite(cap, path):
    save_capture(cap, path)
    return path


def test_a_long_export_streams_one_block_at_a_time(tmp_path):
    """The qk store's pattern is computed and written a block of rows of one head at a time: the peak of Python
    allocations while writing stays far under the pattern's own size (11.5 MB here)."""
    qk = capture_attention(load_model("toy-llama-gqa"), "abcdefghij " * 55, store="qk")  # 606 tokens
    size = export_bytes(qk)
    path = tmp_path / "long.safetensors"
    tracemalloc.start()
    try:
        save_capture(qk, path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size > 10e6 and peak < size / 4, (peak, size)
    from safetensors.numpy import load_file

    arrays = load_file(str(path))
    assert arrays["pattern"].shape == (2, 4, qk.n_tokens, qk.n_tokens)
    np.testing.assert_allclose(arrays["pattern"][1, 2], qk.head_pattern(1, 2), atol=0)


def test_the_temporary_file_a_download_reads_is_the_same_file(caps):
    dense, _ = caps
    with export_to_temporary_file(dense, "npz", layers=[0], heads=[2]) as fh:
        assert isinstance(fh, io.BufferedReader)  # what st.download_button reads
        data = fh.read()
    assert data == capture_to_bytes(dense, "npz", layers=[0], heads=[2])


def test_a_refused_or_failed_export_leaves_no_file(caps, tmp_path, monkeypatch):
    dense, _ = caps
    monkeypatch.setattr(capture_io, "MAX_EXPORT_BYTES", 1000)
    with pytest.raises(CaptureError, match="GiB.*export fewer layers or heads"):
        save_capture(dense, tmp_path / "big.npz")
    with pytest.raises(CaptureError, match="Heads must lie"):
        capture_to_bytes(dense, "npz", heads=[99], layers=[0])
    with pytest.raises(CaptureError, match="Unknown export format"):
        capture_to_bytes(dense, "csv", layers=[0], heads=[0])
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_a_whole_capture_round_trips_every_field(caps, tmp_path, suffix):
    dense, _ = caps
    save_capture(dense, tmp_path / f"cap{suffix}")
    back = load_capture(tmp_path / f"cap{suffix}")
    assert np.array_equal(back.pattern, dense.pattern) and np.array_equal(back.scores, dense.scores)
    assert (back.tokens, back.token_ids, back.layers, back.kv_head_of, back.model_name, back.causal) == (
        dense.tokens, dense.token_ids, dense.layers, dense.kv_head_of, dense.model_name, dense.causal)
    assert (back.scaling, back.head_dim) == (dense.scaling, dense.head_dim)
    with pytest.raises(CaptureError, match=".npz or .safetensors"):
        save_capture(dense, tmp_path / "cap.txt")
