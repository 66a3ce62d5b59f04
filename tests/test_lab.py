"""The Toy lab's figures and page."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnviz import lab


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """Every saved model goes to a temporary cache."""
    monkeypatch.setenv("ATTNVIZ_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_chance_is_a_legend_line_and_no_label_sits_on_the_curves():
    """Issue 14: the 'chance' label was drawn on the plot, where the loss curve (which sits at chance for its
    first steps) ran over it. Both loss charts draw chance as a dashed line at log(letters), named in the legend
    with its value, and put no text on the plot."""
    from attnviz.figures.lab import best_heads_curve, loss_curve

    chance = lab.chance_loss(8)
    assert chance == pytest.approx(math.log(8))
    losses = np.r_[np.full(50, chance), np.linspace(chance, 0.1, 50)]
    figs = [loss_curve(losses, chance, total_steps=100),
            best_heads_curve([10, 50, 100], [chance, chance, 0.1], {"induction": [0.1, 0.2, 0.9]}, chance,
                             total_steps=100)]
    for fig in figs:
        assert not fig.layout.annotations
        line = next(t for t in fig.data if t.name.startswith("chance"))
        assert f"{math.log(8):.2f} nats" in line.name and line.line.dash == "dash"
        np.testing.assert_allclose(line.y, [math.log(8)] * 2)
        assert list(line.x) == [0, 100]
        assert fig.layout.legend.y < 0  # under the plot, clear of the title


def test_variant_maps_share_one_colour_scale_and_label_both_axes():
    from attnviz.figures.lab import variant_maps

    tokens = ["<bos>", "a", "b", "a"]
    rng = np.random.default_rng(0)
    maps = {name: np.tril(rng.random((4, 4))) for name in lab.VARIANTS}
    fig = variant_maps(tokens, maps, {"softmax": 1.0, "off_by_one": 0.786, "learned_sink": 0.5, "gated": 0.999},
                       layer=1, head=0)
    heatmaps = [t for t in fig.data if t.type == "heatmap"]
    assert len(heatmaps) == 4 and {t.coloraxis for t in heatmaps} == {"coloraxis"}
    assert (fig.layout.coloraxis.cmin, fig.layout.coloraxis.cmax) == (0.0, 1.0)
    for trace, name in zip(heatmaps, lab.VARIANTS):
        np.testing.assert_array_equal(np.asarray(trace.z), maps[name])
        assert list(trace.x) == list(trace.y) == ["<bos>", "a ·1", "b", "a ·3"]
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["softmax: 100% on tokens", "off by one: 79% on tokens", "learned sink: 50% on tokens",
                      "gated: 100% on tokens"]
    assert fig.layout.title.text == "Layer 1, head 0 of each variant"
    # two by two: key tokens under the bottom row, query tokens left of the left column
    assert [fig.layout[f"xaxis{s}"].title.text for s in ("", "2", "3", "4")] == [None, None, "key token", "key token"]
    assert [fig.layout[f"yaxis{s}"].title.text for s in ("", "2", "3", "4")] == ["query token", None] * 2
    assert all(fig.layout[f"yaxis{s}"].autorange == "reversed" for s in ("", "2", "3", "4"))  # query 0 on top


def _plotly_values(y):
    """plotly sends arrays as lists or as typed arrays {"dtype", "bdata" (base64), "shape"}."""
    import base64

    if isinstance(y, dict):
        out = np.frombuffer(base64.b64decode(y["bdata"]), dtype=np.dtype(y["dtype"])).astype(float)
        return out.reshape([int(n) for n in str(y["shape"]).split(",")]) if "shape" in y else out
    return np.asarray(y, dtype=float)


def _lab_page():
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app_pages" / "toy_lab.py"),
                             default_timeout=300)


def test_page_trains_the_four_variants_side_by_side(cache, attention_of):
    at = _lab_page()
    at.session_state["lab_task"] = "text"
    at.session_state["lab_steps"] = 20
    at.session_state["lab_width"] = 32
    at.session_state["lab_text_len"] = 16
    at.run()
    assert not at.exception, at.exception
    at.button(key="lab_compare").click().run()
    assert not at.exception, at.exception
    comparison = at.session_state["lab_comparison"]
    snaps = comparison.join(timeout=240)
    assert all(s.status == "done" for s in snaps.values()), {n: s.status for n, s in snaps.items()}
    at.run()
    assert not at.exception, at.exception
    import json

    def figures():
        return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]

    sink_fig = next(f for f in figures() if "Sink metric over training" in f["layout"]["title"]["text"])
    shown = {t["name"]: _plotly_values(t["y"]) for t in sink_fig["data"] if t["name"] in lab.VARIANTS}
    assert set(shown) == set(lab.VARIANTS)
    for name, y in shown.items():
        np.testing.assert_allclose(y, [100 * c.sink_rate for c in snaps[name].checkpoints])
    assert {s.saved_as for s in snaps.values()} == {s.config.default_name() for s in snaps.values()}
    assert all((cache / "trained" / s.saved_as / lab.LAB_FILE).exists() for s in snaps.values())

    # the four variants' maps: one head each, on the same 16-token row, from each model's own output_attentions
    ids = [lab.BOS_ID] + list("Four score and ".encode())
    for layer, head in ((1, 0), (0, 3)):  # the default (last layer, head 0), then another head
        at.selectbox(key="lab_map_layer").set_value(layer)
        at.selectbox(key="lab_map_head").set_value(head).run()
        assert not at.exception, at.exception
        title = f"Layer {layer}, head {head} of each variant"
        maps = next(f for f in figures() if f["layout"]["title"]["text"] == title)
        heatmaps = [t for t in maps["data"] if t["type"] == "heatmap"]
        assert len(heatmaps) == len(lab.VARIANTS)
        for trace, (name, run) in zip(heatmaps, comparison.runs.items()):
            assert name.replace("_", " ") in trace["hovertemplate"]
            np.testing.assert_allclose(_plotly_values(trace["z"]), attention_of(run.model, ids)[layer, head],
                                       rtol=0, atol=1e-6)


def test_page_refuses_a_variant_without_rope():
    at = _lab_page()
    at.session_state["lab_attention"] = "gated"
    at.session_state["lab_positional"] = "alibi"
    at.run()
    assert not at.exception, at.exception
    assert any("choose rope positions" in e.value for e in at.error)
    assert at.button(key="lab_train").disabled and at.button(key="lab_compare").disabled
