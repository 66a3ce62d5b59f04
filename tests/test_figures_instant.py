"""attnviz.figures.instant: frames carry what differs between stops and nothing else, a replay of the sliders gives
each stop's figure back, two sliders compose, the stops fit their budget, and the sliders fit the figure."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest

from attnviz.figures import instant


def _line(a: float) -> go.Figure:
    x = np.arange(5.0)
    fig = go.Figure([go.Scatter(x=x, y=a * x, name=f"a = {a:g}"), go.Scatter(x=x, y=np.ones(5), name="fixed")])
    return fig.update_layout(title=dict(text=f"slope {a:g}"), height=300, margin=dict(t=50, b=60),
                             shapes=[dict(type="line", x0=0, x1=1, y0=0, y1=1)])


def test_frames_carry_only_what_differs_and_replay_to_each_stop():
    values = [0.5, 1.0, 2.0]
    fig = instant.slider_over(_line, values, 1.0, parameter="a")
    assert [f.name for f in fig.frames] == ["0.5", "1", "2"]
    for frame, a in zip(instant.figure_dict(fig)["frames"], values):
        assert frame["traces"] == [0]  # the fixed trace is in no frame
        (data,) = frame["data"]
        assert set(data) == {"type", "y", "name"}  # x is the same at every stop
        np.testing.assert_array_equal(instant.array(data["y"]), a * np.arange(5.0))
        assert set(frame["layout"]) == {"title"}  # the shape is the same at every stop
    (slider,) = fig.layout.sliders
    assert slider.active == 1 and [s.label for s in slider.steps] == ["0.5", "1", "2"]
    assert all(s.method == "animate" and list(s.args[0]) == [f.name] for s, f in zip(slider.steps, fig.frames))
    for i, a in enumerate(values):
        state = instant.drawn(fig, [(0, i)])
        want = instant.figure_dict(_line(a))
        for got, expected in zip(state["data"], want["data"]):
            np.testing.assert_array_equal(instant.array(got["y"]), instant.array(expected["y"]))
            np.testing.assert_array_equal(instant.array(got["x"]), np.arange(5.0))
            assert got["name"] == expected["name"]
        assert state["layout"]["title"]["text"] == f"slope {a:g}"
        assert state["layout"]["sliders"][0]["active"] == i


def test_a_slider_takes_its_own_band_at_the_top_and_leaves_the_plot_area_as_it_was():
    before = _line(1.0)
    fig = instant.slider_over(_line, [1.0, 2.0], 1.0, parameter="a")
    assert fig.layout.height == before.layout.height + instant.SLIDER_PX
    assert fig.layout.margin.t == before.layout.margin.t + instant.SLIDER_PX
    assert fig.layout.margin.b == before.layout.margin.b
    plot_h = before.layout.height - before.layout.margin.t - before.layout.margin.b
    (slider,) = fig.layout.sliders
    # the slider's top sits right under the title's band, in pixels above the plot area
    assert (slider.y - 1) * plot_h == pytest.approx(fig.layout.margin.t - instant.TITLE_PX)
    assert slider.currentvalue.prefix == "a (in this chart) = "


def test_stops_that_differ_in_their_attributes_are_refused():
    def build(a):
        fig = _line(a)
        if a > 1:
            fig.data[0].update(opacity=0.5)
        return fig

    with pytest.raises(ValueError, match="differ in which attributes"):
        instant.slider_over(build, [1.0, 2.0], 1.0, parameter="a")


def test_a_group_slider_composes_with_a_frame_slider():
    """Two parameters: frames over a (each updates every group's trace), groups over b (one visible at a time)."""
    x = np.arange(3.0)
    a_values, b_values = [1.0, 2.0, 3.0], [10.0, 20.0]

    def traces(a):
        return [dict(type="scatter", x=x, y=np.zeros(3), name="shared")] + \
            [dict(type="scatter", x=x, y=a * b * x, name=f"a·b, b = {b:g}") for b in b_values]

    fig = go.Figure(data=traces(2.0), layout=dict(height=500, margin=dict(t=50, b=50), title=dict(text="b = 20")))
    instant.add_frame_slider(fig, [{"data": traces(a), "layout": {}} for a in a_values],
                             [f"{a:g}" for a in a_values], 1, parameter="a")
    instant.add_group_slider(fig, [[1], [2]], [f"{b:g}" for b in b_values], 1, parameter="b",
                             layouts=[{"title.text": f"b = {b:g}"} for b in b_values])
    assert [t.visible for t in fig.data] == [None, False, True]
    assert fig.layout.sliders[0].y < fig.layout.sliders[1].y  # the slider added last is on top
    for i, a in enumerate(a_values):
        for j, b in enumerate(b_values):
            for moves in ([(0, i), (1, j)], [(1, j), (0, i)]):  # either order
                state = instant.drawn(fig, moves)
                shown = [t for t in state["data"] if t.get("visible", True) and t["name"] != "shared"]
                assert len(shown) == 1
                np.testing.assert_array_equal(instant.array(shown[0]["y"]), a * b * x)
                assert state["layout"]["title"]["text"] == f"b = {b:g}"


def test_thinned_keeps_every_kth_stop_from_the_current_one_with_both_ends():
    assert instant.thinned(20, 11, stop_bytes=1.0, budget=100.0) == list(range(20))
    picked = instant.thinned(20, 11, stop_bytes=10.0, budget=115.0)
    assert picked == [0, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19] and len(picked) * 10.0 <= 115.0
    picked = instant.thinned(20, 11, stop_bytes=10.0, budget=90.0)
    assert 11 in picked and {0, 19} <= set(picked) and len(picked) * 10.0 <= 90.0


def test_window_is_consecutive_around_the_current_stop_within_the_budget():
    assert instant.window(10, 3, stop_bytes=1.0, most=64) == range(0, 10)
    assert instant.window(100, 50, stop_bytes=1.0, most=20) == range(40, 60)
    assert instant.window(100, 2, stop_bytes=1.0, most=20) == range(0, 20)
    assert instant.window(100, 99, stop_bytes=1.0, most=20) == range(80, 100)
    assert instant.window(100, 50, stop_bytes=30.0, most=20, budget=100.0) == range(49, 52)
    assert instant.window(100, 50, stop_bytes=1e9, most=20, budget=100.0) == range(50, 51)  # at least the current


def _heat(a: float) -> go.Figure:
    z = np.outer(np.arange(4.0), np.arange(3.0)) * a
    fig = go.Figure([go.Heatmap(z=z, x=np.arange(3), y=[f"row {i}" for i in range(4)], zmax=float(a)),
                     go.Scatter(x=np.arange(3, dtype=np.int64), y=np.full(3, a), name=f"a = {a:g}")])
    return fig.update_layout(title=dict(text=f"scale {a:g}"), height=300, margin=dict(t=50, b=60),
                             xaxis=dict(tickvals=np.arange(3) * a))


@pytest.mark.parametrize("build", [_line, _heat])
def test_frames_set_without_plotly_checks_send_the_same_json_as_with_them(build, monkeypatch):
    """The frames are set without plotly's per-attribute checks and with their arrays written once (_set_frames):
    the JSON Streamlit sends (to_dict, then plotly.io.to_json) must be what plotly's own checked setter gives."""
    import json

    import plotly.io as pio

    values = [0.5, 1.0, 2.0, 3.0]
    fast = instant.slider_over(build, values, 2.0, parameter="a")
    monkeypatch.setattr(instant, "_set_frames", lambda fig, frames: setattr(fig, "frames", frames))
    checked = instant.slider_over(build, values, 2.0, parameter="a")
    assert len(checked.frames) == len(values)
    sent = [json.loads(pio.to_json(fig.to_dict(), validate=False)) for fig in (fast, checked)]
    assert sent[0] == sent[1]  # the same JSON, up to the order of keys in an object
    assert "bdata" in json.dumps(sent[0]["frames"])  # the arrays travel as typed arrays either way
