"""attnviz.variants against torch's own GQA attention (enable_gqa) and an explicit per-group loop, in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnviz.variants import compare_variants, grouped_query_attention, pool_kv_heads, toy_input, toy_weights


def _torch_reference(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads, causal):
    """The same layer with torch's scaled_dot_product_attention, which repeats KV heads itself (enable_gqa)."""
    x, w_q, w_k, w_v, w_o = (torch.from_numpy(np.asarray(a, dtype=np.float64)) for a in (x, w_q, w_k, w_v, w_o))
    n = x.shape[0]
    d_head = w_q.shape[1] // n_heads
    q = (x @ w_q).view(n, n_heads, d_head).transpose(0, 1)[None]
    k = (x @ w_k).view(n, n_kv_heads, d_head).transpose(0, 1)[None]
    v = (x @ w_v).view(n, n_kv_heads, d_head).transpose(0, 1)[None]
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)[0]
    return (out.transpose(0, 1).reshape(n, n_heads * d_head) @ w_o).numpy()


@pytest.mark.parametrize("n_heads,n_kv_heads", [(8, 8), (8, 2), (8, 1), (6, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_attention_matches_torch_enable_gqa(n_heads, n_kv_heads, causal):
    d, n = 48, 7
    w = toy_weights(d, n_heads, seed=3)
    x = toy_input(n, d, seed=3)
    w_k, w_v = pool_kv_heads(w["w_k"], n_heads, n_kv_heads), pool_kv_heads(w["w_v"], n_heads, n_kv_heads)
    out, pattern = grouped_query_attention(x, w["w_q"], w_k, w_v, w["w_o"], n_heads=n_heads, n_kv_heads=n_kv_heads,
                                           causal=causal)
    expected = _torch_reference(x, w["w_q"], w_k, w_v, w["w_o"], n_heads, n_kv_heads, causal)
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)
    assert pattern.shape == (n_heads, n, n)
    np.testing.assert_allclose(pattern.sum(-1), 1.0, rtol=1e-12)
    if causal:
        assert np.all(pattern[:, np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] == 0)


def test_pool_kv_heads_is_the_mean_of_each_groups_head_blocks():
    d, n_heads, n_kv, d_head = 12, 6, 2, 2
    w = np.random.default_rng(0).standard_normal((d, n_heads * d_head))
    pooled = pool_kv_heads(w, n_heads, n_kv)
    group = n_heads // n_kv
    for g in range(n_kv):
        blocks = [w[:, h * d_head:(h + 1) * d_head] for h in range(g * group, (g + 1) * group)]
        np.testing.assert_allclose(pooled[:, g * d_head:(g + 1) * d_head], np.mean(blocks, axis=0), rtol=1e-14)
    np.testing.assert_array_equal(pool_kv_heads(w, n_heads, n_heads), w)


def test_mqa_heads_share_one_key_so_patterns_differ_only_through_queries():
    d, n, n_heads = 32, 6, 4
    w = toy_weights(d, n_heads, seed=1)
    x = toy_input(n, d, seed=1)
    # Give every query head the same query projection: under MQA all heads must then attend identically.
    w_q_same = np.tile(w["w_q"][:, : d // n_heads], (1, n_heads))
    _, pattern = grouped_query_attention(x, w_q_same, pool_kv_heads(w["w_k"], n_heads, 1),
                                         pool_kv_heads(w["w_v"], n_heads, 1), w["w_o"], n_heads=n_heads, n_kv_heads=1)
    for h in range(1, n_heads):
        np.testing.assert_allclose(pattern[h], pattern[0], rtol=1e-12)


def test_compare_variants_runs_each_variant_and_mha_is_unchanged():
    d, n, n_heads = 32, 5, 4
    w = toy_weights(d, n_heads, seed=2)
    x = toy_input(n, d, seed=2)
    results = compare_variants(x, w, n_heads=n_heads, kv_heads={"MHA": 4, "GQA": 2, "MQA": 1})
    assert list(results) == ["MHA", "GQA", "MQA"]
    expected = _torch_reference(x, w["w_q"], w["w_k"], w["w_v"], w["w_o"], n_heads, n_heads, False)
    np.testing.assert_allclose(results["MHA"][0], expected, rtol=1e-10, atol=1e-12)
    assert not np.allclose(results["MQA"][1], results["MHA"][1])


def test_invalid_head_split_is_refused():
    with pytest.raises(ValueError):
        toy_weights(30, 4)
    with pytest.raises(ValueError):
        pool_kv_heads(np.zeros((8, 8)), 4, 3)


def test_page_takes_128_query_heads_and_keeps_the_toy_layer_2048_wide():
    """The Variants page accepts up to 128 query heads (Llama-3-405B has 128); the toy layer below then limits its
    head dim so that heads x head dim stays at most 2048 (four float64 weights of 2048 x 2048, 128 MiB)."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app_pages" / "variants.py"),
                           default_timeout=180)
    at.run()
    assert not at.exception, at.exception
    at.slider(key="variants_dhead").set_value(64).run()
    at.slider(key="variants_heads").set_value(128).run()
    assert not at.exception, at.exception
    head_dim = at.slider(key="variants_dhead")
    assert head_dim.max * 128 <= 2048 and head_dim.value == head_dim.max == 16
    assert "only query heads 0, 32, 64, … are labelled" in " ".join(c.value for c in at.caption)
    at.slider(key="variants_heads").set_value(8).run()
    assert not at.exception, at.exception
    assert at.slider(key="variants_dhead").max == 64


def test_page_says_how_much_kv_memory_each_split_saves_and_tables_every_column():
    """Issue 14: with as many KV heads as query heads the page said "1× less memory than MHA". Its caption now
    says the saving only when there is one (query heads / KV heads, counted here by hand from the head sharing),
    and the KV table, a static table whose cells wrap, holds every model's formula and exact byte count (2 x
    layers x KV heads x head dim x context x batch x bytes, multiplied out here)."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from attnviz.cost import preset_arch

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app_pages" / "variants.py"),
                           default_timeout=180)
    at.run()
    assert not at.exception, at.exception
    for kv in (1, 2, 4, 8):
        at.select_slider(key="variants_kv").set_value(kv).run()
        assert not at.exception, at.exception
        caption = next(c.value for c in at.caption if c.value.startswith("Query head h reads"))
        sharing = len([h for h in range(8) if h // (8 // kv) == 0])  # query heads reading KV head 0
        assert "1× less" not in caption
        if sharing == 1:
            assert "the same memory as MHA" in caption and "less memory" not in caption
        else:
            assert f"{sharing}× less memory than MHA" in caption
    table = at.table[0].value
    assert list(table.index) == at.multiselect(key="variants_models").value
    for name, row in table.iterrows():
        a = preset_arch(name)
        assert row.iloc[0] == f"2 × {a.layers} × {a.kv_heads} × {a.head_dim} × 4,096 × 1 × 2 B"
        assert row["bytes"] == f"{2 * a.layers * a.kv_heads * a.head_dim * 4096 * 1 * 2:,}"


def test_variant_kv_heads_lists_gqa_only_between_mha_and_mqa():
    from attnviz.variants import variant_kv_heads

    assert variant_kv_heads(8, 2) == {"MHA": 8, "GQA (2 KV)": 2, "MQA": 1}
    assert variant_kv_heads(8, 8) == {"MHA": 8, "MQA": 1}
    assert variant_kv_heads(8, 1) == {"MHA": 8, "MQA": 1}


def test_differences_from_mha_by_a_loop_over_heads_and_rows():
    from attnviz.variants import differences_from

    x, weights = toy_input(7, 32, seed=3), toy_weights(32, 4, seed=3)
    results = compare_variants(x, weights, n_heads=4, kv_heads={"MHA": 4, "GQA": 2, "MQA": 1}, causal=True)
    found = differences_from(results, "MHA")
    out_mha, p_mha = results["MHA"]
    for name, (out, pattern) in results.items():
        distances = [sum(abs(a - b) for a, b in zip(pattern[h, i], p_mha[h, i])) / 2
                     for h in range(4) for i in range(7)]
        relative = np.sqrt(((out - out_mha) ** 2).sum() / (out_mha ** 2).sum())
        assert found[name] == pytest.approx((sum(distances) / len(distances), relative), rel=1e-12, abs=1e-15)
    assert found["MHA"] == (0.0, 0.0) and found["MQA"][0] > 0


def test_the_pages_cached_charts_are_fresh_builds_of_its_settings():
    """The page's figures come from caches keyed on their settings (attnviz.ui.variants): after controls move, each
    drawn chart equals the figure built afresh, here, from the library and the same settings."""
    import json
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from tests.test_one_draw import as_sent

    from attnviz import cost
    from attnviz import variants as var
    from attnviz.attention import kv_head_of
    from attnviz.figures import cost as figs

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app_pages" / "variants.py"),
                           default_timeout=180)
    at.run()
    at.slider(key="variants_heads").set_value(12).run()
    at.select_slider(key="variants_kv").set_value(3).run()
    at.slider(key="variants_batch").set_value(4).run()
    at.toggle(key="variants_causal").set_value(True).run()
    assert not at.exception, at.exception
    drawn = [json.loads(chart.proto.spec)["data"] for chart in at.get("plotly_chart")]
    archs = {name: cost.preset_arch(name) for name in cost.PRESETS}
    chosen = at.multiselect(key="variants_models").value
    contexts = np.unique(np.logspace(7, 17, 41, base=2).round().astype(int))
    seq = np.unique(np.logspace(4, 20, 65, base=2).round().astype(int))
    flops = [cost.attention_flops(seq_len=int(n), d_model=4096, causal=True) for n in seq]
    results, kv = var.compare_variants(var.toy_input(12, 16 * 12, seed=0), var.toy_weights(16 * 12, 12, seed=0),
                                       n_heads=12, kv_heads=var.variant_kv_heads(12, 3), causal=True), \
        var.variant_kv_heads(12, 3)
    fresh = [
        figs.head_sharing_figure(12, {n: kv_head_of(12, k) for n, k in var.variant_kv_heads(12, 3).items()}),
        figs.kv_cache_figure(contexts, {n: cost.kv_cache_curve(archs[n], contexts, batch=4, bytes_per_value=2)
                                        for n in chosen}, batch=4, bytes_per_value=2, budget_gib=80.0),
        figs.flops_figure(seq, [f["projections"] for f in flops], [f["attention"] for f in flops],
                          crossover=cost.crossover_seq_len(d_model=4096, causal=True), d_model=4096, causal=True),
        figs.param_share_figure({n: cost.param_counts(a) for n, a in archs.items()}),
        figs.variant_maps_figure({n: r[1] for n, r in results.items()}, [0, 1, 2, 3],
                                 {n: kv_head_of(12, k) for n, k in kv.items()}),
    ]
    assert len(drawn) == len(fresh)
    for shown, fig in zip(drawn, fresh):
        assert shown == as_sent(fig)["data"]


def test_a_query_heads_move_builds_the_next_ones_ahead_and_they_are_then_drawn_without_a_build(monkeypatch):
    """After Query heads moves, the background builds ask for one head either way, each with the key/value heads and
    toy head size the page would pick there; built, a move to one of them builds no figure."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from attnviz.figures import cost as figs
    from attnviz.ui import variants as uv

    asked = []
    monkeypatch.setattr(uv, "build_in_background", lambda fn, calls, name: asked.append((fn, calls)) or True)
    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app_pages" / "variants.py"),
                           default_timeout=180)
    at.run()
    assert asked == []  # a first run moved nothing
    at.slider(key="variants_dhead").set_value(64).run()
    at.slider(key="variants_heads").set_value(31).run()  # from 8, rising: 32 first, 64 wide as 2048 // 32
    assert not at.exception, at.exception
    fn, calls = asked[-1]
    assert at.select_slider(key="variants_kv").value == 1  # 31 is prime: its middle divisor of two is 1
    assert calls == [(32, 1, 12, 64, True, 0, (0, 1, 2, 3)), (30, 1, 12, 64, True, 0, (0, 1, 2, 3))]
    assert uv.kv_heads_for(32, None) == 8 and uv.kv_heads_for(7, 7) == 7 and uv.kv_heads_for(7, 2) == 1
    assert uv.toy_head_dim(64, 32, 2048) == 64 and uv.toy_head_dim(64, 33, 2048) == 62
    for call in calls:
        fn(*call)  # as the background thread would
    built = []
    for name in ("head_sharing_figure", "variant_maps_figure"):
        real = getattr(figs, name)
        monkeypatch.setattr(figs, name, lambda *a, real=real, name=name, **k: built.append(name) or real(*a, **k))
    at.slider(key="variants_heads").set_value(30).run()
    assert not at.exception, at.exception
    assert at.select_slider(key="variants_kv").value == 1 and built == []


def test_the_heads_built_ahead_are_sorted_as_the_page_asks_for_them(monkeypatch):
    """Heads picked out of order are built ahead in the order the page draws them (sorted), and only those the next
    query heads have."""
    from attnviz.ui import variants as uv

    asked = []
    monkeypatch.setattr(uv, "build_in_background", lambda fn, calls, name: asked.append(calls) or True)
    uv.prefetch_heads(6, 5, 3, dict(n_tokens=12, d_head=16, causal=True, seed=0, heads=[5, 3, 1]), 128, 2048)
    assert asked[-1] == [(7, 1, 12, 16, True, 0, (1, 3, 5)), (5, 1, 12, 16, True, 0, (1, 3))]
