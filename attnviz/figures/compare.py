"""Two models of different shapes side by side: a statistic's spread over heads, and per-layer curves against
relative depth (layer / (layers - 1)), so a 30-layer and an 18-layer model share one axis."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.common import PALETTE, apply_layout

KIND_MARKERS = {"global": "circle", "local": "triangle-up"}


def distributions(values: Mapping[str, Sequence[float]], *, title: str, y_title: str) -> go.Figure:
    """One box per model (its median, quartiles and every point beside it) of a statistic over its heads (or
    triples); NaN values left out."""
    fig = go.Figure()
    for i, (name, v) in enumerate(values.items()):
        v = np.asarray(v, dtype=float)
        v = v[np.isfinite(v)]
        fig.add_trace(go.Box(y=v.tolist(), name=f"{name} ({len(v):,})", boxpoints="all", jitter=0.4, pointpos=-1.6,
                             marker=dict(color=PALETTE[i % len(PALETTE)], size=4, opacity=0.55),
                             line=dict(color=PALETTE[i % len(PALETTE)])))
    apply_layout(fig, title=title, x_title="model (how many values)", y_title=y_title, height=440)
    fig.update_layout(showlegend=False)
    return fig


def depth_curve(shape, layers: Sequence[int], values: Sequence[float]):
    """(relative depth, values, kinds) of one model's per-layer values for depth_curves; kinds only where the model
    has layers of two kinds (attnviz.shape.ModelShape)."""
    kinds = [shape.layer_kind(x) for x in layers] if shape.kinds_summary() else None
    return shape.relative_depth(layers), [float(v) for v in values], kinds


def depth_curves(curves: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[str] | None]], *, title: str,
                 y_title: str) -> go.Figure:
    """One line per model of a per-layer value against relative depth. curves: {model: (depth, value, kinds)};
    kinds (each layer's "local" or "global", or None) set the marker, so a model's two kinds of layer show apart."""
    fig = go.Figure()
    for i, (name, (depth, value, kinds)) in enumerate(curves.items()):
        symbols = [KIND_MARKERS.get(k, "circle") for k in kinds] if kinds else "circle"
        text = [f"layer {j}" + (f" ({kinds[j]})" if kinds else "") for j in range(len(depth))]
        fig.add_trace(go.Scatter(x=list(depth), y=list(value), mode="lines+markers", name=name, text=text,
                                 line=dict(color=PALETTE[i % len(PALETTE)], width=2),
                                 marker=dict(symbol=symbols, size=9),
                                 hovertemplate=f"{name}, %{{text}}<br>depth %{{x:.2f}}<br>%{{y:.3g}}<extra></extra>"))
    if any(kinds and len(set(kinds)) > 1 for _, _, kinds in curves.values()):
        for kind, symbol in KIND_MARKERS.items():  # a legend entry per marker shape
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"{kind} layer",
                                     marker=dict(symbol=symbol, size=9, color="#868e96")))
    apply_layout(fig, title=title, x_title="relative depth (layer / (layers − 1): 0 first, 1 last)",
                 y_title=y_title, height=440)
    fig.update_xaxes(range=[-0.03, 1.03])
    return fig
