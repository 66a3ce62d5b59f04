"""attnviz.figures.instant: frames carry what differs between stops and nothing else, a replay of the sliders gives
each stop's figure back, two sliders compose, the stops fit their budget, and the sliders fit the figure."""

from __future__ import annotations

import json

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from attnviz.figures import instant


def _line(a: float) -> go.Figure:
    x = np.arange(5.0)
    fig = go.Figure([go.Scatter(x=x, y=a * x, name=f"a = {a:g}"), go.Scatter(x=x, y=np.ones(5), name="fixed")])
    return fig.update_layout(title=dict(text=f"slope {a:g}"), height=300, margin=dict(t=50, b=60),
                             shapes=[dict(type="line", x0=0, x1=1, y0=0, y1=1)])


def _replays_to_each_stop(fig: go.Figure, values) -> None:
    for i, a in enumerate(values):
        state = instant.drawn(fig, [(0, i)])
        want = instant.figure_dict(_line(a))
        for got, expected in zip(state["data"], want["data"]):
            np.testing.assert_array_equal(instant.array(got["y"]), instant.array(expected["y"]))
            np.testing.assert_array_equal(instant.array(got["x"]), np.arange(5.0))
            assert got["name"] == expected["name"]
        assert state["layout"]["sliders"][0]["active"] == i


def test_a_step_that_changes_the_layout_updates_only_what_differs_and_replays_to_each_stop():
    values = [0.5, 1.0, 2.0]
    fig = instant.slider_over(_line, values, 1.0, parameter="a")
    assert not fig.frames
    (slider,) = instant.figure_dict(fig)["layout"]["sliders"]
    assert slider["active"] == 1 and [s["label"] for s in slider["steps"]] == ["0.5", "1", "2"]
    for step, a in zip(slider["steps"], values):
        assert step["method"] == "update"
        restyle, relayout, traces = step["args"]
        assert traces == [0]  # the fixed trace is in no step
        assert set(restyle) == {"y", "name"}  # x is the same at every stop
        np.testing.assert_array_equal(instant.array(restyle["y"][0]), a * np.arange(5.0))
        assert relayout == {"title.text": f"slope {a:g}"}  # the shape is the same at every stop
    _replays_to_each_stop(fig, values)
    for i, a in enumerate(values):
        assert instant.drawn(fig, [(0, i)])["layout"]["title"]["text"] == f"slope {a:g}"


def test_a_step_that_changes_only_lines_is_a_frame_of_what_differs_and_replays_to_each_stop():
    values = [0.5, 1.0, 2.0]
    fig = instant.slider_over(lambda a: _line(a).update_layout(title_text="slope"), values, 1.0, parameter="a")
    assert [f.name for f in fig.frames] == ["0.5", "1", "2"]
    for frame, a in zip(instant.figure_dict(fig)["frames"], values):
        assert frame["traces"] == [0]
        (data,) = frame["data"]
        assert set(data) == {"type", "y", "name"}
        np.testing.assert_array_equal(instant.array(data["y"]), a * np.arange(5.0))
        assert not frame.get("layout")
    steps = fig.layout.sliders[0].steps
    assert all(s.method == "animate" and list(s.args[0]) == [f.name] for s, f in zip(steps, fig.frames))
    _replays_to_each_stop(fig, values)


def test_an_update_sets_nested_attributes_leaf_by_leaf_and_gives_every_listed_trace_a_value():
    """A nested attribute that changes is set by its dotted path, so what the figure has beside it (a theme's
    settings) stays, as plotly's frames merge; a trace listed for another trace's path gets its own value there."""
    def build(a):
        return go.Figure([go.Heatmap(z=[[a, 1.0]], colorbar=dict(title=dict(text=f"a = {a:g}"), len=0.5)),
                          go.Scatter(x=[0, 1], y=[a, a], marker=dict(color="red"))],
                         layout=dict(height=300, xaxis=dict(title=dict(text=f"x at {a:g}"), showgrid=False)))
    fig = instant.slider_over(build, [1.0, 2.0], 1.0, parameter="a")
    restyle, relayout, traces = fig.layout.sliders[0].steps[0].args
    assert traces == (0, 1) and set(restyle) == {"z", "colorbar.title.text", "y"}  # not the colour bar's len
    assert list(restyle["colorbar.title.text"]) == ["a = 1", None]  # the scatter has no colour bar: left unset
    assert restyle["y"][0] is None  # the heatmap has no y
    assert relayout == {"xaxis.title.text": "x at 1"}
    state = instant.drawn(fig, [(0, 0)])
    assert state["data"][0]["colorbar"] == {"title": {"text": "a = 1"}, "len": 0.5}
    assert "colorbar" not in state["data"][1] and state["data"][1]["marker"] == {"color": "red"}
    assert state["layout"]["xaxis"] == {"title": {"text": "x at 1"}, "showgrid": False}


def test_a_path_set_at_some_stops_only_is_refused():
    """plotly would unset it with null and keep what setting it implied (a fixed range turns autorange off), and a
    container empty at one stop and filled at another would be a parent and its child in one update."""
    def ranged(a):
        fig = go.Figure(go.Heatmap(z=[[a, 1.0]]), layout=dict(height=300, xaxis=dict(title=dict(text="x"))))
        return fig.update_xaxes(range=[0, a]) if a > 1 else fig

    with pytest.raises(ValueError, match="'xaxis.range'"):
        instant.slider_over(ranged, [1.0, 2.0], 1.0, parameter="a")
    fig = go.Figure(go.Heatmap(z=[[1.0, 1.0]]), layout=dict(height=300))
    stops = [{"data": [{"type": "heatmap", "z": [[a, 1.0]], "colorbar": colorbar}], "layout": {}}
             for a, colorbar in ((1.0, {}), (2.0, {"title": {"text": "a = 2"}}))]
    with pytest.raises(ValueError, match="colorbar"):
        instant.add_frame_slider(fig, stops, ["1", "2"], 0, parameter="a")


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
    assert [t.visible for t in fig.data] == [None, None, None]  # hidden by style, restyled in place
    assert [(t.opacity, t.showlegend, t.hoverinfo) for t in fig.data] == [(None, None, None), (0, False, "skip"),
                                                                          (1, True, "all")]
    assert {s.method for s in fig.layout.sliders[1].steps} == {"update"} and all(
        set(s.args[0]) == set(instant.HIDDEN) for s in fig.layout.sliders[1].steps)  # no `visible`: no full redraw
    assert fig.layout.sliders[0].y < fig.layout.sliders[1].y  # the slider added last is on top
    for i, a in enumerate(a_values):
        for j, b in enumerate(b_values):
            for moves in ([(0, i), (1, j)], [(1, j), (0, i)]):  # either order
                state = instant.drawn(fig, moves)
                shown = [t for t in state["data"] if instant.shown(t) and t["name"] != "shared"]
                assert len(shown) == 1 and shown[0]["showlegend"] and shown[0]["hoverinfo"] == "all"
                hidden = [t for t in state["data"] if not instant.shown(t)]
                assert len(hidden) == 1 and {k: hidden[0][k] for k in instant.HIDDEN} == instant.HIDDEN
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


def _fixed_title(a: float) -> go.Figure:
    return _line(a).update_layout(title_text="slope")


def test_frames_set_without_plotly_checks_send_the_same_json_as_with_them(monkeypatch):
    """The frames are set without plotly's per-attribute checks and with their arrays written once (_set_frames):
    the JSON Streamlit sends (to_dict, then plotly.io.to_json) must be what plotly's own checked setter gives."""
    values = [0.5, 1.0, 2.0, 3.0]
    fast = instant.slider_over(_fixed_title, values, 2.0, parameter="a")
    monkeypatch.setattr(instant, "_set_frames", lambda fig, frames: setattr(fig, "frames", frames))
    checked = instant.slider_over(_fixed_title, values, 2.0, parameter="a")
    assert len(checked.frames) == len(values)
    sent = [json.loads(pio.to_json(fig.to_dict(), validate=False)) for fig in (fast, checked)]
    assert sent[0] == sent[1]  # the same JSON, up to the order of keys in an object
    assert "bdata" in json.dumps(sent[0]["frames"])  # the arrays travel as typed arrays either way


@pytest.mark.parametrize("build", [_line, _heat, _fixed_title])
def test_what_the_page_sends_replays_as_the_figure_does(build):
    """The JSON Streamlit sends, read back, draws at every stop what the figure draws (its steps' arrays as typed
    arrays, bit for bit)."""
    values = [0.5, 1.0, 2.0, 3.0]
    fig = instant.slider_over(build, values, 2.0, parameter="a")
    sent = json.loads(pio.to_json(fig.to_dict(), validate=False))
    assert "bdata" in json.dumps(sent["layout"]["sliders"] if build is not _fixed_title else sent["frames"])
    for i in range(len(values)):
        got, want = instant.drawn(sent, [(0, i)]), instant.drawn(fig, [(0, i)])
        for a, b in zip(got["data"], want["data"], strict=True):
            assert a.keys() == b.keys()
            for key in a:
                np.testing.assert_array_equal(instant.array(a[key]) if key in "xyz" else a[key],
                                              instant.array(b[key]) if key in "xyz" else b[key])
        assert got["layout"].get("title") == want["layout"].get("title")


def _outside(fig: go.Figure) -> list[str]:
    """Every stop of the figure's first slider replayed (instant.drawn): the traces (lines, bars, heatmaps) with an x
    or y value outside the range their axis is given at that stop (in log10 on a log axis), or whose values change
    between stops on an axis with no range. A line of text (mode "text") is left out: its point is where the text
    is anchored, over a panel if it is a title."""
    states = [instant.drawn(fig, [(0, step)]) for step in range(len(fig.layout.sliders[0].steps))]
    out = []
    for i, trace in enumerate(states[0]["data"]):
        if trace.get("mode") == "text":
            continue
        for letter in ("x", "y"):
            if trace.get("type") not in instant.HELD + ("heatmap",) or letter not in trace:
                continue
            name = (trace.get(f"{letter}axis") or letter).replace(letter, f"{letter}axis", 1)
            values = [instant.array(state["data"][i][letter]) for state in states]
            if values[0].dtype.kind not in "iuf":
                continue
            ranges = [state["layout"].get(name, {}).get("range") or fig.layout[name].range for state in states]
            if ranges[0] is None:
                if any(not np.array_equal(values[0], v, equal_nan=True) for v in values):
                    out.append(f"{trace.get('name')} {letter}: changes, no range")
                continue
            for step, (v, span) in enumerate(zip(values, ranges)):
                v = v.astype(np.float64)[np.isfinite(v.astype(np.float64))]
                v = np.log10(v[v > 0]) if fig.layout[name].type == "log" else v
                if v.size and (v.min() < min(span) or v.max() > max(span)):
                    out.append(f"{trace.get('name')} {letter} at stop {step}: {v.min():.3g}..{v.max():.3g} outside "
                               f"{list(span)}")
    return out


def test_the_axes_hold_every_stops_values_as_plotly_animate_never_autoranges_again():
    """A linear, a log and a bar panel whose values change with the slider get ranges that hold every stop (the
    values' own extremes, in powers of ten on the log axis, the bars' base 0 included); an axis given a range
    keeps it, and one whose values never change is left to plotly's autorange."""
    from plotly.subplots import make_subplots

    def build(a: float) -> go.Figure:
        fig = make_subplots(rows=1, cols=4)
        x = np.arange(1.0, 6.0)
        fig.add_trace(go.Scatter(x=x, y=a * x - 3, name="linear"), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=x ** a, name="log"), row=1, col=2)
        fig.add_trace(go.Bar(x=x, y=a + x, name="bars"), row=1, col=3)
        fig.add_trace(go.Scatter(x=x, y=x, name="fixed"), row=1, col=4)
        fig.add_trace(go.Scatter(x=x, y=-a * x, name="set range"), row=1, col=1)
        fig.update_yaxes(type="log", row=1, col=2)
        return fig.update_layout(height=400, yaxis3=dict(range=None))

    slopes = [0.5, 1.0, 4.0]
    fig = instant.slider_over(build, slopes, 1.0, parameter="a")
    assert _outside(fig) == []
    low, high = min(a * 1 - 3 for a in slopes + [-1]) , max(a * 5 - 3 for a in slopes)  # the set-range trace: -a x
    low = min(low, -4.0 * 5)
    assert fig.layout.yaxis.range[0] < low and fig.layout.yaxis.range[1] > high
    assert fig.layout.yaxis2.range[1] == pytest.approx(np.log10(5.0 ** 4.0) + instant.PAD * np.log10(5.0 ** 4.0))
    assert fig.layout.yaxis3.range[0] < 0 < fig.layout.yaxis3.range[1]  # the bars' base
    assert fig.layout.yaxis4.range is None  # nothing changes there: plotly's own autorange
    kept = instant.slider_over(lambda a: build(a).update_layout(yaxis=dict(range=[-100, 100])), slopes, 1.0,
                               parameter="a")
    assert list(kept.layout.yaxis.range) == [-100, 100]


def test_the_apps_frame_sliders_keep_every_stop_inside_their_axes():
    """The charts whose curves change with their slider: the Softmax curves against d_k over T (whose stops left
    the axes drawn for T = 1 before), the sinusoid's dot products over d_model, and the kernel's step view."""
    from attnviz import positional
    from attnviz.figures import positional as pos_figs
    from attnviz.kernels import steps_view
    from attnviz.ui import softmax as ui_softmax

    assert _outside(ui_softmax.sweeps_chart(64, 0, 1.0)) == []
    offsets = np.arange(0, 64)
    dots = {d: positional.sinusoidal_dot(offsets, d_model=d) for d in (16, 64, 256)}
    assert _outside(pos_figs.dot_by_offset_instant(offsets, dots, 64)) == []
    run = steps_view.kernel_run(64, 32, block_m=16, block_n=16, causal=True)
    assert _outside(steps_view.step_view(run, 0)[0]) == []


def test_a_slider_that_changes_only_lines_is_restyled_in_place_and_any_other_is_redrawn():
    """plotly.animate with redraw false restyles line and marker traces only: a frame slider's steps are frames
    when every trace of the figure is a scatter trace and no layout key but the images changes (the axes held), and
    plotly.update steps, one full redraw each, when a step changes a heatmap or a bar, or the layout, and where a
    heatmap that does not change is drawn (animate would drop its drawing: it draws a panel again from the traces it
    animates). The app's Softmax T chart is restyled in place (tests/test_browser.py checks in Chromium that this
    draws what a full redraw draws)."""
    from attnviz.ui import softmax as ui_softmax

    def redraws(fig: go.Figure) -> set:  # animate restyles in place, update redraws
        return {step.method == "update" for slider in fig.layout.sliders for step in slider.steps}

    x = np.arange(5.0)

    def figure(*traces):
        return go.Figure(list(traces), layout=dict(height=300))

    def lines(a):
        return figure(go.Scatter(x=x, y=a * x), go.Heatmap(z=[[1.0, 2.0]]))

    assert redraws(instant.slider_over(lines, [1.0, 2.0], 1.0, parameter="a")) == {True}  # the heatmap stays drawn
    assert redraws(instant.slider_over(lambda a: figure(go.Scatter(x=x, y=a * x)).update_layout(
        images=[dict(source=f"data:image/png;base64,{a}", x=0, y=0, sizex=1, sizey=1)]), [1.0, 2.0], 1.0,
        parameter="a")) == {False}  # a picture is swapped in place
    assert redraws(instant.slider_over(lambda a: figure(go.Heatmap(z=[[a, 2.0]])), [1.0, 2.0], 1.0,
                                       parameter="a")) == {True}
    assert redraws(instant.slider_over(lambda a: figure(go.Bar(x=x, y=a * x)), [1.0, 2.0], 1.0,
                                       parameter="a")) == {True}
    assert redraws(instant.slider_over(lambda a: lines(a).update_layout(title=f"a = {a}"), [1.0, 2.0], 1.0,
                                       parameter="a")) == {True}
    assert redraws(ui_softmax.sweeps_chart(64, 0, 1.0)) == {False}


@pytest.mark.parametrize("v", [np.arange(-3, 5), np.arange(200), np.arange(-40_000, 40_000, 7), np.array([2**40, 0]),
                               np.arange(300, dtype=np.uint64), np.array([2**33], dtype=np.uint64),
                               np.arange(6, dtype=np.int16).reshape(2, 3), np.array([1, 2], dtype=np.uint32),
                               np.linspace(0, 1, 5), np.linspace(0, 1, 6, dtype=np.float32).reshape(3, 2),
                               np.array([True, False]), np.array(["a", "b"])])
def test_an_array_is_written_as_plotlys_own_typed_array_spec_writes_it(v):
    """typed_arrays.value writes a numpy array itself (plotly's to_typed_array_spec goes through narwhals, 70-150 us
    an array): the same spec, the same narrowing of 64-bit ints, a list where plotly has no typed array."""
    from _plotly_utils.utils import to_typed_array_spec

    want = to_typed_array_spec(v)
    want = want.tolist() if isinstance(want, np.ndarray) else want
    assert instant.typed_arrays.value(v, "y") == want
