"""attnviz.figures.one_draw: a figure written so that the browser draws it once keeps every number and every
attribute it had, and carries no template, no typed array and a fixed datarevision (what plotly's diff compares)."""

from __future__ import annotations

import json

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from attnviz.figures import common, instant, one_draw


def panels() -> go.Figure:
    """Two panels (a line and bars), a horizontal line with its label, a legend: what the pages' charts use."""
    rng = np.random.default_rng(0)
    layout = common.grid_layout(1, 2, ["left", "right"])
    extra = common.hline(0.5, "half", dict(color="gray", dash="dot"))
    layout.update(shapes=extra["shapes"], annotations=layout["annotations"] + extra["annotations"])
    return common.laid_out([go.Scatter(x=np.arange(9), y=rng.standard_normal(9), name="a"),
                            go.Bar(x=np.arange(3), y=np.array([1.0, 2.0, 3.5]), name="b", xaxis="x2", yaxis="y2")],
                           layout, title="Two panels", x_title="position", y_title="value")


def heat() -> go.Figure:
    rng = np.random.default_rng(1)
    return common.heatmap(rng.random((7, 5)), x_labels=list("abcde"), title="A map", x_title="key",
                          y_title="query", colorbar_title="weight")


def shared_scale() -> go.Figure:
    """Two maps in two panels over one colour axis (its colour bar styled by Streamlit's theme), as the MHA, GQA,
    MQA maps are drawn."""
    rng = np.random.default_rng(2)
    layout = common.grid_layout(1, 2, ["one", "two"])
    layout["coloraxis"] = dict(colorscale=common.ATTENTION_SCALE, cmin=0, cmax=1, colorbar=dict(title=dict(text="w")))
    return common.laid_out([go.Heatmap(z=rng.random((4, 4)), coloraxis="coloraxis"),
                            go.Heatmap(z=rng.random((4, 4)), coloraxis="coloraxis", xaxis="x2", yaxis="y2")],
                           layout, title="Shared scale")


def with_frames() -> go.Figure:
    """A line with an in-chart slider over three stops (instant.add_frame_slider)."""
    stops = [{"data": [{"type": "scatter", "x": np.arange(5), "y": np.arange(5) * k}], "layout": {}}
             for k in (1.0, 2.0, 3.0)]
    fig = common.laid_out([go.Scatter(x=np.arange(5), y=np.arange(5) * 2.0)], title="slope", height=400)
    return instant.add_frame_slider(fig, stops, ["1", "2", "3"], 1, parameter="slope")


def with_steps() -> go.Figure:
    """A map with an in-chart slider whose steps change its values, its colour bar's title and an axis title
    (plotly.update steps, their arrays as typed arrays)."""
    def build(k: float) -> go.Figure:
        return common.heatmap(np.arange(12.0).reshape(3, 4) * k, title="scaled", x_title=f"key (x{k:g})",
                              y_title="query", colorbar_title=f"value x{k:g}", height=400)
    return instant.slider_over(build, [1.0, 2.0, 3.0], 2.0, parameter="k")


FIGURES = {"panels": panels, "heat": heat, "shared": shared_scale, "frames": with_frames, "steps": with_steps}


def as_sent(fig) -> dict:
    """A figure as the pages send it (ui.plot: ui.steady.sendable, then st.plotly_chart's plotly.io.to_json), read
    back: what a page's chart spec is compared with."""
    from attnviz.ui import steady

    return json.loads(pio.to_json(steady.sendable(fig)[0], validate=False))


def plain(value):
    """A figure dict's values as plain Python: typed arrays decoded (instant.array), arrays as lists (what
    tests/test_snippets.py compares too)."""
    if isinstance(value, dict) and "bdata" in value:
        return instant.array(value).tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _within(small, big, path="") -> None:
    """Every key of `small` is in `big` with the same value (dicts key by key, lists item by item)."""
    if isinstance(small, dict):
        assert isinstance(big, dict), path
        for key, value in small.items():
            assert key in big, f"{path}.{key} dropped"
            _within(value, big[key], f"{path}.{key}")
    elif isinstance(small, list):
        assert isinstance(big, list) and len(big) == len(small), path
        for i, (a, b) in enumerate(zip(small, big)):
            _within(a, b, f"{path}[{i}]")
    else:
        assert big == small, f"{path}: {big!r} != {small!r}"


def _walk(value, path=""):
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _walk(item, f"{path}[{i}]")


@pytest.mark.parametrize("name", FIGURES)
def test_every_number_and_attribute_is_kept(name):
    fig = FIGURES[name]()
    original = plain(json.loads(pio.to_json(fig, validate=False)))
    sent = plain(json.loads(json.dumps(one_draw.spec(fig))))  # what st.plotly_chart writes, read back
    for before, after in zip(original["data"], sent["data"], strict=True):
        _within(before, after, "data")
    layout = {k: v for k, v in original["layout"].items() if k != "template"}
    _within(layout, sent["layout"], "layout")
    assert sent.get("frames") == original.get("frames")


@pytest.mark.parametrize("name", FIGURES)
def test_no_template_no_typed_array_and_a_fixed_datarevision(name):
    fig = FIGURES[name]()
    sent = json.loads(json.dumps(one_draw.spec(fig)))
    assert "template" not in sent["layout"]
    assert sent["layout"]["datarevision"] == one_draw.DATAREVISION
    typed = [p for part in ("data", "layout") for p, v in _walk(sent[part], part)
             if isinstance(v, dict) and "bdata" in v and not p.startswith("layout.sliders")]
    assert typed == []  # a slider's steps keep theirs: plotly compares them as values, not by identity
    assert sent == json.loads(json.dumps(one_draw.spec(fig))), "the spec is not the same from one rerun to the next"
    go.Figure(sent)  # valid to plotly.py too (the Figure files and a reader of the page's spec build it again)


@pytest.mark.parametrize("name", FIGURES)
def test_plotly_writes_the_pages_json_with_orjson_and_it_reads_back_the_same(name):
    """Streamlit sends a chart through plotly.io.to_json, which takes orjson when it is installed (requirements.txt:
    3x faster); a NaN, a typed array and a spec's lists read back as they do from the json module's text."""
    from plotly.io._json import JsonConfig

    JsonConfig.validate_orjson()  # installed, and the engine plotly's "auto" picks
    fig = FIGURES[name]()
    fig.add_scatter(x=[0.0, 1.0], y=[float("nan"), 2.0], xaxis="x", yaxis="y")
    for sent in (fig, one_draw.spec(fig)):
        as_orjson = json.loads(pio.to_json(sent, validate=False, engine="orjson"))
        assert as_orjson == json.loads(pio.to_json(sent, validate=False, engine="json"))
        y = np.asarray(plain(as_orjson["data"][-1]["y"]), dtype=float)  # a list with null, or a typed array
        assert np.isnan(y[0]) and y[1] == 2.0


def test_the_template_defaults_are_written_in():
    """plotly_white's trace defaults under each trace, its axis defaults (with Streamlit's theme) in every axis the
    figure has, its annotation defaults in every annotation, and the figure's own values over them."""
    fig = panels()
    sent = one_draw.spec(fig)
    white = pio.templates["plotly_white"].to_plotly_json()
    bar_marker_line = white["data"]["bar"][0]["marker"]["line"]
    assert sent["data"][1]["marker"]["line"] == bar_marker_line
    for axis in ("xaxis", "xaxis2", "yaxis", "yaxis2"):
        assert sent["layout"][axis]["tickfont"] == one_draw.STREAMLIT_LIGHT[axis[:5]]["tickfont"], axis
        assert sent["layout"][axis]["linecolor"] == white["layout"][axis[:5]]["linecolor"], axis
    assert sent["layout"]["xaxis"]["title"]["text"] == "position"  # the figure's own, over the theme's title font
    arrow = white["layout"]["annotationdefaults"]["arrowcolor"]
    assert all(a["arrowcolor"] == arrow for a in sent["layout"]["annotations"])
    assert sent["layout"]["margin"]["l"] == common.MARGIN_LEFT and sent["layout"]["margin"]["pad"] == 8


def test_numbers_counts_the_arrays():
    fig = common.heatmap(np.zeros((40, 30)))
    stops = len(fig.data[0].colorscale)  # each a (position, colour) pair
    assert one_draw.numbers(fig) == 40 * 30 + 40 + 30 + 2 * stops
    assert one_draw.numbers(common.heatmap(np.zeros((300, 300)))) > one_draw.LIST_LIMIT


def test_the_page_sends_small_figures_as_specs_and_others_as_they_are(monkeypatch):
    """ui.plot's choice (ui.steady.sendable): a figure within LIST_LIMIT goes as its spec, through the same plotly
    calls st.plotly_chart makes, with no Streamlit theme; a larger one, or any on a dark page, as it is."""
    import plotly.tools

    from attnviz.ui import steady

    monkeypatch.setattr(steady, "_dark", lambda: False)
    small = heat()
    sent, theme = steady.sendable(small)
    assert theme is None
    as_streamlit_sends_it = pio.to_json(plotly.tools.return_figure_from_figure_or_data(sent, True), validate=False)
    assert json.loads(as_streamlit_sends_it) == json.loads(json.dumps(one_draw.spec(small)))
    big = common.heatmap(np.zeros((300, 300)))
    sent, theme = steady.sendable(big)
    assert sent is big and theme == "streamlit"
    monkeypatch.setattr(steady, "_dark", lambda: True)
    sent, theme = steady.sendable(small)
    assert sent is small and theme == "streamlit"
