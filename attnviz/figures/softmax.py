"""Figures for the softmax-saturation page: logits, attention rows, per-row statistics, curves against d_k."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attnviz.figures.common import PALETTE, apply_layout, heatmap

VARIANT_COLORS = {"scaled": PALETTE[0], "unscaled": PALETTE[1]}
REAL_COLORS = {"own scale": PALETTE[0], "unscaled": PALETTE[1], "temperature": PALETTE[2]}
NORM_FLOOR = 1e-16  # per-row norms below this are drawn at this value on log axes (they are 0 to float64 precision)


def logit_histogram(scores, *, predicted_var: float, title: str, color: str = PALETTE[0],
                    height: int = 360) -> go.Figure:
    """Histogram (as a density) of all logits in scores, with the normal density of the predicted variance."""
    x = np.asarray(scores, dtype=float).ravel()
    fig = go.Figure(go.Histogram(x=x, histnorm="probability density", nbinsx=60, name="sampled logits",
                                 marker_color=color, opacity=0.75))
    sd = float(np.sqrt(predicted_var))
    grid = np.linspace(min(x.min(), -4 * sd), max(x.max(), 4 * sd), 300)
    density = np.exp(-0.5 * (grid / sd) ** 2) / (sd * np.sqrt(2 * np.pi))
    fig.add_trace(go.Scatter(x=grid, y=density, mode="lines", name=f"normal, variance {predicted_var:.4g}",
                             line=dict(color="#1f2330", dash="dash")))
    apply_layout(fig, title=title, x_title="logit q·k × scale / T (nats)", y_title="density (per nat)",
                 height=height)
    return _legend_below(fig)


def attention_rows(pattern, *, title: str, height: int = 300) -> go.Figure:
    """The first rows of an attention pattern [query, key] on a fixed 0..1 colour scale."""
    return heatmap(pattern, title=title, x_title="key index", y_title="query index", zmin=0.0, zmax=1.0,
                   colorbar_title="weight", height=height,
                   hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.4f}<extra></extra>")


def row_distribution(values: Mapping[str, Sequence[float]], *, title: str, y_title: str, log_y: bool = False,
                     colors: Mapping[str, str] = VARIANT_COLORS, height: int = 320) -> go.Figure:
    """One box per variant with every row's value drawn beside it: the spread, not only the mean.

    On a log axis, values below NORM_FLOOR are drawn at NORM_FLOOR (the hover says so).
    """
    fig = go.Figure()
    for i, (name, y) in enumerate(values.items()):
        y = np.asarray(y, dtype=float)
        shown = np.maximum(y, NORM_FLOOR) if log_y else y
        fig.add_trace(go.Box(y=shown, name=name, boxpoints="all", jitter=0.4, pointpos=0, marker=dict(size=3),
                             line=dict(color=colors.get(name, PALETTE[i % len(PALETTE)])),
                             customdata=y, hovertemplate="%{customdata:.3g}<extra>" + name + "</extra>"))
    if log_y:
        fig.update_yaxes(type="log", exponentformat="power")
    fig.update_layout(showlegend=False)
    return apply_layout(fig, title=title, y_title=y_title, height=height)


def sweep_chart(sweep: pd.DataFrame, column: str, *, title: str, y_title: str, current_d_k: int | None = None,
                band: tuple[str, str] | None = None, log_y: bool = False, reference: Mapping[str, tuple] = (),
                height: int = 380) -> go.Figure:
    """column against d_k (log axis), one line per variant; band=(lo, hi) shades a percentile range.

    reference: extra dashed lines, name -> (x, y), e.g. a theoretical curve. current_d_k draws a vertical marker.
    """
    fig = go.Figure()
    for variant, part in sweep.sort_values("d_k").groupby("variant", sort=False):
        color = VARIANT_COLORS.get(variant, PALETTE[3])
        x = part["d_k"].to_numpy()
        if band is not None:
            lo, hi = (np.maximum(part[c].to_numpy(float), NORM_FLOOR) if log_y else part[c] for c in band)
            fig.add_trace(go.Scatter(x=np.concatenate([x, x[::-1]]), y=np.concatenate([hi, lo[::-1]]),
                                     fill="toself", fillcolor=color, opacity=0.18, line=dict(width=0),
                                     hoverinfo="skip", showlegend=False, name=f"{variant} 10-90 %"))
        y = part[column].to_numpy(float)
        fig.add_trace(go.Scatter(x=x, y=np.maximum(y, NORM_FLOOR) if log_y else y, mode="lines+markers",
                                 name=variant, line=dict(color=color), marker=dict(size=5)))
    for i, (name, (x, y)) in enumerate(dict(reference).items()):
        fig.add_trace(go.Scatter(x=np.asarray(x), y=np.asarray(y, dtype=float), mode="lines", name=name,
                                 line=dict(color=PALETTE[(i + 4) % len(PALETTE)], dash="dash")))
    if current_d_k is not None:
        _log_vline(fig, current_d_k, f"d_k = {current_d_k}", "#868e96", "left")
    fig.update_xaxes(type="log")
    if log_y:
        fig.update_yaxes(type="log", exponentformat="power")
    apply_layout(fig, title=title, x_title="d_k (log scale)", y_title=y_title, height=height)
    return _legend_below(fig)


def head_pattern(pattern, tokens: Sequence[str], *, title: str, height: int = 380) -> go.Figure:
    """A real head's pattern [query, key] with token labels, on a fixed 0..1 colour scale."""
    return heatmap(pattern, x_labels=tokens, y_labels=tokens, title=title, x_title="key token",
                   y_title="query token", zmin=0.0, zmax=1.0, colorbar_title="weight", height=height,
                   hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.4f}<extra></extra>")


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
    return _legend_below(fig, y=-0.45, bottom=150)


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
    return _legend_below(fig)


def _log_vline(fig: go.Figure, x: float, text: str, color: str, side: str, y: float = 1.0) -> None:
    """A dotted vertical marker on a log x axis: the line takes data units, its annotation log10 units."""
    lx = float(np.log10(x))
    fig.add_shape(type="line", x0=x, x1=x, y0=0, y1=1, xref="x", yref="paper",
                  line=dict(color=color, dash="dot", width=1.5))
    fig.add_annotation(x=lx, y=y, xref="x", yref="paper", text=text, showarrow=False, font=dict(color=color),
                       xanchor="right" if side == "left" else "left", yanchor="top")


def _legend_below(fig: go.Figure, y: float = -0.3, bottom: int = 100) -> go.Figure:
    """Legend under the x-axis title, so it never covers a title in a narrow column."""
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=y, xanchor="left", x=0.0),
                      margin=dict(b=bottom))
    return fig


def head_share_grid(share, layers: Sequence[int], *, title: str, height: int = 420) -> go.Figure:
    """The saturated share of every head, [layer, head], on a fixed 0..1 scale."""
    share = np.asarray(share, dtype=float)
    return heatmap(share, x_labels=[f"h{h}" for h in range(share.shape[1])], y_labels=[f"L{i}" for i in layers],
                   title=title, x_title="head", y_title="layer", zmin=0.0, zmax=1.0,
                   colorbar_title="share", height=height,
                   hovertemplate="layer %{y}, head %{x}<br>saturated rows %{z:.1%}<extra></extra>")
