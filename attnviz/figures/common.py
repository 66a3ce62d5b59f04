"""Shared figure pieces: one layout, one heatmap, one line chart, so every page looks alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
    titles = []
    for trace in fig.data:
        shared = getattr(trace, "coloraxis", None)  # a colour axis shared by traces draws one bar
        if shared:
            titles.append(fig.layout[shared].colorbar.title.text or "")
        elif trace.type in ("heatmap", "histogram2d", "contour") and trace.showscale is not False:
            titles.append(trace.colorbar.title.text or "")
        marker = getattr(trace, "marker", None)
        if marker is not None and getattr(marker, "showscale", None):
            titles.append(marker.colorbar.title.text or "")
    return titles or None


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
    layout = dict(margin=dict(l=MARGIN_LEFT, r=_right_margin(fig), t=50 if title else 20, b=MARGIN_BOTTOM),
                  height=height, legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1.0))
    if title:
        layout["title"] = dict(text=title, x=0.0, xanchor="left")
    fig.update_layout(layout)
    # Tick labels are never hidden at the edge of the chart: plotly's default ("hide past div") measures every
    # label in the browser on every draw, the largest single cost of drawing a chart with many ticks.
    # (One update per axis kind: each plotly update of a many-panel figure takes milliseconds.)
    fig.update_xaxes(ticklabeloverflow="allow", **({} if x_title is None else {"title_text": x_title}))
    fig.update_yaxes(ticklabeloverflow="allow", **({} if y_title is None else {"title_text": y_title}))
    return fig


def one_panel_layout(*, title: str | None = None, x_title: str | None = None, y_title: str | None = None,
                     height: int | None = None, colorbar_titles: Sequence[str] | None = None,
                     x_axis: dict | None = None, y_axis: dict | None = None, **more) -> dict:
    """What apply_layout sets, as one layout dict for a one-panel figure built in one go (go.Figure(data=...,
    layout=...)): 2-3 ms against 10-15 ms for a figure built and then laid out by plotly's updates, each of which
    walks plotly's property tree. colorbar_titles: those of the colour bars its traces draw (None: none); x_axis,
    y_axis, more: further axis and layout properties. Call before building the figure (the template: apply_layout)."""
    if pio.templates.default != TEMPLATE:
        pio.templates.default = TEMPLATE
    layout = dict(margin=dict(l=MARGIN_LEFT, r=_right_margin_for(colorbar_titles), t=50 if title else 20,
                              b=MARGIN_BOTTOM),
                  height=height, legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1.0),
                  xaxis=dict(x_axis or {}, ticklabeloverflow="allow"),
                  yaxis=dict(y_axis or {}, ticklabeloverflow="allow"), **more)
    if title:
        layout["title"] = dict(text=title, x=0.0, xanchor="left")
    for axis, text in (("xaxis", x_title), ("yaxis", y_title)):
        if text is not None:
            layout[axis]["title"] = dict(text=text)
    return layout


def hline(y: float, text: str, line: dict) -> dict:
    """A horizontal line across the panel at y with `text` over its right end, as plotly's add_hline(y, line=line,
    annotation_text=text, annotation_position="top right") draws it: {"shapes": [...], "annotations": [...]} for
    one_panel_layout (add_hline itself takes 10-20 ms a call)."""
    return {"shapes": [dict(type="line", x0=0, x1=1, xref="x domain", y0=y, y1=y, yref="y", line=line)],
            "annotations": [dict(showarrow=False, text=text, x=1, xanchor="right", xref="x domain", y=y,
                                 yanchor="bottom", yref="y")]}


def legend_below(fig: go.Figure, *, y: float = -0.22, bottom: int = 100) -> go.Figure:
    """The legend under the x-axis title, left-aligned, with a bottom margin to hold it: above the plot, in a narrow
    column, it runs over the chart's title however many entries it has."""
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=y, xanchor="left", x=0.0), margin=dict(b=bottom))
    return fig


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
    layout = one_panel_layout(title=title, x_title=x_title, y_title=y_title, height=height,
                              colorbar_titles=[colorbar_title or ""],
                              y_axis={"autorange": "reversed"} if reverse_y else None)
    return go.Figure(go.Heatmap(
        z=z, x=x, y=y, colorscale=colorscale, zmin=zmin, zmax=zmax,
        colorbar=dict(title=dict(text=colorbar_title)) if colorbar_title else None,
        hovertemplate=hovertemplate or "row %{y}<br>column %{x}<br>value %{z:.4g}<extra></extra>",
    ), layout=layout)


def line_chart(x, series: Mapping[str, Sequence[float]], *, title: str | None = None, x_title: str | None = None,
               y_title: str | None = None, log_x: bool = False, log_y: bool = False,
               dashed: Sequence[str] = (), height: int | None = None, **more) -> go.Figure:
    """One line per named series over a shared x. more: further layout properties (hline's, say)."""
    layout = one_panel_layout(title=title, x_title=x_title, y_title=y_title, height=height,
                              x_axis={"type": "log"} if log_x else None, y_axis={"type": "log"} if log_y else None,
                              **more)
    return go.Figure([go.Scatter(
        x=np.asarray(x), y=np.asarray(y, dtype=float), mode="lines", name=name,
        line=dict(color=PALETTE[i % len(PALETTE)], dash="dash" if name in dashed else "solid"),
    ) for i, (name, y) in enumerate(series.items())], layout=layout)


def unique_labels(labels: Sequence) -> list[str]:
    """Plotly merges equal category labels, so repeated tokens get their position appended."""
    labels = [str(t) for t in labels]
    seen: dict[str, int] = {}
    for t in labels:
        seen[t] = seen.get(t, 0) + 1
    return [f"{t} ·{i}" if seen[t] > 1 else t for i, t in enumerate(labels)]
