"""Figures the browser redraws by itself: a parameter's values (stops) carried inside the figure and switched by
plotly's own slider, so moving it sends nothing to the server (a Streamlit widget reruns the page's script).

Two kinds of slider, which compose in one figure:
- `add_frame_slider`: one step per stop, carrying only what differs between the stops (the varying attributes of
  the traces that vary, the varying top-level layout keys): a plotly frame that plotly.animate restyles in place
  where only lines change, else one plotly.update.
- `add_group_slider`: a few stops of a second parameter, each a group of traces drawn for that value (the first
  slider's steps update every group); its steps switch which group is shown by style alone ("update": restyle the
  opacity, legend entry and hover, which plotly does in place, and a layout change per stop if given).

`drawn` replays slider moves in Python, as plotly.js applies them, so tests can read what the browser would draw
(`array`, from attnviz.figures.typed_arrays, decodes its arrays).
Stops are picked with `thinned` (every k-th value within a byte budget) or `window` (consecutive values).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from attnviz.figures import typed_arrays
from attnviz.figures.typed_arrays import array, json_bytes  # noqa: F401 (the figures' callers read them here)

FRAME_BUDGET = 1_800_000  # bytes of JSON the stops of one figure's sliders may take (the figure itself on top)
SLIDER_PX = 100  # the height a slider takes: its current value, rail, ticks and labels (plotly draws ~90 px)
TITLE_PX = 44  # the figure title's band at the top, above the sliders
_ANIMATE = {"mode": "immediate", "frame": {"duration": 0, "redraw": False}, "transition": {"duration": 0}}


def figure_dict(fig: go.Figure) -> dict:
    """The figure as plain dicts ({"data": [trace dicts], "layout": {...}}), numpy arrays kept: what a stop is."""
    return fig.to_plotly_json()


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
    if a is b:  # one object shared by the stops (a trace every stop draws alike)
        return True
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
    """Adds a plotly slider over the stops to fig, the figure drawn at stops[active].

    stops: each stop's figure as plain dicts ({"data": [one dict per trace of fig], "layout": {...}}, e.g.
    figure_dict of the topic's builder at that value), the same traces in the same order. A step carries, for every
    trace that differs between stops, the attributes that differ, and the top-level layout keys that differ;
    everything else stays as fig has it. labels: each stop's value as the slider writes it; parameter: its name, as
    the slider's current value says it ("d_k"); name: prefixes the frame names (two frame sliders in one figure).

    A step is one plotly frame, restyled in place by plotly.animate, where every trace that changes is a line or
    marker trace and no layout key but the layout images changes (_in_place: a map drawn by attnviz.figures.raster
    is one); any other step is one plotly.update of the attributes that change (_update), which draws the figure
    once where animate with a redraw computes it twice (the kernel's step view: 0.18 s a step by animate, 0.12 s by
    update, in Chromium on a 2-core machine).
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
    if _in_place(fig, layout_keys):
        steps = _frame_steps(fig, stops, labels, traces, varying, layout_keys, name)
    else:
        restyled = _changing([[s["data"][i] for s in stops] for i in traces], [varying[i] for i in traces])
        relaid = _changing([[s.get("layout", {}) for s in stops]], [layout_keys])
        steps = [dict(method="update", label=label, args=_update(stop, traces, restyled, relaid))
                 for stop, label in zip(stops, labels)]
    hold_ranges(fig, stops, varying, layout_keys)
    new = _slider(fig, steps, active, parameter)
    fig.layout.sliders = _sliders(fig) + [new]  # assigned: plotly's update would merge into the old ones, slowly
    return fig


REDRAWN_IN_PLACE = ("scatter",)  # the trace types plotly.animate restyles without a full redraw (redraw: false)
SWAPPED_IN_PLACE = ("images",)  # the layout keys it draws again by themselves (a layout image's picture)


def _in_place(fig: go.Figure, layout_keys: Sequence[str]) -> bool:
    """Whether plotly.animate can restyle the steps in place (redraw: false): every trace of the figure is a line or
    marker trace and the only layout key that changes is the images (the axes' ranges held by hold_ranges). The
    Softmax T chart's six panels: 0.10 s a stop redrawn whole, 0.04 s in place. A heatmap or a bar that changes,
    and other layout changes (a title, an axis), need a full redraw: animate would leave them as they were; and it
    drops the drawing of one that does not change (it draws a panel's layers again from the traces it animates,
    which are line and marker traces only), so a figure with one is redrawn whole too."""
    return (set(layout_keys) <= set(SWAPPED_IN_PLACE)
            and all(trace.type in REDRAWN_IN_PLACE for trace in fig.data))


def _frame_steps(fig: go.Figure, stops: Sequence[Mapping], labels: Sequence[str], traces: Sequence[int],
                 varying: Mapping[int, Sequence[str]], layout_keys: Sequence[str], name: str) -> list[dict]:
    """One frame per stop added to fig (each with the varying attributes of the varying traces, and the varying
    layout keys), and the slider steps that animate to them, restyled in place."""
    frames, steps = [f.to_plotly_json() for f in fig.frames or ()], []
    for stop, label in zip(stops, labels):
        frame_name = f"{name}{label}"
        frames.append(dict(  # plain dicts: plotly checks them once, when they are set on the figure
            name=frame_name, traces=list(traces),
            data=[{"type": stop["data"][i]["type"], **{k: stop["data"][i][k] for k in varying[i]}} for i in traces],
            **({"layout": {k: stop["layout"][k] for k in layout_keys}} if layout_keys else {})))
        steps.append(dict(method="animate", label=label, args=[[frame_name], _ANIMATE]))
    _set_frames(fig, frames)
    return steps


def _changing(by_item: Sequence[Sequence[Mapping]], keys: Sequence[Sequence[str]]) -> list[str]:
    """The dotted paths, under each item's keys, whose value is not the same in every stop (by_item: for each item,
    a trace or the layout, its dict at every stop). A path that some stops set and others do not is refused: plotly
    would unset it with null but keep what setting it implied (a range turns autorange off), and a container set
    empty at one stop and filled at another would be a parent and its child in one update, which plotly refuses."""
    paths: dict[str, None] = {}
    for dicts, own in zip(by_item, keys):
        leaves = [dict(_leaves({k: d[k] for k in own})) for d in dicts]
        for path in dict.fromkeys(p for stop in leaves for p in stop):
            if not all(path in stop for stop in leaves):
                raise ValueError(f"the stops differ in whether they set {path!r}: set it at every stop")
            if not all(_same(stop[path], leaves[0][path]) for stop in leaves):
                paths[path] = None
    return list(paths)


def _update(stop: Mapping, traces: Sequence[int], restyled: Sequence[str], relaid: Sequence[str]) -> list:
    """plotly.update's arguments that draw `stop`: [restyle, relayout, traces], each of the dotted paths that
    change (_changing) set to its value at this stop: nested attributes leaf by leaf, as plotly's frames merge them
    (the figure's other settings, its theme's included, stay); restyle gives each path one value per trace, None
    where the trace has none (plotly then leaves it unset). Arrays travel as plotly writes them (base64 typed
    arrays). plotly.js recomputes a trace for a changed style array (a marker colour per point) only when the value is
    an array to it, which a typed-array spec is not: the steps here also change x, y or z, which recompute it; a
    step whose only change was such a style array would need it as a list."""
    restyle = {path: [typed_arrays.value(_at(stop["data"][i], path), path) for i in traces] for path in restyled}
    relayout = {path: typed_arrays.value(_at(stop["layout"], path), path) for path in relaid}
    return [restyle, relayout, list(traces)]


def _leaves(tree: Mapping, prefix: str = ""):
    """(dotted path, value) of every value under tree that is not a dict (lists, arrays, typed-array specs and empty
    dicts are values)."""
    for key, value in tree.items():
        if isinstance(value, Mapping) and value and "bdata" not in value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _at(tree: Mapping, path: str):
    """The value at a dotted path of tree, None where there is none."""
    for part in path.split("."):
        if not isinstance(tree, Mapping) or part not in tree:
            return None
        tree = tree[part]
    return tree


HELD = ("scatter", "scattergl", "bar")  # the trace types whose x and y set an axis' autorange
PAD = 0.05  # of the span, each side (plotly pads an autorange by about as much)


def hold_ranges(fig: go.Figure, stops: Sequence[Mapping], varying: Mapping[int, Sequence[str]],
                layout_keys: Sequence[str]) -> None:
    """Gives every x and y axis that autoranges (no range set, in the figure or in the stops' layouts) and holds a
    trace whose values there change between stops (varying: {trace: its attributes that change}) the range that
    holds every stop's values of every trace on it, padded by PAD (on a log axis in powers of ten; a bar's base 0
    included): the axes stay put while the slider moves, and plotly.animate, which does not autorange again, keeps
    every stop's curves inside them."""
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
    dicts, made from traces it already checked. Their arrays are written as plotly's JSON writes them
    (typed_arrays.written: base64 typed arrays) once here, not again at every rerun that sends the figure.
    tests/test_figures_instant.py checks that the JSON sent is the same as with plotly's checks (plotly is pinned:
    this sets the attribute its frames setter sets)."""
    frames = typed_arrays.written(frames)
    fig._frame_objs = tuple(go.Frame(frame, _validate=False) for frame in frames)


# How add_group_slider hides a group's traces: by style alone, which plotly restyles in place (switching `visible`
# makes it draw the whole figure again: 0.09-0.12 s for a RoPE pair chart in the app against 0.04-0.06 s)
HIDDEN = {"opacity": 0.0, "showlegend": False, "hoverinfo": "skip"}


def add_group_slider(fig: go.Figure, groups: Sequence[Sequence[int]], labels: Sequence[str], active: int, *,
                     parameter: str, layouts: Sequence[Mapping] | None = None) -> go.Figure:
    """Adds a slider whose stop j shows the traces in groups[j] and hides those of the other groups (traces in no
    group are left as they are), applying layouts[j] (a relayout: {"title.text": ...}) if given. A hidden trace is
    drawn with HIDDEN's style (no ink, no legend entry, no hover), a shown one with its own (`shown` tells them
    apart). fig is drawn at stop `active`."""
    if len(groups) != len(labels) or not 0 <= active < len(groups):
        raise ValueError("one label per group, and active must index a group")
    members = sorted({i for g in groups for i in g})
    own = {i: {"opacity": _or(fig.data[i].opacity, 1.0), "showlegend": _or(fig.data[i].showlegend, True),
               "hoverinfo": _or(fig.data[i].hoverinfo, "all")} for i in members}

    def style(i: int, group) -> dict:
        return own[i] if i in set(group) else HIDDEN

    steps = [dict(method="update", label=label,
                  args=[{key: [style(i, group)[key] for i in members] for key in HIDDEN},
                        dict(layouts[j]) if layouts else {}, members])
             for j, (group, label) in enumerate(zip(groups, labels))]
    for i in members:
        fig.data[i].update(style(i, groups[active]))
    new = _slider(fig, steps, active, parameter)
    fig.layout.sliders = _sliders(fig) + [new]  # assigned: plotly's update would merge into the old ones, slowly
    return fig


def _or(value, default):
    return default if value is None else value


def shown(trace: Mapping) -> bool:
    """Whether a trace (a dict, as `drawn` gives it) is drawn: visible and not hidden by add_group_slider."""
    return trace.get("visible", True) is not False and trace.get("opacity", 1.0) != 0


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
    step merges its frame's data into the listed traces; an update step sets each dotted path of its restyle in its
    traces (value j of a path's list in the j-th trace) and each of its relayout in the layout, None unsetting it.
    fig: a figure, or its figure_dict (to replay many moves of a large figure, convert it once)."""
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
            for dotted, values in restyle.items():
                if isinstance(values, (list, tuple)) and not values:
                    continue  # plotly skips an empty list
                for j, i in enumerate(traces):  # a list gives trace j its j-th value, anything else goes to all
                    value = values[j % len(values)] if isinstance(values, (list, tuple)) else values
                    _put(state["data"][i], dotted, value)
            for dotted, value in relayout.items():
                _put(state["layout"], dotted, value)
        else:
            raise ValueError(f"no replay for slider method {method!r}")
        state["layout"]["sliders"][slider]["active"] = step
    return state


def _put(tree: dict, dotted: str, value) -> None:
    """tree at the dotted path set to value (the dicts on the way made where missing), or removed where None."""
    *path, last = dotted.split(".")
    for part in path:
        if value is None and part not in tree:
            return
        tree = tree.setdefault(part, {})
    if value is None:
        tree.pop(last, None)
    else:
        tree[last] = value


def stop_label(value: float) -> str:
    """A stop's value as a short label: integers without a point, others to 4 significant digits."""
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"

