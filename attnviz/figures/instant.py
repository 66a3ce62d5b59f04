"""Figures the browser redraws by itself: a parameter's values (stops) carried inside the figure and switched by
plotly's own slider, so moving it sends nothing to the server (a Streamlit widget reruns the page's script).

Two kinds of slider, which compose in one figure:
- `add_frame_slider`: one plotly frame per stop; a frame carries only what differs between the stops (the varying
  attributes of the traces that vary, the varying top-level layout keys) and plotly.animate merges it into the
  figure.
- `add_group_slider`: a few stops of a second parameter, each a group of traces drawn for that value (frames of the
  first slider update every group); its steps switch which group is visible ("update": restyle `visible`, and a
  layout change per stop if given).

`drawn` replays slider moves in Python, as plotly.js applies them, so tests can read what the browser would draw
(`array` decodes its arrays).
Stops are picked with `thinned` (every k-th value within a byte budget) or `window` (consecutive values).
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from _plotly_utils.utils import convert_to_base64

FRAME_BUDGET = 1_800_000  # bytes of JSON the frames of one figure may take (the figure itself comes on top)
SLIDER_PX = 100  # the height a slider takes: its current value, rail, ticks and labels (plotly draws ~90 px)
TITLE_PX = 44  # the figure title's band at the top, above the sliders
_ANIMATE = {"mode": "immediate", "frame": {"duration": 0, "redraw": True}, "transition": {"duration": 0}}


def figure_dict(fig: go.Figure) -> dict:
    """The figure as plain dicts ({"data": [trace dicts], "layout": {...}}), numpy arrays kept: what a stop is."""
    return fig.to_plotly_json()


def array(value) -> np.ndarray:
    """An array attribute of a figure dict as numpy: plotly writes numpy arrays as typed-array specs ({"dtype",
    "bdata", "shape"}: the bytes in base64), which this decodes bit for bit; lists and arrays are passed through, a
    list's None (NaN as JSON writes it, one_draw's lists) read as NaN."""
    if isinstance(value, Mapping) and "bdata" in value:
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        return flat.reshape([int(n) for n in str(shape).split(",")]) if shape else flat
    out = np.asarray(value)
    return np.asarray(value, dtype=float) if out.dtype == object else out


def json_bytes(obj) -> int:
    """Size of a figure, or of a figure dict, as the JSON st.plotly_chart sends (plotly.io.to_json; a figure's
    arrays as base64 typed arrays, as its to_dict writes them)."""
    if not isinstance(obj, go.Figure):
        obj = _copied(obj)
        convert_to_base64(obj)
    return len(pio.to_json(obj, validate=False))


def thinned(n_options: int, current: int, stop_bytes: float, budget: float = FRAME_BUDGET) -> list[int]:
    """Indices of the options to carry as stops: every k-th counted from `current` either way, and the first and
    last, k the smallest whose stops fit `budget` at `stop_bytes` each (k = 1, every option, when they fit)."""
    for k in range(1, n_options + 1):
        picked = sorted({*range(current % k, n_options, k), 0, n_options - 1})
        if len(picked) * stop_bytes <= budget:
            return picked
    return sorted({0, current, n_options - 1})


def window(n_options: int, current: int, stop_bytes: float, *, most: int, budget: float = FRAME_BUDGET) -> range:
    """Consecutive option indices around `current` (as many after it as before, where there are), at most `most`
    of them and as many as fit `budget` at `stop_bytes` each (at least `current` itself)."""
    size = max(1, min(most, n_options, int(budget // max(stop_bytes, 1.0))))
    start = min(max(current - size // 2, 0), n_options - size)
    return range(start, start + size)


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype.kind != b.dtype.kind:
            return False
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _varying(dicts: Sequence[Mapping]) -> list[str]:
    """The keys whose value differs between the dicts; every dict must have the same keys."""
    keys = set(dicts[0])
    for d in dicts[1:]:
        if set(d) != keys:
            raise ValueError(f"the stops differ in which attributes they set: {sorted(keys ^ set(d))}")
    return [k for k in dicts[0] if any(not _same(dicts[0][k], d[k]) for d in dicts[1:])]


def _place(fig: go.Figure) -> float:
    """Makes room for one more slider at the top of fig (height and top margin grow by SLIDER_PX, the plot area
    keeps its size, the title stays at the top) and returns the slider's y (paper units, anchored at its top): right
    under the title. Whatever the old top margin held (a legend, panel titles, sliders added before, which keep
    their place against the plot area) stays below it."""
    layout = fig.layout
    if layout.height is None:
        raise ValueError("a figure with an in-chart slider needs its height set")
    top = layout.margin.t if layout.margin.t is not None else 100
    bottom = layout.margin.b if layout.margin.b is not None else 80
    plot_h = layout.height - top - bottom
    fig.update_layout(height=layout.height + SLIDER_PX, margin=dict(t=top + SLIDER_PX))
    if layout.title.text:
        fig.update_layout(title=dict(yref="container", y=1.0, yanchor="top", pad=dict(t=14)))
    y = 1.0 + (top + SLIDER_PX - (TITLE_PX if layout.title.text else 14)) / plot_h
    if y > 3.0:  # plotly takes a slider's y up to 3 plot heights
        raise ValueError(f"a plot area of {plot_h} px is too short for its sliders: make the figure taller")
    return y


def _slider(fig: go.Figure, steps: list[dict], active: int, parameter: str) -> dict:
    """A slider over steps, drawn at step `active`, placed at the top of fig (_place); its current value reads
    "<parameter> (in this chart) = <label>"."""
    # past two dozen stops the ticks and their labels would run together: the rail alone, the current value above
    # it saying where the handle is, the first and last stops beside the parameter's name
    many = len(steps) > 24
    span = f", {steps[0]['label']} to {steps[-1]['label']}" if many else ""
    hidden = "rgba(0,0,0,0)"
    return dict(active=active, steps=steps, x=0.0, len=1.0, xanchor="left", y=_place(fig),
                yanchor="top", pad=dict(t=0, b=0, l=0, r=0), ticklen=0 if many else 7, minorticklen=0 if many else 4,
                tickcolor=hidden if many else "#868e96", font=dict(size=11, color=hidden if many else "#495057"),
                currentvalue=dict(prefix=f"{parameter} (in this chart{span}) = ", visible=True, xanchor="left",
                                  font=dict(size=14, color="#212529")))


def _sliders(fig: go.Figure) -> list[dict]:
    """The figure's sliders as plain dicts, to be assigned again with a new one."""
    return [slider.to_plotly_json() for slider in fig.layout.sliders or ()]


def add_frame_slider(fig: go.Figure, stops: Sequence[Mapping], labels: Sequence[str], active: int, *,
                     parameter: str, name: str = "") -> go.Figure:
    """Adds one frame per stop and a plotly slider over them to fig, the figure drawn at stops[active].

    stops: each stop's figure as plain dicts ({"data": [one dict per trace of fig], "layout": {...}}, e.g.
    figure_dict of the topic's builder at that value), the same traces in the same order. A frame carries, for
    every trace that differs between stops, the attributes that differ, and the top-level layout keys that differ;
    everything else stays as fig has it. labels: each stop's value as the slider writes it; parameter: its name, as
    the slider's current value says it ("d_k"); name: prefixes the frame names (two frame sliders in one figure).
    """
    if len(stops) != len(labels) or not 0 <= active < len(stops):
        raise ValueError("one label per stop, and active must index a stop")
    n_traces = len(fig.data)
    if any(len(s["data"]) != n_traces for s in stops):
        raise ValueError(f"every stop must draw the figure's {n_traces} traces")
    varying = {i: _varying([s["data"][i] for s in stops]) for i in range(n_traces)}
    varying = {i: keys for i, keys in varying.items() if keys}
    layout_keys = _varying([{k: v for k, v in s.get("layout", {}).items() if k != "sliders"} for s in stops]) \
        if len(stops) > 1 else []
    traces = sorted(varying)
    animate = _animate(fig, traces, layout_keys)
    frames, steps = [f.to_plotly_json() for f in fig.frames or ()], []
    for stop, label in zip(stops, labels):
        frame_name = f"{name}{label}"
        frames.append(dict(  # plain dicts: plotly checks them once, when they are set on the figure
            name=frame_name, traces=traces,
            data=[{"type": stop["data"][i]["type"], **{k: stop["data"][i][k] for k in varying[i]}} for i in traces],
            layout={k: stop["layout"][k] for k in layout_keys}))
        steps.append(dict(method="animate", label=label, args=[[frame_name], animate]))
    hold_ranges(fig, stops, varying, layout_keys)
    new = _slider(fig, steps, active, parameter)
    fig.layout.sliders = _sliders(fig) + [new]  # assigned: plotly's update would merge into the old ones, slowly
    _set_frames(fig, frames)
    return fig


REDRAWN_IN_PLACE = ("scatter",)  # the trace types plotly.animate restyles without a full redraw (redraw: false)


def _animate(fig: go.Figure, traces: Sequence[int], layout_keys: Sequence[str]) -> dict:
    """plotly.animate's options for a step: no full redraw when every trace a frame changes is a line or marker
    trace and no layout key changes (the axes' ranges held by hold_ranges), which plotly then restyles in place
    (the Softmax T chart's six panels: 0.10 s a stop redrawn whole, 0.04 s in place); else a full redraw (heatmaps,
    bars and layout changes need it)."""
    in_place = not layout_keys and all(fig.data[i].type in REDRAWN_IN_PLACE for i in traces)
    return {**_ANIMATE, "frame": {"duration": 0, "redraw": not in_place}}


HELD = ("scatter", "scattergl", "bar")  # the trace types whose x and y set an axis' autorange
PAD = 0.05  # of the span, each side (plotly pads an autorange by about as much)


def hold_ranges(fig: go.Figure, stops: Sequence[Mapping], varying: Mapping[int, Sequence[str]],
                layout_keys: Sequence[str]) -> None:
    """Gives every x and y axis that autoranges (no range set, in the figure or in the stops' layouts) and holds a
    trace whose values there change between stops (varying: {trace: its attributes that change}) the range that
    holds every stop's values of every trace on it, padded by PAD (on a log axis in powers of ten; a bar's base 0
    included). plotly.animate does not autorange again: a stop's curves would leave the axes drawn for the first,
    and the axes would not stay put while the slider moves."""
    for letter in ("x", "y"):
        values: dict[str, list[np.ndarray]] = {}
        moving = set()
        for i, trace in enumerate(fig.data):
            if trace.type in HELD:
                name = (getattr(trace, f"{letter}axis", None) or letter).replace(letter, f"{letter}axis", 1)
                base = trace.type == "bar" and (trace.orientation == "h") == (letter == "x")  # its value axis
                values.setdefault(name, []).extend([np.zeros(1)] * base +
                                                   [array(s["data"][i].get(letter, ())) for s in stops])
                if letter in varying.get(i, ()):
                    moving.add(name)
        for name, arrays in values.items():
            axis = fig.layout[name]
            if (name not in moving or name in layout_keys or axis.range is not None or axis.autorange is False
                    or axis.type == "category"):
                continue
            held = _held_range(arrays, log=axis.type == "log")
            if held is not None:
                axis.range = held


def _held_range(arrays: list[np.ndarray], *, log: bool) -> list[float] | None:
    """[low, high] over the arrays' finite numbers (positive ones in log10 on a log axis), padded; None for none."""
    numbers = [a.astype(np.float64).ravel() for a in arrays if a.size and a.dtype.kind in "iuf"]
    v = np.concatenate(numbers) if numbers else np.zeros(0)
    v = v[np.isfinite(v)]
    if log:
        v = np.log10(v[v > 0])
    if not v.size:
        return None
    low, high = float(v.min()), float(v.max())
    pad = PAD * (high - low) if high > low else (0.5 if log else max(abs(high) * PAD, 0.5))
    return [low - pad, high + pad]


def _set_frames(fig: go.Figure, frames: list[dict]) -> None:
    """fig.frames = frames, without plotly checking each frame's every attribute again (`fig.frames = ...` does,
    even for Frame objects: 0.2 s for a RoPE chart of 201 stops, most of a rerun). The frames are plotly's own
    dicts, made from traces it already checked. Their arrays are written as plotly's JSON writes them (base64
    typed arrays, convert_to_base64) once here, not again at every rerun that sends the figure.
    tests/test_figures_instant.py checks that the JSON sent is the same as with plotly's checks (plotly is pinned:
    this sets the attribute its frames setter sets)."""
    frames = _copied(frames)
    convert_to_base64(frames)
    fig._frame_objs = tuple(go.Frame(frame, _validate=False) for frame in frames)


_FLOATS = {np.dtype(np.float64): "f8", np.dtype(np.float32): "f4"}


def _copied(obj):
    """obj's dicts, lists and tuples copied (other values shared), for convert_to_base64 to rewrite. A non-empty
    float array under a dict key is written here as plotly writes it ({"dtype", "bdata", "shape"}): plotly's own
    path costs ~70 us an array, and a RoPE chart's frames hold thousands of small ones."""
    if isinstance(obj, Mapping):
        return {k: _float_spec(v) if isinstance(v, np.ndarray) and v.dtype in _FLOATS and v.size and k not in
                _UNCONVERTED else _copied(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_copied(v) for v in obj]
    return obj


_UNCONVERTED = {"geojson", "layer", "layers", "range"}  # keys plotly's convert_to_base64 leaves as they are


def _float_spec(v: np.ndarray) -> dict:
    spec = {"dtype": _FLOATS[v.dtype], "bdata": base64.b64encode(np.ascontiguousarray(v)).decode("ascii")}
    if v.ndim > 1:
        spec["shape"] = str(v.shape)[1:-1]
    return spec


def add_group_slider(fig: go.Figure, groups: Sequence[Sequence[int]], labels: Sequence[str], active: int, *,
                     parameter: str, layouts: Sequence[Mapping] | None = None) -> go.Figure:
    """Adds a slider whose stop j shows the traces in groups[j] and hides those of the other groups (traces in no
    group are left as they are), applying layouts[j] (a relayout: {"title.text": ...}) if given. fig is drawn at
    stop `active`: its group's traces visible, the others' not."""
    if len(groups) != len(labels) or not 0 <= active < len(groups):
        raise ValueError("one label per group, and active must index a group")
    members = sorted({i for g in groups for i in g})
    steps = []
    for j, (group, label) in enumerate(zip(groups, labels)):
        visible = [i in set(group) for i in members]
        steps.append(dict(method="update", label=label,
                          args=[{"visible": visible}, dict(layouts[j]) if layouts else {}, members]))
    for i in members:
        fig.data[i].visible = i in set(groups[active])
    new = _slider(fig, steps, active, parameter)
    fig.layout.sliders = _sliders(fig) + [new]  # assigned: plotly's update would merge into the old ones, slowly
    return fig


def slider_over(build: Callable[[object], go.Figure], values: Sequence, active, *, parameter: str,
                labels: Sequence[str] | None = None) -> go.Figure:
    """build(value) for the active value, with an in-chart slider over every value (add_frame_slider), each stop
    built by the same builder: what the browser draws at a stop is what build draws for that value."""
    values = list(values)
    labels = [stop_label(v) for v in values] if labels is None else list(labels)
    stops = [figure_dict(build(v)) for v in values]
    return add_frame_slider(build(active), stops, labels, values.index(active), parameter=parameter)


def drawn(fig: go.Figure | Mapping, moves: Sequence[tuple[int, int]] = ()) -> dict:
    """What plotly.js draws after the slider moves (slider index, step index), in order, as figure_dict: an animate
    step merges its frame's data into the listed traces and its layout keys into the layout; an update step restyles
    its traces' `visible` and relayouts its dotted keys. fig: a figure, or its figure_dict (to replay many moves of
    a large figure, convert it once)."""
    figure = figure_dict(fig) if isinstance(fig, go.Figure) else fig
    state = {"data": copy.deepcopy(figure["data"]), "layout": copy.deepcopy(figure["layout"])}
    frames = {f["name"]: f for f in figure.get("frames", ())}
    for slider, step in moves:
        method, args = (figure["layout"]["sliders"][slider]["steps"][step][k] for k in ("method", "args"))
        if method == "animate":
            frame = frames[args[0][0]]
            for i, data in zip(frame["traces"], frame["data"]):
                state["data"][i].update({k: v for k, v in data.items() if k != "type"})
            state["layout"].update(frame.get("layout", {}))
        elif method == "update":
            restyle, relayout, traces = args
            for i, visible in zip(traces, restyle["visible"]):
                state["data"][i]["visible"] = visible
            for dotted, value in relayout.items():
                *path, last = dotted.split(".")
                node = state["layout"]
                for part in path:
                    node = node.setdefault(part, {})
                node[last] = value
        else:
            raise ValueError(f"no replay for slider method {method!r}")
        state["layout"]["sliders"][slider]["active"] = step
    return state


def stop_label(value: float) -> str:
    """A stop's value as a short label: integers without a point, others to 4 significant digits."""
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"

