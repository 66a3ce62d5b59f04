"""attnviz.views and the streamed statistics: every long-text view equals the same view of the dense pattern."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.capture import capture_attention
from attnviz.figures.heads import max_pool
from attnviz.models import load_model
from attnviz.stats import COLUMNS, head_stats
from attnviz.views import choose_store, head_window, mass_off_sink, pool_edges, pooled_heads

TEXT = "The cat sat on the mat. The cat sat on the mat. " * 4


@pytest.fixture(scope="module")
def both():
    loaded = load_model("toy-llama-gqa")
    return capture_attention(loaded, TEXT), capture_attention(loaded, TEXT, store="qk")


def _hidden(p):
    """The Heads page's sink hiding, written out: column 0 zeroed, rows rescaled, rows under 1% off it NaN."""
    kept = p[..., 1:].sum(-1, dtype=np.float64)
    out = p.astype(np.float64).copy()
    out[..., 0] = 0
    out /= np.where(kept >= 0.01, kept, 1)[..., None]
    out[kept < 0.01] = np.nan
    return out


@pytest.mark.parametrize("size", [16, 48, 500])
def test_pooled_heads_equal_max_pool_of_the_dense_pattern(both, size):
    dense, qk = both
    for i, layer in enumerate(dense.layers):
        np.testing.assert_allclose(pooled_heads(qk.inputs[layer], size), max_pool(dense.pattern[i], size),
                                   atol=2e-6)
        hidden = pooled_heads(qk.inputs[layer], size, hide_sink=True)
        expected = max_pool(_hidden(dense.pattern[i]).astype(np.float32), size)
        assert np.array_equal(np.isnan(hidden), np.isnan(expected))
        np.testing.assert_allclose(hidden[~np.isnan(hidden)], expected[~np.isnan(expected)], atol=2e-5)
    assert list(pool_edges(10, 48)) == list(range(11)) and pool_edges(100, 8)[-1] == 100


def test_a_window_and_the_weight_off_the_sink_equal_the_dense_ones(both):
    dense, qk = both
    n = dense.n_tokens
    for layer, head, rows, keys in ((0, 1, (10, 40), (0, 25)), (1, 3, (n - 16, n), (n - 30, n))):
        p = dense.pattern[dense.index_of(layer), head]
        np.testing.assert_allclose(head_window(qk.inputs[layer], head, rows, keys),
                                   p[rows[0]:rows[1], keys[0]:keys[1]], atol=2e-6)
        hidden = head_window(qk.inputs[layer], head, rows, keys, hide_sink=True)
        np.testing.assert_allclose(hidden, _hidden(p)[rows[0]:rows[1], keys[0]:keys[1]], atol=2e-5)
        np.testing.assert_allclose(mass_off_sink(qk.inputs[layer], head, block=7), p[:, 1:].sum(-1), atol=2e-6)


def test_the_store_is_chosen_by_the_dense_size():
    assert choose_store(30, 9, 1000, limit_bytes=2 * 2**30)[0] == "pattern"  # 1.0 GiB
    store, why = choose_store(30, 9, 8192, limit_bytes=2 * 2**30)  # 67.5 GiB
    assert store == "qk" and "67.5 GiB" in why and "never built" in why
    assert choose_store(30, 9, 8192, limit_bytes=2 * 2**30, can_stream=False)[0] == "pattern"


def test_streamed_statistics_equal_the_dense_ones_on_a_toy(both):
    dense, qk = both
    a, b = head_stats(dense), head_stats(qk)
    assert a[["layer", "head", "kv_head"]].equals(b[["layer", "head", "kv_head"]])
    for column in COLUMNS:
        np.testing.assert_allclose(b[column], a[column], rtol=1e-6, atol=1e-7, err_msg=column)


@pytest.mark.slow
def test_streamed_statistics_equal_the_dense_ones_on_smollm2_at_about_1000_tokens(smollm2):
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "data" / "declaration_and_lincoln.txt").read_text()[:4700]
    dense = capture_attention(smollm2, text)
    qk = capture_attention(smollm2, text, store="qk")
    assert 900 <= dense.n_tokens <= 1100
    a, b = head_stats(dense), head_stats(qk)
    # the qk store's forward pass runs SDPA, whose float32 rounding differs from eager's by ~1e-7 per layer: the
    # statistics agree to a relative 1e-6 (entropy ~5 nats, distances ~500 tokens)
    for column in COLUMNS:
        np.testing.assert_allclose(b[column], a[column], rtol=1e-6, atol=1e-7, err_msg=column)


def test_the_statistics_pass_also_pools_the_grid(both):
    dense, qk = both
    pooled = []
    stats = head_stats(qk, pool=16, pooled_out=pooled)
    assert len(pooled) == qk.n_layers and list(stats.columns[:3]) == ["layer", "head", "kv_head"]
    for i, layer in enumerate(qk.layers):
        np.testing.assert_allclose(pooled[i], pooled_heads(qk.inputs[layer], 16), atol=1e-6)
        np.testing.assert_allclose(pooled[i], max_pool(dense.pattern[i], 16), atol=2e-6)


@pytest.mark.parametrize("kind", ["causal", "window", "full"])
@pytest.mark.parametrize("sink", [False, True])
def test_online_tiles_equal_the_dense_statistics_output_and_grid(kind, sink):
    """Tiles of 5 rows x 7 keys: every online rescaling (alpha, the entropy's shift, the sink at the end) runs
    many times; the statistics, the output and the pooled grid equal the dense computation in float64."""
    import torch

    from attnviz.attention import LayerInputs, MaskRule, causal_mask, kv_head_of, layer_output, layer_pattern
    from attnviz.stats import induction_targets, pattern_stats, streamed_stats

    n, heads, kv, d = 41, 6, 2, 8
    g = torch.Generator().manual_seed(5)
    visible = {"causal": causal_mask(n), "full": np.ones((n, n), dtype=bool),
               "window": np.abs(np.arange(n)[:, None] - np.arange(n)[None, :]) <= 6}[kind]
    x = LayerInputs(q=torch.randn(heads, n, d, generator=g) * 3, k=torch.randn(kv, n, d, generator=g) * 3,
                    kv_head_of=tuple(kv_head_of(heads, kv)), scaling=d ** -0.5, mask=MaskRule.from_bool(visible),
                    softcap=4.0, sink=torch.randn(heads, generator=g) + 2 if sink else None)
    v = torch.randn(kv, n, 3, generator=g)
    ids = list(np.random.default_rng(1).integers(0, 6, n))
    got = streamed_stats(x, ids, block=5, key_block=7, pool=9, values=v)
    dense = layer_pattern(x, dtype=torch.float64)[0].numpy()
    expected = pattern_stats(dense, induction_targets(ids))  # the dense definition: a list of targets per query
    for column in expected:
        np.testing.assert_allclose(got[column], expected[column], rtol=2e-6, atol=1e-7, err_msg=column)
    np.testing.assert_allclose(got["_output"], layer_output(x, v.double(), dtype=torch.float64).numpy(), atol=2e-6)
    np.testing.assert_allclose(got["_pooled"], max_pool(dense, 9), atol=1e-6)
    hidden = max_pool(_hidden(dense.astype(np.float32)).astype(np.float32), 9)
    assert np.array_equal(np.isnan(got["_pooled_nosink"]), np.isnan(hidden))
    np.testing.assert_allclose(got["_pooled_nosink"], hidden, atol=2e-5)
    np.testing.assert_allclose(got["_pooled_nosink"], pooled_heads(x, 9, hide_sink=True), atol=2e-5)


def test_a_text_over_the_dense_token_limit_goes_to_the_qk_store_even_when_it_would_fit():
    assert choose_store(2, 4, 3000, limit_bytes=2 * 2**30, max_dense_tokens=2048)[0] == "qk"
    assert choose_store(2, 4, 3000, limit_bytes=2 * 2**30, max_dense_tokens=2048, can_stream=False)[0] == "pattern"
    assert choose_store(2, 4, 2000, limit_bytes=2 * 2**30, max_dense_tokens=2048)[0] == "pattern"


def test_bloom_in_the_qk_store_keeps_no_pattern():
    loaded = load_model("toy-bloom-alibi")
    qk = capture_attention(loaded, TEXT, store="qk")
    assert qk.pattern is None and qk.inputs and qk.store == "qk"
    dense = capture_attention(loaded, TEXT)
    np.testing.assert_allclose(qk.layer_rows(1), dense.pattern[1], atol=2e-6)


def test_sink_hidden_and_the_difference_of_two_maps_equal_a_row_by_row_loop():
    from attnviz.views import map_difference, sink_hidden

    rng = np.random.default_rng(3)
    a = rng.random((6, 6))
    a[:2, 0] += 1e4  # two rows almost wholly on the sink: blank once it is hidden
    a /= a.sum(-1, keepdims=True)
    b = rng.random((6, 6))
    b /= b.sum(-1, keepdims=True)
    np.testing.assert_allclose(sink_hidden(a), _hidden(a), atol=1e-12)  # NaN rows included
    hidden = sink_hidden(a)
    rows = [q for q in range(6) if not np.isnan(hidden[q]).any()]
    tv = [sum(abs(hidden[q, k] - b[q, k]) for k in range(6)) / 2 for q in rows]
    largest = max(abs(hidden[q, k] - b[q, k]) for q in rows for k in range(6))
    got = map_difference(hidden, b)
    assert got["rows"] == 4 and not got["all_rows"]
    assert got["total_variation"] == pytest.approx(sum(tv) / len(tv), abs=1e-12)
    assert got["max"] == pytest.approx(largest, abs=1e-12)
    assert map_difference(a, a)["total_variation"] == 0.0 and map_difference(a, a)["all_rows"]
    assert map_difference(np.full((2, 2), np.nan), b[:2, :2]) is None


def test_induction_on_a_text_of_one_repeated_token_equals_the_dense_definition():
    """A text that repeats one token has n²/2 (query, target) pairs; the streamed pass reads the match as a mask
    per tile instead of listing them. Its scores equal the dense definition (pattern_stats on induction_targets'
    lists), on one repeated token and on a text with a few."""
    import torch

    from attnviz.attention import LayerInputs, MaskRule, causal_mask, layer_pattern
    from attnviz.stats import induction_targets, pattern_stats, streamed_stats

    n = 300
    g = torch.Generator().manual_seed(0)
    x = LayerInputs(q=torch.randn(2, n, 8, generator=g), k=torch.randn(2, n, 8, generator=g), kv_head_of=(0, 1),
                    scaling=8 ** -0.5, mask=MaskRule.from_bool(causal_mask(n)))
    dense = layer_pattern(x, dtype=torch.float64)[0].numpy()
    for ids in ([7] * n, [i % 5 for i in range(n)], list(range(n))):
        got = streamed_stats(x, ids, block=64, key_block=100)["induction"]
        want = pattern_stats(dense, induction_targets(ids))["induction"]
        np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)


@pytest.mark.parametrize("sink", [False, True])
def test_the_statistics_pass_pools_the_overview_too_from_the_same_tiles(sink):
    """Two pooling sizes whose key blocks do not nest (9 and 5 over 41 tokens), with tiles of 5 rows x 7 keys:
    each size, the sink hidden or not, equals the dense max-pool (the overview as float16, rounded to 3 significant
    digits), and "_kept" equals the weight each row keeps off token 0; the statistics stay those of the pass
    without pooling."""
    import torch

    from attnviz.attention import LayerInputs, MaskRule, causal_mask, kv_head_of, layer_pattern
    from attnviz.stats import streamed_stats

    n, heads, kv, d = 41, 6, 2, 8
    g = torch.Generator().manual_seed(7)
    x = LayerInputs(q=torch.randn(heads, n, d, generator=g) * 3, k=torch.randn(kv, n, d, generator=g) * 3,
                    kv_head_of=tuple(kv_head_of(heads, kv)), scaling=d ** -0.5,
                    mask=MaskRule.from_bool(causal_mask(n)), sink=torch.randn(heads, generator=g) if sink else None)
    x.q[:, :, 0] += 4  # a strong first-token sink in some rows, so some rows keep under 1% off token 0
    x.k[:, 0, 0] = 6
    ids = list(np.random.default_rng(2).integers(0, 6, n))
    got = streamed_stats(x, ids, block=5, key_block=7, pool=5, overview=9)
    plain = streamed_stats(x, ids, block=5, key_block=7)
    for column in plain:
        np.testing.assert_array_equal(got[column], plain[column], err_msg=column)
    dense = layer_pattern(x, dtype=torch.float64)[0].numpy()
    hidden = _hidden(dense)
    assert np.isnan(hidden).any() and not np.isnan(hidden).all()
    # float32 scores up to about 30 here: weights within a few millionths of float64's
    np.testing.assert_allclose(got["_pooled"], max_pool(dense, 5), rtol=3e-6, atol=1e-6)
    assert got["_overview"].dtype == np.float16 and got["_overview"].shape == (heads, 9, 9)
    np.testing.assert_allclose(got["_overview"], max_pool(dense, 9), rtol=1e-3, atol=1e-6)
    # with the sink hidden a row is divided by the weight it keeps, summed apart from token 0's: as precise as the
    # weights (as 1 - p0 in float32, a row that kept 3% had a relative error 30 times its weights')
    for name, size, rtol in (("_pooled_nosink", 5, 1e-5), ("_overview_nosink", 9, 1e-3)):
        want = max_pool(hidden, size)
        assert np.array_equal(np.isnan(got[name]), np.isnan(want)), name
        np.testing.assert_allclose(got[name], want, rtol=rtol, atol=1e-6, equal_nan=True, err_msg=name)
    kept = dense[..., 1:].sum(-1)
    assert 0 < kept[kept > 0].min() < 1e-12  # a row that keeps almost nothing off token 0 (1 - p0 would read 1e-7s)
    np.testing.assert_allclose(got["_kept"], kept, rtol=1e-5, atol=0)  # every row to its own digits, even that one


def test_the_heads_page_pass_pools_the_overview_only_for_long_texts(monkeypatch):
    """streaming_attend's default: the overview is pooled with the grid (the Heads page's pass) from
    OVERVIEW_IN_PASS_FROM tokens, never without the grid (the CLI's statistics)."""
    from attnviz import views
    from attnviz.stats import streaming_attend

    loaded = load_model("toy-llama-gqa")
    ids = loaded.tokenizer(TEXT).input_ids
    monkeypatch.setattr(views, "OVERVIEW", 16)
    for threshold, pool, expected in ((len(ids), 8, True), (len(ids) + 1, 8, False), (len(ids), None, False)):
        monkeypatch.setattr(views, "OVERVIEW_IN_PASS_FROM", threshold)
        summary = capture_attention(loaded, TEXT, store="qk", during=streaming_attend(ids, pool=pool)).summary
        assert all(("_overview" in s) == expected for s in summary.values()), (threshold, pool)
        if expected:
            assert summary[0]["_overview"].shape == (4, 16, 16) and summary[0]["_kept"].shape == (4, len(ids))
