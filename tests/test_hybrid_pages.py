"""The Heads and Sinks pages on the newest families, each a tiny random model folder typed into the page as a
user's folder: a hybrid's other layers (their kinds, a linear layer's implicit map and statistics, the gate), a
model without softmax attention (Mamba2) shown by its mixers alone, and the gate beside the sink; no exception
anywhere. The gate-and-sink table is checked against a recomputation from the capture's pattern and gates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz.capture.linear import gate_sink_table, gate_table
from attnviz.sinks import sink_scores
from attnviz.ui import CUSTOM_MODEL
from tests import mixer_models

PAGES = Path(__file__).resolve().parent.parent / "app_pages"
TEXT = "The gate shuts; the gate opens. The gate shuts; the gate opens."


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    from attnviz.tokenizer import byte_tokenizer

    root = tmp_path_factory.mktemp("hybrid_pages")
    for name in ("qwen3_next", "mamba2", "lfm2", "deepseek_v32"):
        mixer_models.build(name).save_pretrained(root / name)
        byte_tokenizer().save_pretrained(root / name)
    return root


def _page(page: str, prefix: str, folder: Path, monkeypatch, text: str | None = TEXT) -> AppTest:
    """The page run with the folder typed in as the visitor's model (and `text`; None: the page's own)."""
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(folder.parent))
    at = AppTest.from_file(str(PAGES / page), default_timeout=600)
    at.session_state[f"{prefix}_model"] = CUSTOM_MODEL
    at.session_state[f"{prefix}_model_custom"] = str(folder)
    if text is not None:
        at.session_state[f"{prefix}_text"] = text
    at.run()
    assert not at.exception, at.exception
    return at


def test_heads_page_shows_a_hybrids_other_layers(root, monkeypatch):
    at = _page("heads.py", "heads", root / "qwen3_next", monkeypatch)
    assert any(h.value == "Layers other than softmax attention" for h in at.subheader)
    assert at.selectbox(key="mixers_layer").options == ["0 (gated delta rule)", "1 (gated delta rule)",
                                                       "2 (gated delta rule)"]
    assert at.selectbox(key="heads_layer").options == ["3"]  # the softmax views: model layer 3, not 0
    at.selectbox(key="mixers_layer").set_value(2).run()
    at.selectbox(key="mixers_head").set_value(3).run()
    at.selectbox(key="mixers_gate_head").set_value(1).run()
    assert not at.exception, at.exception
    assert any("not a probability" in c.value for c in at.caption)
    # the section's figures are cached per capture, layer and head: what is drawn after the moves is layer 2's
    # head 3 map and layer 3's head 1 pattern, equal to a capture of the folder made here
    import json

    from attnviz.figures import instant

    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    drawn = {s["layout"].get("title", {}).get("text", ""): s for s in specs}
    title = next(t for t in drawn if "implicit attention map" in t)
    assert title.startswith("Layer 2 (") and "head 3:" in title
    cap = attnviz.capture(str(root / "qwen3_next"), TEXT)
    want = np.asarray(cap.head_pattern(2, 3), dtype=np.float64)
    want[np.triu_indices(want.shape[0], 1)] = np.nan
    np.testing.assert_allclose(instant.array(drawn[title]["data"][0]["z"]), want, rtol=1e-5, atol=1e-7,
                               equal_nan=True)
    pattern = next(s for t, s in drawn.items() if t.startswith("Layer 3, head 1: the pattern"))
    np.testing.assert_allclose(instant.array(pattern["data"][0]["customdata"]), cap.head_pattern(3, 1), rtol=1e-5,
                               atol=1e-7, equal_nan=True)  # the hover values: the weights as they are


def _implicit_map(at: AppTest) -> tuple[str, np.ndarray]:
    """The title and the values of the implicit map the section drew."""
    import json

    from attnviz.figures import instant

    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    spec = next(s for s in specs if "implicit attention map" in s["layout"].get("title", {}).get("text", ""))
    return spec["layout"]["title"]["text"], instant.array(spec["data"][0]["z"])


def test_the_sections_figures_follow_the_text(root, monkeypatch):
    """The section's caches are keyed on the page's key (model, files' version, text, layers): after the text
    changes to another of the same length, the map drawn is the new text's, equal to a capture of it made here,
    and no longer the first text's."""
    folder = root / "qwen3_next"
    at = _page("heads.py", "heads", folder, monkeypatch)
    other = TEXT.replace("gate", "door")
    assert len(other) == len(TEXT) and other != TEXT  # a stale map would have the very same shape
    title, before = _implicit_map(at)
    at.text_area(key="heads_text").set_value(other).run()
    assert not at.exception, at.exception
    title_after, after = _implicit_map(at)
    assert title_after == title and title.startswith("Layer 0 (") and "head 0:" in title
    for text, drawn in ((TEXT, before), (other, after)):
        want = np.asarray(attnviz.capture(str(folder), text).head_pattern(0, 0), dtype=np.float64)
        want[np.triu_indices(want.shape[0], 1)] = np.nan
        np.testing.assert_allclose(drawn, want, rtol=1e-5, atol=1e-7, equal_nan=True)
    assert np.nanmax(np.abs(after - before)) > 1e-3


def test_the_sections_caches_are_keyed_on_the_pages_key(monkeypatch):
    """One key (model, version, text, layers) gives the very object built for it, built once; a key that differs
    in the text, the files' version or the layers builds its own."""
    from attnviz.ui import mixers_panel

    built, computed = [], []

    def build():
        built.append(None)
        return {"figure": len(built)}

    key = ("mixers-key-test", (), "a text", None)
    first = mixers_panel._figure(*key, "map", (0, 0), build)
    assert mixers_panel._figure(*key, "map", (0, 0), build) is first and len(built) == 1
    others = [("mixers-key-test", (), "another text", None), ("mixers-key-test", (("f", 2),), "a text", None),
              ("mixers-key-test", (), "a text", (0, 1))]
    made = [mixers_panel._figure(*k, "map", (0, 0), build) for k in others]
    assert len(built) == 4 and all(m is not first for m in made) and len({id(m) for m in made}) == 3
    assert mixers_panel._figure(*key, "map", (0, 1), build) is not first  # another head of the same capture

    monkeypatch.setattr(mixers_panel, "layer_stats", lambda capture, layer: computed.append(layer) or {"n": layer})
    assert mixers_panel._stats(*key, 2, None) == mixers_panel._stats(*key, 2, None) == {"n": 2}
    assert computed == [2]
    mixers_panel._stats(*others[0], 2, None)
    assert computed == [2, 2]


def test_heads_page_shows_a_model_without_attention_by_its_mixers(root, monkeypatch):
    at = _page("heads.py", "heads", root / "mamba2", monkeypatch)
    assert any(h.value == "Layers other than softmax attention" for h in at.subheader)
    assert at.selectbox(key="mixers_layer").options == ["0 (mamba2)", "1 (mamba2)"]
    assert not any(s.key == "heads_layer" for s in at.selectbox)


def test_heads_page_names_the_layers_it_cannot_map(root, monkeypatch):
    at = _page("heads.py", "heads", root / "lfm2", monkeypatch)
    assert any("layer 0 (conv)" in i.value for i in at.info)


def test_heads_page_draws_an_indexers_selection(root, monkeypatch):
    at = _page("heads.py", "heads", root / "deepseek_v32", monkeypatch)
    assert at.selectbox(key="mixers_indexed_layer").options == ["0", "1"]
    at.selectbox(key="mixers_indexed_head").set_value(2).run()
    assert not at.exception, at.exception
    assert any("fell outside the selection" in c.value for c in at.caption)


def test_sinks_page_shows_the_gate_beside_the_sink(root, monkeypatch):
    at = _page("sinks.py", "sinks", root / "qwen3_next", monkeypatch)
    assert any(h.value == "The output gate beside the sink" for h in at.subheader)
    at = _page("sinks.py", "sinks", root / "mamba2", monkeypatch)
    assert any("no softmax attention" in i.value for i in at.info)


def test_gate_sink_table_equals_a_recomputation(root):
    cap = attnviz.capture(str(root / "qwen3_next"), TEXT)
    alpha = np.stack([sink_scores(cap.layer_rows(layer), causal=True) for layer in cap.layers])
    table = gate_sink_table(cap, alpha)
    gate = cap.gates[3]  # [head, query, channel]
    n = cap.n_tokens
    for _, row in table.iterrows():
        h = int(row["head"])
        p = cap.head_pattern(3, h).astype(np.float64)
        assert row["sink α₀"] == pytest.approx(p[:, 0].sum() / n, abs=1e-6)  # every query sees token 0
        assert row["mean gate"] == pytest.approx(float(gate[h].double().mean()), abs=1e-6)
        assert row["share of gates under 0.1"] == pytest.approx(float((gate[h] < 0.1).double().mean()), abs=1e-12)
    assert list(table["layer"]) == [3] * 4 and torch.is_tensor(gate)
    mean, sparse = gate_table(cap, [3])[3]  # one layer's row of the table, as the Heads page reads it
    np.testing.assert_allclose(mean, [float(gate[h].double().mean()) for h in range(4)], atol=1e-6)
    assert gate_table(cap, []) == {}



def test_the_gate_beside_the_sink_is_computed_once_per_key(root, monkeypatch):
    """The Sinks page's gate-and-sink table, cached on the page's key (model, version, text, layers): the same key
    hands back the very object, computed once; another text computes its own, equal to a fresh gate_sink_table."""
    import pandas as pd

    from attnviz import sinks
    from attnviz.ui import mixers_panel

    folder, other = str(root / "qwen3_next"), "Sinks and gates: " + TEXT[::-1]
    caps = {text: attnviz.capture(folder, text) for text in (TEXT, other)}
    alphas = {text: sinks.capture_sink_scores(cap) for text, cap in caps.items()}
    computed = []
    fresh = gate_sink_table
    monkeypatch.setattr(mixers_panel, "gate_sink_table", lambda c, a: computed.append(c) or fresh(c, a))
    key = (folder, ("gate-sink-test",), TEXT, None)
    first = mixers_panel._gate_sinks(*key, caps[TEXT], alphas[TEXT])
    assert mixers_panel._gate_sinks(*key, caps[TEXT], alphas[TEXT]) is first and computed == [caps[TEXT]]
    second = mixers_panel._gate_sinks(folder, ("gate-sink-test",), other, None, caps[other], alphas[other])
    assert computed == [caps[TEXT], caps[other]]
    pd.testing.assert_frame_equal(second[0], fresh(caps[other], alphas[other]))
    pd.testing.assert_frame_equal(first[0], fresh(caps[TEXT], alphas[TEXT]))
    assert not np.allclose(second[0]["mean gate"], first[0]["mean gate"])  # another text: another table

PICKERS = {"heads.py": "heads", "sinks.py": "sinks", "experiments.py": "exp", "positional.py": "pos_meas",
           "softmax.py": "softmax", "variants.py": "variants", "corpus.py": "corpus"}


@pytest.mark.parametrize("page", sorted(PICKERS))
@pytest.mark.parametrize("name", ["qwen3_next", "mamba2"])
def test_every_page_with_a_model_picker_runs_on_a_hybrid_and_on_mamba2(root, monkeypatch, page, name):
    """A page either shows what it can of these models or says why not, never an exception."""
    _page(page, PICKERS[page], root / name, monkeypatch, text=None)


# every N x N map a pattern capture keeps, from tests/mixer_models' configs by hand: Qwen3-Next, 3 Gated DeltaNet
# layers x 4 value heads + 1 softmax layer x 4 heads; Kimi Linear, 1 delta rule layer x linear_num_heads (6) +
# 1 softmax layer x 4 heads
HAND_MAPS = {"qwen3_next": 3 * 4 + 1 * 4, "kimi_linear": 1 * 6 + 1 * 4}


def _saved_hybrid(tmp_path, monkeypatch, name: str):
    """(folder, tokens of TEXT, bytes its pattern capture holds: the softmax pattern and every linear map) for the
    tiny hybrid `name` saved as a local model folder."""
    from attnviz.tokenizer import byte_tokenizer

    folder = tmp_path / name
    mixer_models.build(name).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(tmp_path))
    dense = attnviz.capture(str(folder), TEXT, store="pattern")
    held = dense.pattern.nbytes + sum(dense.layer_rows(i, mixer="linear").nbytes for i in dense.linear_layers)
    return folder, dense.n_tokens, held


@pytest.mark.parametrize("name", sorted(HAND_MAPS))
def test_the_page_and_the_front_door_choose_one_store_for_a_hybrid(tmp_path, monkeypatch, name):
    """store="auto" on a hybrid, at the boundary of the dense store's bytes: the page's choice (ui.capture_store)
    and the front door's (attnviz.capture) are the same, and both count every map the pattern store keeps, the
    linear mixers' included, as a pattern capture holds them (read back) and as worked out by hand."""
    from attnviz import budget, ui
    from attnviz.capture import run

    folder, n, held = _saved_hybrid(tmp_path, monkeypatch, name)
    assert held == HAND_MAPS[name] * n * n * 4  # float32 maps
    monkeypatch.setattr(run, "MAX_CAPTURE_BYTES", held)  # the text of n tokens fits exactly; one more does not
    assert budget.BUDGET.limit // 2 >= held  # the page's own cap (half the memory budget) is not what decides
    for text, want in ((TEXT, "pattern"), (TEXT + "!", "qk")):
        page, _, n_page = ui.capture_store(str(folder), text)
        door = attnviz.capture(str(folder), text, store="auto")
        assert page == door.store == want and n_page == door.n_tokens
    assert n_page == n + 1


@pytest.mark.parametrize("name", sorted(HAND_MAPS))
def test_the_memory_estimate_of_a_hybrid_counts_the_maps_a_pattern_capture_holds(tmp_path, monkeypatch, name):
    """The budget's estimate of a pattern capture (ui.capture_need) counts its maps as the capture holds them: the
    linear mixers' at their own heads, the layers without a map not at all."""
    from attnviz import budget, ui
    from attnviz.capture import numbered_attention, uses_interface

    folder, n, held = _saved_hybrid(tmp_path, monkeypatch, name)
    loaded = ui.get_model(str(folder))
    modules = list(numbered_attention(loaded.model).values())
    without_maps = budget.capture_working_bytes(loaded.model.config, n, loaded.shape.layers, store="pattern", maps=0,
                                                uses_sdpa=not modules or uses_interface(modules[0]))
    assert ui.capture_need(loaded, n, None, "pattern") - without_maps == held == HAND_MAPS[name] * n * n * 4
