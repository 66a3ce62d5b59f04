"""attnviz.figures.common: every figure carries plotly's plotly_white template, whatever set plotly's default."""

from __future__ import annotations

import json

import numpy as np
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


def _laid_out_by_updates(fig, *, reverse_y=False, log_x=False, log_y=False, **titles):
    """A figure laid out the way plotly's update calls lay it out (update_xaxes / update_yaxes, then apply_layout):
    what line_chart and heatmap built before they built their figures in one go."""
    if reverse_y:
        fig.update_yaxes(autorange="reversed")
    if log_x:
        fig.update_xaxes(type="log")
    if log_y:
        fig.update_yaxes(type="log")
    return common.apply_layout(fig, **titles)


def test_charts_built_in_one_go_equal_the_same_charts_laid_out_by_plotlys_updates():
    """line_chart, heatmap and an hline, each built in one go (laid_out), draw the JSON that plotly's own
    update calls and add_hline give the same traces: the same figure, five to ten times cheaper to build."""
    from attnviz.figures.common import PALETTE, heatmap, hline, line_chart

    def drawn(fig):
        return json.loads(fig.to_json())

    x = np.arange(10)
    series = {"a": np.sin(x), "b": np.cos(x)}
    for kw in ({}, {"title": "T", "x_title": "x", "y_title": "y", "height": 300}, {"log_x": True, "log_y": True},
               {"title": "t", "y_title": "only y"}):
        scale = {k: kw.pop(k) for k in ("log_x", "log_y") if k in kw}
        by_updates = go.Figure([go.Scatter(x=x, y=y, mode="lines", name=name,
                                           line=dict(color=PALETTE[i], dash="dash" if name == "b" else "solid"))
                                for i, (name, y) in enumerate(series.items())])
        got = line_chart(x, series, dashed=["b"], **kw, **scale)
        assert drawn(got) == drawn(_laid_out_by_updates(by_updates, **scale, **kw)), kw
    z = np.random.default_rng(0).random((4, 5))
    for kw in ({}, {"title": "H", "colorbar_title": "a long colour bar title", "reverse_y": False},
               {"height": 200, "x_title": "k"}):
        colorbar, reverse = kw.pop("colorbar_title", None), kw.pop("reverse_y", True)
        by_updates = go.Figure(go.Heatmap(z=z, x=list(range(5)), y=list(range(4)), colorscale="Viridis",
                                          colorbar=dict(title=dict(text=colorbar)) if colorbar else None,
                                          hovertemplate="row %{y}<br>column %{x}<br>value %{z:.4g}<extra></extra>"))
        got = heatmap(z, colorbar_title=colorbar, reverse_y=reverse, **kw)
        assert drawn(got) == drawn(_laid_out_by_updates(by_updates, reverse_y=reverse, **kw)), kw
    with_line = line_chart(x, {"a": series["a"]}, title="t", **hline(0.5, "half", dict(color="#868e96", dash="dot")))
    by_updates = _laid_out_by_updates(go.Figure(go.Scatter(x=x, y=series["a"], mode="lines", name="a",
                                                           line=dict(color=PALETTE[0], dash="solid"))), title="t")
    by_updates.add_hline(y=0.5, line=dict(color="#868e96", dash="dot"), annotation_text="half",
                         annotation_position="top right")
    assert drawn(with_line) == drawn(by_updates)


def test_laid_out_leaves_the_traces_it_is_given_as_they_were():
    """laid_out writes ticklabeloverflow into each colour bar of the figure it builds, not into the caller's dicts (an
    in-chart slider's stop, say, which must stay equal to its other stops)."""
    bar = {"type": "scatter", "x": [None], "y": [None], "mode": "markers",
           "marker": {"color": [0.0], "showscale": True, "colorbar": {"title": {"text": "v"}}}}
    heat = {"type": "heatmap", "z": np.eye(2)}
    given = json.dumps([bar, heat], default=str)
    fig = common.laid_out([bar, heat], {})
    assert json.dumps([bar, heat], default=str) == given
    assert fig.data[0].marker.colorbar.ticklabeloverflow == fig.data[1].colorbar.ticklabeloverflow == "allow"
    assert fig.data[0].marker.colorbar.title.text == "v"


def test_a_plotly_marker_inside_a_trace_dict_keeps_its_settings():
    marker = go.scatter.Marker(color=[0.5], colorscale="Viridis", showscale=True, colorbar=dict(title=dict(text="v")))
    trace = {"type": "scatter", "x": [None], "y": [None], "mode": "markers", "marker": marker}
    fig = common.laid_out([trace], {})
    assert trace["marker"] is marker and marker.colorbar.ticklabeloverflow is None
    drawn = fig.data[0].marker
    assert drawn.colorscale == marker.colorscale and drawn.colorbar.title.text == "v"
    assert drawn.colorbar.ticklabeloverflow == "allow"
