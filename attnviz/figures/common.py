"""Shared figure pieces: one layout, one heatmap, one line chart, so every page looks alike."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

ATTENTION_SCALE = "Viridis"
DIVERGING_SCALE = "RdBu_r"
TEMPLATE = "plotly_white"
pio.templates.default = TEMPLATE
PALETTE = ("#3b5bdb", "#e8590c", "#2b8a3e", "#c2255c", "#7048e8", "#1098ad", "#f08c00", "#495057")


# Margins wide enough for the usual axis title, tick labels and colour bar. Streamlit's chart theme turns on plotly's
# automargin, which widens a margin that is too narrow by drawing the whole chart a second time: margins that are
# already wide enough make every chart draw once (a third to a half of its drawing time in the browser).
MARGIN_LEFT, MARGIN_BOTTOM, MARGIN_RIGHT, MARGIN_RIGHT_COLORBAR = 90, 70, 20, 120


LABEL_CHAR_PX = 7  # about the width of one tick-label character, in pixels


def _colorbar_titles(fig: go.Figure) -> list[str] | None:
    """The titles of the colour bars the figure draws (a heatmap's own, or a marker's showscale), None if none."""
    return _colorbar_titles_in(fig.data, fig.layout)


def _colorbar_titles_in(data, layout) -> list[str] | None:
    """_colorbar_titles of traces and a layout, plotly's objects or plain dicts (before a figure is built)."""
    titles = []
    for trace in data:
        shared = _read(trace, "coloraxis")  # a colour axis shared by traces draws one bar
        if shared:
            titles.append(_read(layout, shared, "colorbar", "title", "text") or "")
        titles += [_read(trace, *path, "title", "text") or "" for path in _own_colorbars(trace)]
    return titles or None


COLOURED = ("heatmap", "histogram2d", "contour")  # the trace types that draw a colour bar of their own by default


def _own_colorbars(trace) -> list[tuple[str, ...]]:
    """Where the colour bars a trace draws of its own are set: ("colorbar",) for a heatmap's (not on a shared colour
    axis, not hidden), ("marker", "colorbar") for a marker's shown scale."""
    own = []
    if _read(trace, "coloraxis") is None and (_read(trace, "type") or "scatter") in COLOURED \
            and _read(trace, "showscale") is not False:
        own.append(("colorbar",))
    if _read(trace, "marker", "showscale"):
        own.append(("marker", "colorbar"))
    return own


def _read(obj, *path):
    """obj[path[0]][path[1]]... in a plotly object or a plain dict alike, None where a key is not set (a title given
    as a plain string is its own text)."""
    for key in path:
        if isinstance(obj, str):
            return obj if key == "text" else None
        if obj is None:
            return None
        obj = obj.get(key) if isinstance(obj, Mapping) else (obj[key] if key in obj else None)
    return obj


def _right_margin(fig: go.Figure) -> int:
    return _right_margin_for(_colorbar_titles(fig))


def _right_margin_for(titles: Sequence[str] | None) -> int:
    """The right margin that holds colour bars with these titles (None: no colour bar)."""
    if titles is None:
        return MARGIN_RIGHT
    return max(MARGIN_RIGHT_COLORBAR, int(50 + 6.5 * max(len(t) for t in titles) + 0.5))


def label_margins(fig: go.Figure, *, x_labels: Sequence[str] = (), y_labels: Sequence[str] = (),
                  x_angle: float = 0.0) -> go.Figure:
    """Widens the left and bottom margins for long tick labels (tokens), so the chart draws once (see
    MARGIN_LEFT); x labels drawn at x_angle degrees from horizontal take their vertical extent."""
    margin = fig.layout.margin
    if y_labels:
        longest = max(len(str(t)) for t in y_labels)
        fig.update_layout(margin=dict(l=max(margin.l or MARGIN_LEFT, 50 + LABEL_CHAR_PX * longest)))
    if x_labels:
        longest = max(len(str(t)) for t in x_labels)
        height = LABEL_CHAR_PX * longest * abs(float(np.sin(np.radians(x_angle)))) + 14
        fig.update_layout(margin=dict(b=max(margin.b or MARGIN_BOTTOM, int(55 + height))))
    return fig


def apply_layout(fig: go.Figure, *, title: str | None = None, x_title: str | None = None,
                 y_title: str | None = None, height: int | None = None) -> go.Figure:
    """Title, axis titles and compact margins, the same on every page, on plotly's "plotly_white" template.

    The template is plotly's default (set when this module is imported) rather than a layout property: naming it
    on a figure makes plotly validate the whole template again for every figure (and a page draws up to ~20),
    while a figure built under the default takes it unvalidated, with the same JSON. Streamlit makes its own
    template the default when it is imported; should that happen after this module, the default is set back
    here, and this one figure, built under the other default, is given the template by name."""
    if pio.templates.default != TEMPLATE:
        pio.templates.default = TEMPLATE
        fig.update_layout(template=TEMPLATE)
    fig.update_layout(_house_layout(title, height, _right_margin(fig)))
    # Tick labels are never hidden at the edge of the chart: plotly's default ("hide past div") measures every
    # label in the browser on every draw, the largest single cost of drawing a chart with many ticks.
    # (One update per axis kind: each plotly update of a many-panel figure takes milliseconds.)
    fig.update_xaxes(ticklabeloverflow="allow", **({} if x_title is None else {"title_text": x_title}))
    fig.update_yaxes(ticklabeloverflow="allow", **({} if y_title is None else {"title_text": y_title}))
    unmeasured_colorbars(fig.data, fig.layout, list(fig._layout))
    return fig


def _house_layout(title: str | None, height: int | None, right: int) -> dict:
    """The margins, height, legend and title apply_layout gives every figure (right: the right margin)."""
    layout = dict(margin=dict(l=MARGIN_LEFT, r=right, t=50 if title else 20, b=MARGIN_BOTTOM), height=height,
                  legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1.0))
    if title:
        layout["title"] = dict(text=title, x=0.0, xanchor="left")
    return layout


def laid_out(data, layout: Mapping | None = None, *, title: str | None = None, x_title: str | None = None,
             y_title: str | None = None, height: int | None = None, legend: Mapping | None = None,
             margin: Mapping | None = None, validate: bool = True) -> go.Figure:
    """go.Figure(data, layout) laid out as apply_layout lays it out, then `legend` and `margin` merged in as plotly's
    update_layout merges them (legend_below's, say), all in one go: each plotly update of a built figure walks its
    property tree (10-30 ms a call here), where a figure built from one dict takes 2-3 ms. data: traces, plotly's
    or plain dicts; layout: a plain dict (grid_layout's, say), left as it is. validate=False: plotly.py stores the
    dicts as they are, unchecked (a third of the time for a figure of many traces); only for figures whose JSON a
    test shows equal to the validated figure's (every value already as plotly.js reads it: no colour scale by name,
    which plotly.py alone expands)."""
    if pio.templates.default != TEMPLATE:  # see apply_layout
        pio.templates.default = TEMPLATE
    out = copy.deepcopy(dict(layout or {}))
    house = _house_layout(title, height, _right_margin_for(_colorbar_titles_in(data, out)))
    if house.pop("height") is None:  # as update_layout(height=None) unsets it
        out.pop("height", None)
    else:
        out["height"] = height
    _merge(out, house)
    for kind, text in (("x", x_title), ("y", y_title)):  # every axis of the kind, as update_xaxes finds them
        for name in {f"{kind}axis"} | {k for k in out if re.fullmatch(f"{kind}axis[0-9]*", k)}:
            _merge(out, {name: dict(ticklabeloverflow="allow", **({} if text is None else {"title": {"text": text}}))})
    _merge(out, {"legend": dict(legend or {}), "margin": dict(margin or {})})
    return go.Figure(data=unmeasured_colorbars(data, out, list(out)), layout=out, _validate=validate)


ALLOW = {"ticklabeloverflow": "allow"}


def unmeasured_colorbars(data, layout, names: Iterable[str]) -> list:
    """Every colour bar the traces draw (data: plotly's traces or plain dicts; layout: the figure's, plotly's or a
    plain dict; names: the layout's property names, its colour axes among them) draws its tick labels as they are, as
    every axis does (apply_layout, laid_out). plotly's default, "hide past div", measures each tick label in the
    browser on every draw, and each measure makes the browser lay the whole page out again: 20-30 ms for the kernel's
    step view and its two colour bars on a loaded 2-core machine (docs/measured.md, "Colour bars that measure their
    labels"). The layout is updated in place. Returns the traces: plotly's updated in place, a plain dict with a colour
    bar as a copy (the caller's dict, an in-chart slider's stop say, stays as it was, the same as its other stops)."""
    for name in names:
        if re.fullmatch("coloraxis[0-9]*", name):
            _put(layout, {name: {"colorbar": ALLOW}})
    return [_unmeasured(trace) for trace in data]


def _unmeasured(trace):
    """The trace with ALLOW in each of its own colour bars: a plain dict copied along the way to them."""
    for path in _own_colorbars(trace):
        if not isinstance(trace, Mapping):
            trace.update({path[0]: ALLOW} if len(path) == 1 else {path[0]: {path[1]: ALLOW}})
            continue
        trace = inner = dict(trace)
        for key in path:  # a plotly object on the way (a go.scatter.Marker in a dict) as its plain dict
            held = inner.get(key) or {}
            inner[key] = held.to_plotly_json() if hasattr(held, "to_plotly_json") else dict(held)
            inner = inner[key]
        inner.update(ALLOW)
    return trace


def _put(obj, update: Mapping) -> None:
    """update merged into obj, a plain dict (as _merge) or a plotly object (its own update)."""
    if isinstance(obj, Mapping):
        _merge(obj, update)
    else:
        obj.update(update)


def _merge(into: dict, update: Mapping) -> None:
    """update merged into `into` as plotly merges an update: nested dicts key by key, anything else replaced."""
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), Mapping):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(dict(value)) if isinstance(value, Mapping) else value


def hline(y: float, text: str, line: dict) -> dict:
    """A horizontal line across the panel at y with `text` over its right end, as plotly's add_hline(y, line=line,
    annotation_text=text, annotation_position="top right") draws it: {"shapes": [...], "annotations": [...]} for
    line_chart or laid_out (add_hline itself takes 10-20 ms a call)."""
    return {"shapes": [dict(type="line", x0=0, x1=1, xref="x domain", y0=y, y1=y, yref="y", line=line)],
            "annotations": [dict(showarrow=False, text=text, x=1, xanchor="right", xref="x domain", y=y,
                                 yanchor="bottom", yref="y")]}


def legend_below(fig: go.Figure, *, y: float = -0.22, bottom: int = 100) -> go.Figure:
    """The legend under the x-axis title, left-aligned, with a bottom margin to hold it: above the plot, in a narrow
    column, it runs over the chart's title however many entries it has."""
    fig.update_layout(legend=below_legend(y=y), margin=dict(b=bottom))
    return fig


def below_legend(*, y: float = -0.22) -> dict:
    """legend_below's legend, for laid_out (with margin=dict(b=...) to hold it)."""
    return dict(orientation="h", yanchor="top", y=y, xanchor="left", x=0.0)


def grid_layout(rows: int, cols: int, titles: Sequence[str] = (), *, horizontal_spacing: float = 0.1,
                vertical_spacing: float = 0.2) -> dict:
    """The layout of plotly's make_subplots(rows, cols, subplot_titles=titles) as a plain dict: the axes of panel
    i (row-major from the top left) are xaxis{i + 1} / yaxis{i + 1} ("xaxis" / "yaxis" for the first), each titled
    panel an annotation over it. A figure built in one go from it (go.Figure(data, layout)) skips the per-panel
    updates that make a many-panel plotly figure slow to build."""
    width = (1.0 - horizontal_spacing * (cols - 1)) / cols
    height = (1.0 - vertical_spacing * (rows - 1)) / rows
    layout: dict = {"annotations": []}
    for i in range(rows * cols):
        row, col = divmod(i, cols)
        x0, y1 = col * (width + horizontal_spacing), 1.0 - row * (height + vertical_spacing)
        suffix = "" if i == 0 else str(i + 1)
        layout[f"xaxis{suffix}"] = {"anchor": f"y{suffix}", "domain": [x0, min(1.0, x0 + width)]}
        layout[f"yaxis{suffix}"] = {"anchor": f"x{suffix}", "domain": [max(0.0, y1 - height), y1]}
        if i < len(titles) and titles[i]:
            layout["annotations"].append(dict(text=titles[i], x=x0 + width / 2, y=y1, xref="paper", yref="paper",
                                              xanchor="center", yanchor="bottom", showarrow=False,
                                              font=dict(size=16)))
    return layout


def heatmap(z, *, x_labels: Sequence | None = None, y_labels: Sequence | None = None, title: str | None = None,
            x_title: str | None = None, y_title: str | None = None, colorscale: str = ATTENTION_SCALE,
            zmin: float | None = None, zmax: float | None = None, colorbar_title: str | None = None,
            hovertemplate: str | None = None, reverse_y: bool = True, height: int | None = None) -> go.Figure:
    """A labelled heatmap of a small matrix z [rows, cols]; rows run top to bottom like a matrix."""
    z = np.asarray(z, dtype=float)
    x = list(range(z.shape[1])) if x_labels is None else unique_labels(x_labels)
    y = list(range(z.shape[0])) if y_labels is None else unique_labels(y_labels)
    return laid_out([go.Heatmap(
        z=z, x=x, y=y, colorscale=colorscale, zmin=zmin, zmax=zmax,
        colorbar=dict(title=dict(text=colorbar_title)) if colorbar_title else None,
        hovertemplate=hovertemplate or "row %{y}<br>column %{x}<br>value %{z:.4g}<extra></extra>",
    )], {"yaxis": {"autorange": "reversed"}} if reverse_y else None, title=title, x_title=x_title, y_title=y_title,
        height=height)


def line_chart(x, series: Mapping[str, Sequence[float]], *, title: str | None = None, x_title: str | None = None,
               y_title: str | None = None, log_x: bool = False, log_y: bool = False,
               dashed: Sequence[str] = (), height: int | None = None, **more) -> go.Figure:
    """One line per named series over a shared x. more: further layout properties (hline's, say)."""
    axes = {f"{kind}axis": {"type": "log"} for kind, log in (("x", log_x), ("y", log_y)) if log}
    return laid_out([go.Scatter(
        x=np.asarray(x), y=np.asarray(y, dtype=float), mode="lines", name=name,
        line=dict(color=PALETTE[i % len(PALETTE)], dash="dash" if name in dashed else "solid"),
    ) for i, (name, y) in enumerate(series.items())], {**axes, **more}, title=title, x_title=x_title,
        y_title=y_title, height=height)


def unique_labels(labels: Sequence) -> list[str]:
    """Plotly merges equal category labels, so repeated tokens get their position appended."""
    labels = [str(t) for t in labels]
    seen: dict[str, int] = {}
    for t in labels:
        seen[t] = seen.get(t, 0) + 1
    return [f"{t} ·{i}" if seen[t] > 1 else t for i, t in enumerate(labels)]
