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
