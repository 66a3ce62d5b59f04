"""attnviz.figures.common: every figure carries plotly's plotly_white template, whatever set plotly's default."""

from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest
import plotly.io as pio

from attnviz.figures import common

PLOTLY_WHITE = json.loads(go.Figure(layout=dict(template="plotly_white")).to_json())["layout"]["template"]


def _template(fig):
    return json.loads(fig.to_json())["layout"]["template"]


def test_figures_carry_the_plotly_white_template_even_after_another_default_was_set(monkeypatch):
    import streamlit  # noqa: F401  (streamlit makes its own template plotly's default when imported)

    monkeypatch.setattr(pio.templates, "default", "streamlit")
    first = common.apply_layout(go.Figure(go.Scatter(x=[0, 1], y=[1, 0])), title="t", x_title="x", y_title="y")
    assert _template(first) == PLOTLY_WHITE
    second = common.apply_layout(go.Figure(go.Scatter(x=[0, 1], y=[1, 0])), title="t")
    assert _template(second) == PLOTLY_WHITE
    layout = json.loads(first.to_json())["layout"]
    assert layout["xaxis"]["title"]["text"] == "x" and layout["yaxis"]["title"]["text"] == "y"


def test_margins_make_room_for_colour_bars_and_long_labels():
    """A chart draws once when its margins already hold what automargin would add: the right margin a colour bar
    with its title, the left and bottom margins the longest tick labels (slanted ones by their height)."""
    plain = common.apply_layout(go.Figure(go.Scatter(x=[0, 1], y=[1, 0])), title="t")
    assert plain.layout.margin.r == common.MARGIN_RIGHT
    short = common.heatmap([[0.0, 1.0]], colorbar_title="w")
    long = common.heatmap([[0.0, 1.0]], colorbar_title="a much longer colour bar title")
    assert short.layout.margin.r == common.MARGIN_RIGHT_COLORBAR < long.layout.margin.r
    shared = go.Figure(go.Heatmap(z=[[0, 1]], coloraxis="coloraxis"))
    shared.update_layout(coloraxis=dict(colorbar=dict(title=dict(text="weight"))))
    assert common.apply_layout(shared).layout.margin.r == common.MARGIN_RIGHT_COLORBAR  # a shared colour axis too
    labels = ["0: a", "1: a token with a long name"]
    fig = common.label_margins(common.heatmap([[0.0, 1.0], [1.0, 0.0]]), x_labels=labels, y_labels=labels,
                               x_angle=60)
    assert fig.layout.margin.l > common.MARGIN_LEFT and fig.layout.margin.b > common.MARGIN_BOTTOM
    flat = common.label_margins(common.heatmap([[0.0, 1.0], [1.0, 0.0]]), x_labels=labels, x_angle=0)
    assert flat.layout.margin.b < fig.layout.margin.b  # horizontal labels take one line
    short_labels = common.label_margins(common.heatmap([[0.0]]), y_labels=["L1"])
    assert short_labels.layout.margin.l == common.MARGIN_LEFT  # never narrower than the default


def test_grid_layout_is_make_subplots_layout():
    """The one-go grid matches plotly's own make_subplots: axis domains, anchors and the panel titles."""
    from plotly.subplots import make_subplots

    for rows, cols, h, v in ((2, 3, 0.1, 0.22), (1, 3, 0.1, 0.2), (2, 2, 0.12, 0.2)):
        titles = [f"panel {i}" for i in range(rows * cols)]
        ours = common.grid_layout(rows, cols, titles, horizontal_spacing=h, vertical_spacing=v)
        theirs = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=h,
                               vertical_spacing=v).to_dict()["layout"]
        for name in theirs:
            if name.startswith(("xaxis", "yaxis")):
                assert ours[name]["anchor"] == theirs[name]["anchor"], name
                assert ours[name]["domain"] == pytest.approx(theirs[name]["domain"]), name
        assert {k for k in ours if k.startswith(("xaxis", "yaxis"))} == \
            {k for k in theirs if k.startswith(("xaxis", "yaxis"))}
        for a, b in zip(ours["annotations"], theirs["annotations"]):
            assert (a["text"], a["x"], a["y"]) == (b["text"], pytest.approx(b["x"]), pytest.approx(b["y"]))
