"""Figures for the softmax-saturation page: logits, attention rows, per-row statistics, curves against d_k."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attnviz.figures import raster
from attnviz.figures.common import (
    ATTENTION_SCALE, PALETTE, apply_layout, grid_layout, heatmap, label_margins, legend_below, unique_labels,
)

VARIANT_COLORS = {"scaled": PALETTE[0], "unscaled": PALETTE[1]}
REAL_COLORS = {"own scale": PALETTE[0], "unscaled": PALETTE[1], "temperature": PALETTE[2]}
LOGIT_BINS = 60
NORM_FLOOR = 1e-16  # per-row norms below this are drawn at this value on log axes (they are 0 to float64 precision)


def logit_density(x, bins: int = LOGIT_BINS) -> tuple[np.ndarray, np.ndarray]:
    """A histogram of the logits x as a density (per nat; its area is 1) over `bins` equal bins from the smallest
    to the largest: (density [bins], edges [bins + 1]). Binned here, not in the browser, so the chart carries 60
    bars instead of every logit (up to 2 x 256 x 512 numbers)."""
    x = np.asarray(x, dtype=float).ravel()
    return np.histogram(x, bins=bins, density=True)


def histogram_line(x, color: str) -> dict:
    """The histogram of x (logit_density) as one stepped line filled to zero, a trace dict without name or axes:
    point i is bin i's left edge at bin i's density, held to the next edge (line shape "hv"), and the last point
    closes the last bin at its right edge. It looks as bars do and is drawn as one path, not one element a bar: a
    step of the Softmax page's d_k slider redraws it about a quarter faster."""
    density, edges = logit_density(x)
    lo, hi = np.append(edges[:-1], edges[-2]), np.append(edges[1:], edges[-1])
    return dict(type="scatter", x=edges, y=np.append(density, density[-1]), mode="lines",
                line=dict(color=color, width=1, shape="hv"), fill="tozeroy", customdata=np.stack([lo, hi], axis=-1),
                hovertemplate="logits %{customdata[0]:.3g} to %{customdata[1]:.3g}<br>density %{y:.3g} per "
                              "nat<extra></extra>")


def variants_figure(panels: Mapping[str, dict], *, rows_shown: int, height: int = 680) -> go.Figure:
    """The random-logits section in one figure (one chart to draw per slider move, not four): a column per variant
    (panels: name -> {"scores", "pattern", "predicted_var", "title"}, optionally "variance_text", the predicted
    variance as the legend writes it). Top, the histogram of every logit as a density (logit_density) with the
    normal density of the predicted variance, dashed; bottom, the first rows_shown attention rows on one 0..1 colour
    scale, each a picture (attnviz.figures.raster: an in-chart slider swaps it in place). Built in one go from
    variants_parts."""
    traces, layout = variants_parts(panels, rows_shown=rows_shown)
    fig = go.Figure(data=traces, layout=layout)
    apply_layout(fig, height=height)
    return fig.update_layout(legend=dict(orientation="h", yanchor="bottom", y=1.06, xanchor="left", x=0.0),
                             margin=dict(t=110))


def variants_parts(panels: Mapping[str, dict], *, rows_shown: int) -> tuple[list[dict], dict]:
    """variants_figure's traces and panel layout as plain dicts, no plotly object built (a stop of an in-chart
    slider needs no more: attnviz.figures.instant)."""
    names = list(panels)
    layout = grid_layout(2, len(names), [f"Logits, {panels[n]['title']}" for n in names]
                         + [f"First {rows_shown} attention rows, {panels[n]['title']}" for n in names],
                         horizontal_spacing=0.12, vertical_spacing=0.2)
    layout["images"] = []
    traces = []
    for i, name in enumerate(names):
        top, bottom = ("" if i == 0 else str(i + 1)), str(len(names) + i + 1)
        panel = panels[name]
        color = VARIANT_COLORS.get(name, PALETTE[(i + 1) % len(PALETTE)])
        x = np.asarray(panel["scores"], dtype=float).ravel()
        traces.append(dict(histogram_line(x, color), name=f"{name}: sampled logits", xaxis=f"x{top}",
                           yaxis=f"y{top}"))
        sd = float(np.sqrt(panel["predicted_var"]))
        grid = np.linspace(min(x.min(), -4 * sd), max(x.max(), 4 * sd), 300)
        normal = np.exp(-0.5 * (grid / sd) ** 2) / (sd * np.sqrt(2 * np.pi))
        variance = panel.get("variance_text", f"{panel['predicted_var']:.4g}")
        traces.append(dict(type="scatter", x=grid, y=normal, mode="lines", name=f"{name}: normal, variance {variance}",
                           line=dict(color=color, dash="dash"), xaxis=f"x{top}", yaxis=f"y{top}"))
        rows = np.asarray(panel["pattern"], dtype=float)[:rows_shown]
        axes = (f"x{bottom}", f"y{bottom}")
        layout["images"].append(raster.map_image(rows, axes=axes, colorscale=ATTENTION_SCALE, vmin=0.0, vmax=1.0))
        traces.append(raster.map_hover(
            rows, axes=axes, hovertemplate="query %{y}<br>key %{x}<br>weight %{customdata:.4f}<extra></extra>"))
        if i == 0:  # both maps on one colour scale, one bar
            traces.append(raster.colour_bar(axes=axes, colorscale=ATTENTION_SCALE, vmin=0.0, vmax=1.0, colorbar=dict(
                title=dict(text="weight"), len=0.4, y=0.2, yanchor="middle")))
        layout[f"xaxis{top}"]["title"] = dict(text="logit q·k × scale / T (nats)")
        layout[f"yaxis{top}"]["title"] = dict(text="density (per nat)")
        x_range, y_range = raster.map_ranges(rows.shape)
        layout[f"xaxis{bottom}"].update(x_range, title=dict(text="key index"))
        layout[f"yaxis{bottom}"].update(y_range, title=dict(text="query index"))
    return traces, layout


def _box_traces(values: Mapping[str, Sequence[float]], *, log_y: bool, colors: Mapping[str, str]) -> list:
    """One box per variant with every row's value drawn beside it. On a log axis, values below NORM_FLOOR are drawn
    at NORM_FLOOR (the hover gives the true value)."""
    traces = []
    for i, (name, y) in enumerate(values.items()):
        y = np.asarray(y, dtype=float)
        shown = np.maximum(y, NORM_FLOOR) if log_y else y
        traces.append(go.Box(y=shown, name=name, boxpoints="all", jitter=0.4, pointpos=0, marker=dict(size=3),
                             line=dict(color=colors.get(name, PALETTE[i % len(PALETTE)])), showlegend=False,
                             customdata=y, hovertemplate="%{customdata:.3g}<extra>" + name + "</extra>"))
    return traces


def row_distribution(values: Mapping[str, Sequence[float]], *, title: str, y_title: str, log_y: bool = False,
                     colors: Mapping[str, str] = VARIANT_COLORS, height: int = 320) -> go.Figure:
    """One box per variant with every row's value drawn beside it: the spread, not only the mean."""
    fig = go.Figure(_box_traces(values, log_y=log_y, colors=colors))
    if log_y:
        fig.update_yaxes(type="log", exponentformat="power")
    fig.update_layout(showlegend=False)
    return apply_layout(fig, title=title, y_title=y_title, height=height)


def row_distributions(panels: Sequence[dict], *, colors: Mapping[str, str] = VARIANT_COLORS,
                      height: int = 360) -> go.Figure:
    """row_distribution side by side in one figure, one panel per dict {"values", "title", "y_title", "log_y"},
    built in one go from grid_layout (see sweep_panels)."""
    layout = grid_layout(1, len(panels), [p["title"] for p in panels])
    traces = []
    for i, panel in enumerate(panels):
        suffix = "" if i == 0 else str(i + 1)
        for trace in _box_traces(panel["values"], log_y=panel.get("log_y", False), colors=colors):
            trace.update(xaxis=f"x{suffix}", yaxis=f"y{suffix}")
            traces.append(trace)
        layout[f"yaxis{suffix}"].update(title=dict(text=panel["y_title"]),
                                        **(dict(type="log", exponentformat="power") if panel.get("log_y") else {}))
    fig = go.Figure(data=traces, layout=dict(layout, showlegend=False))
    return apply_layout(fig, height=height).update_layout(margin=dict(t=50))


def sweep_panels(sweep: pd.DataFrame, panels: Sequence[dict], *,
                 reference: Mapping[str, tuple] = (), cols: int = 3, height: int = 760) -> go.Figure:
    """Curves against d_k (log axis), one line per variant, one panel per dict {"column", "title", "y_title",
    "log_y", "band": (lo, hi) or None, "reference": bool} in one figure (one chart to draw, not six). band shades a
    percentile range; reference (name -> (x, y), e.g. a theoretical curve) is drawn dashed in the panels that ask
    for it. Variants share one legend.

    Built in one go from sweep_parts: plotly re-validates a many-panel figure on every update, which made per-panel
    updates most of the page's time on a slider move."""
    layout = grid_layout(-(-len(panels) // cols), cols, [p["title"] for p in panels], vertical_spacing=0.22)
    for i, panel in enumerate(panels):
        suffix = "" if i == 0 else str(i + 1)
        layout[f"xaxis{suffix}"].update(type="log", title=dict(text="d_k (log scale)"))
        layout[f"yaxis{suffix}"].update(title=dict(text=panel["y_title"]),
                                        **(dict(type="log", exponentformat="power") if panel.get("log_y") else {}))
    fig = go.Figure(data=sweep_traces(sweep, panels, reference=reference), layout=layout)
    apply_layout(fig, height=height)
    return fig.update_layout(legend=dict(orientation="h", yanchor="bottom", y=1.04, xanchor="left", x=0.0),
                             margin=dict(t=90))


def sweep_traces(sweep: pd.DataFrame, panels: Sequence[dict], *, reference: Mapping[str, tuple] = ()) -> list[dict]:
    """sweep_panels' traces as plain dicts, no plotly object built (a stop of an in-chart slider needs no more)."""
    ordered = list(sweep.sort_values("d_k").groupby("variant", sort=False))
    traces = []
    for i, panel in enumerate(panels):
        suffix = "" if i == 0 else str(i + 1)
        on = dict(xaxis=f"x{suffix}", yaxis=f"y{suffix}")
        log_y, band = panel.get("log_y", False), panel.get("band")
        for variant, part in ordered:
            color = VARIANT_COLORS.get(variant, PALETTE[3])
            x = part["d_k"].to_numpy()
            if band is not None:
                lo, hi = (np.maximum(part[c].to_numpy(float), NORM_FLOOR) if log_y else part[c].to_numpy(float)
                          for c in band)
                traces.append(dict(type="scatter", x=np.concatenate([x, x[::-1]]),
                                   y=np.concatenate([hi, lo[::-1]]), fill="toself", fillcolor=color, opacity=0.18,
                                   line=dict(width=0), hoverinfo="skip", showlegend=False,
                                   name=f"{variant} 10-90 %", **on))
            y = part[panel["column"]].to_numpy(float)
            traces.append(dict(type="scatter", x=x, y=np.maximum(y, NORM_FLOOR) if log_y else y,
                               mode="lines+markers", name=variant, legendgroup=variant, showlegend=i == 0,
                               line=dict(color=color), marker=dict(size=5), **on))
        if panel.get("reference"):
            for j, (name, (x, y)) in enumerate(dict(reference).items()):
                traces.append(dict(type="scatter", x=np.asarray(x), y=np.asarray(y, dtype=float), mode="lines",
                                   name=name, line=dict(color=PALETTE[(j + 4) % len(PALETTE)], dash="dash"), **on))
    return traces


def logit_formula(factor: str, bias: bool, softcap) -> str:
    """What a real head's softmax is fed, as the page writes it: q·k times a factor (" × 0.125", "" for none),
    soft-capped at `softcap` (None or 0: not), plus the bias b when `bias`."""
    x = f"q·k{factor}"
    if softcap:
        x = f"{softcap:g}·tanh({x} / {softcap:g})"
    return f"{x} + b" if bias else x


def real_map_titles(scaling: float, temperature: float, *, bias: bool, softcap) -> dict[str, str]:
    """The titles of attnviz.softmax.head_variants' three maps ("own scale", "unscaled", "temperature"), each with
    what its softmax is fed."""
    return {"own scale": f"Own scale: {logit_formula(f' × {scaling:.3g}', bias, softcap)}",
            "unscaled": f"Unscaled: {logit_formula('', bias, softcap)}",
            "temperature": f"Own scale ÷ T, T = {temperature:g}"}


def head_patterns(patterns: Mapping[str, np.ndarray], tokens: Sequence[str], *, height: int = 440) -> go.Figure:
    """A real head's pattern [query, key] under each softmax (title -> pattern), side by side in one figure on one
    fixed 0..1 colour scale, token labels on the axes. Each map's trace is named by its title."""
    titles = list(patterns)
    layout = grid_layout(1, len(titles), titles, horizontal_spacing=0.08)
    labels = [str(t) for t in tokens]
    unique = unique_labels(labels)
    traces = []
    for i, title in enumerate(titles):
        suffix = "" if i == 0 else str(i + 1)
        traces.append(go.Heatmap(z=np.asarray(patterns[title], dtype=float), x=unique, y=unique, name=title,
                                 zmin=0.0, zmax=1.0, colorscale=ATTENTION_SCALE, showscale=i == len(titles) - 1,
                                 colorbar=dict(title=dict(text="weight")), xaxis=f"x{suffix}", yaxis=f"y{suffix}",
                                 hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.4f}<extra></extra>"))
        layout[f"xaxis{suffix}"]["title"] = dict(text="key token")
        layout[f"yaxis{suffix}"].update(autorange="reversed", **({"title": dict(text="query token")} if i == 0 else
                                                                  {"showticklabels": False}))
    fig = go.Figure(data=traces, layout=layout)
    apply_layout(fig, height=height)
    return label_margins(fig.update_layout(margin=dict(t=60)), x_labels=unique, y_labels=unique, x_angle=90)


def head_row(patterns: Mapping[str, np.ndarray], tokens: Sequence[str], *, title: str,
             height: int = 400) -> go.Figure:
    """One query row of a head under each variant, as grouped bars over the keys it may attend to."""
    fig = go.Figure()
    for i, (name, p) in enumerate(patterns.items()):
        fig.add_trace(go.Bar(x=list(range(len(p))), y=np.asarray(p, dtype=float), name=name,
                             customdata=list(tokens), marker_color=REAL_COLORS.get(name, PALETTE[i % len(PALETTE)]),
                             hovertemplate="key %{x} %{customdata}<br>weight %{y:.4f}<extra>" + name + "</extra>"))
    fig.update_layout(barmode="group")
    fig.update_xaxes(tickmode="array", tickvals=list(range(len(tokens))), ticktext=[str(t) for t in tokens])
    apply_layout(fig, title=title, x_title="key token", y_title="attention weight (0 to 1)", height=height)
    return legend_below(fig, y=-0.45, bottom=150)


def scale_sweep_chart(sweep: pd.DataFrame, *, own_factor: float, temperature_factor: float | None = None,
                      title: str, height: int = 360) -> go.Figure:
    """A real head's mean max weight, saturated share and median Jacobian norm against the factor on raw q·k."""
    fig = go.Figure()
    x = sweep["factor"].to_numpy()
    for i, (column, name) in enumerate((("max_weight", "mean max weight"), ("saturated_share", "saturated share"),
                                        ("jac_p50", "median Jacobian norm (Frobenius)"))):
        fig.add_trace(go.Scatter(x=x, y=sweep[column].to_numpy(float), mode="lines", name=name,
                                 line=dict(color=PALETTE[i])))
    _log_vline(fig, own_factor, "own scale", PALETTE[0], "left")
    _log_vline(fig, 1.0, "unscaled", PALETTE[1], "right")
    if temperature_factor is not None:
        _log_vline(fig, temperature_factor, "temperature", PALETTE[2], "right", y=0.9)
    fig.update_xaxes(type="log")
    apply_layout(fig, title=title, x_title="factor multiplying raw q·k (log scale)",
                 y_title="weight, share or norm (0 to 1)", height=height)
    return legend_below(fig, y=-0.3, bottom=100)


def _log_vline_parts(x: float, text: str, color: str, side: str, y: float = 1.0, axis: str = "") -> tuple[dict, dict]:
    """(shape, annotation) of a dotted vertical marker on a log x axis: the line takes data units, its label log10
    units. axis: the subplot's axis suffix ("" for the first, "2" for x2/y2, ...); the marker spans that subplot's
    height."""
    shape = dict(type="line", x0=x, x1=x, y0=0, y1=1, xref=f"x{axis}", yref=f"y{axis} domain",
                 line=dict(color=color, dash="dot", width=1.5))
    note = dict(x=float(np.log10(x)), y=y, xref=f"x{axis}", yref=f"y{axis} domain", text=text, showarrow=False,
                font=dict(color=color), xanchor="right" if side == "left" else "left", yanchor="top")
    return shape, note


def _log_vline(fig: go.Figure, x: float, text: str, color: str, side: str, y: float = 1.0, axis: str = "") -> None:
    """Adds the marker of _log_vline_parts to fig."""
    shape, note = _log_vline_parts(x, text, color, side, y=y, axis=axis)
    fig.add_shape(shape)
    fig.add_annotation(note)


def head_share_grid(share, layers: Sequence[int], *, title: str, height: int = 420) -> go.Figure:
    """The saturated share of every head, [layer, head], on a fixed 0..1 scale."""
    share = np.asarray(share, dtype=float)
    return heatmap(share, x_labels=[f"h{h}" for h in range(share.shape[1])], y_labels=[f"L{i}" for i in layers],
                   title=title, x_title="head", y_title="layer", zmin=0.0, zmax=1.0,
                   colorbar_title="share", height=height,
                   hovertemplate="layer %{y}, head %{x}<br>saturated rows %{z:.1%}<extra></extra>")
