"""attnviz.figures.common: every figure carries plotly's plotly_white template, whatever set plotly's default."""

from __future__ import annotations

import json

import plotly.graph_objects as go
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
