"""Figures of the layers that are not plain softmax attention: a linear mixer's implicit map (signed, on a diverging
scale), its heads' statistics on |w|, the output gate of gated softmax attention, and every layer's kind."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.common import PALETTE, apply_layout, heatmap
from attnviz.figures.heads import signed_map

KIND_COLOURS = {"softmax": "#4c78a8", "gated softmax": "#72b7b2", "indexed": "#54a24b", "gated delta rule": "#e45756",
                "mamba2": "#f58518", "softmax + mamba2": "#b279a2", "conv": "#9d755d", "mlp": "#bab0ac"}


def implicit_map(w: np.ndarray, tokens: Sequence[str], *, title: str) -> go.Figure:
    """One head of a linear mixer's implicit map w [query, key] (o_t = Σ_s w_ts v_s): white is 0, the two colours
    the two signs, keys after the query (which it never sees) grey."""
    w = np.asarray(w, dtype=np.float64).copy()
    w[np.triu_indices(w.shape[0], 1, w.shape[1])] = np.nan
    return signed_map(w, tokens, title=title, colorbar_title="w (signed)", hover_name="w")


def gate_heatmap(gate: np.ndarray, tokens: Sequence[str], *, title: str) -> go.Figure:
    """A gated softmax layer's output gate [head, query], each head's mean over its channels: near 0 the head's
    output at that query is all but shut, near 1 it passes."""
    labels = [f"{i}: {t}" for i, t in enumerate(tokens)]
    return heatmap(gate, x_labels=labels, y_labels=[f"H{h}" for h in range(gate.shape[0])], title=title,
                   x_title="query token (position: token)", y_title="head", zmin=0.0, zmax=1.0,
                   colorbar_title="mean gate", hovertemplate="head %{y}<br>query %{x}<br>gate %{z:.3f}<extra></extra>",
                   height=min(700, 220 + 22 * gate.shape[0]))


def distance_profiles(profile: np.ndarray, *, title: str, max_distance: int = 64) -> go.Figure:
    """Each head's mean share of |w| at each distance back (query − key), up to max_distance tokens."""
    profile = np.asarray(profile)[:, :max_distance + 1]
    fig = go.Figure()
    for head, row in enumerate(profile):
        fig.add_trace(go.Scatter(x=np.arange(row.size), y=row, mode="lines", name=f"H{head}",
                                 line=dict(color=PALETTE[head % len(PALETTE)])))
    return apply_layout(fig, title=title, x_title="distance back, query − key (tokens)",
                        y_title="mean share of |w| (fraction of the row)")


def kinds_strip(kinds: Sequence[str], *, title: str = "Each layer's token mixer") -> go.Figure:
    """One coloured cell per model layer, named by its kind (attnviz.mixers.kinds)."""
    fig = go.Figure()
    for kind in dict.fromkeys(kinds):
        layers = [i for i, k in enumerate(kinds) if k == kind]
        fig.add_trace(go.Bar(x=layers, y=[1] * len(layers), name=kind, marker_color=KIND_COLOURS.get(kind, "#999"),
                             hovertemplate=f"layer %{{x}}: {kind}<extra></extra>", width=0.9))
    fig.update_yaxes(visible=False)
    fig.update_xaxes(dtick=1 if len(kinds) <= 40 else None)
    fig.update_layout(showlegend=True)  # the legend names the kinds, one of them too
    return apply_layout(fig, title=title, x_title="model layer", height=200)


def gate_sink_bars(rows: Mapping[str, Sequence[float]], labels: Sequence[str], *, title: str) -> go.Figure:
    """Per head of the gated layers: sink mass beside the share of gates under 0.1, side by side (both fractions)."""
    fig = go.Figure()
    for i, (name, values) in enumerate(rows.items()):
        fig.add_trace(go.Bar(x=list(labels), y=list(values), name=name, marker_color=PALETTE[i % len(PALETTE)]))
    fig.update_layout(barmode="group")
    return apply_layout(fig, title=title, x_title="layer and head", y_title="fraction (0 to 1)")


def selection_over_pattern(dense: np.ndarray, kept: np.ndarray, tokens: Sequence[str], *, title: str) -> go.Figure:
    """The dense pattern [query, key] the head's q and k would give over every causal key, with the keys its
    indexer kept marked by a white-edged square: weight outside the squares is what the selection dropped."""
    labels = [f"{i}: {t}" for i, t in enumerate(tokens)]
    d = np.asarray(dense, dtype=float).copy()
    d[np.triu_indices(d.shape[0], 1, d.shape[1])] = np.nan
    fig = heatmap(d, x_labels=labels, y_labels=labels, title=title, x_title="key token (position: token)",
                  y_title="query token (position: token)", zmin=0.0, zmax=1.0, colorbar_title="dense weight",
                  hovertemplate="query %{y}<br>key %{x}<br>dense weight %{z:.4f}<extra></extra>",
                  height=min(900, 260 + 14 * d.shape[0]))
    q, k = np.nonzero(np.asarray(kept))
    fig.add_trace(go.Scatter(x=[labels[i] for i in k], y=[labels[i] for i in q], mode="markers",
                             name="kept by the indexer",
                             marker=dict(symbol="square-open", size=9, color="white", line=dict(width=1.5)),
                             hoverinfo="skip"))
    return fig


def outside_mass(outside: np.ndarray, tokens: Sequence[str], *, title: str) -> go.Figure:
    """Per query, the dense weight on keys the indexer dropped: what dense attention would have added."""
    fig = go.Figure(go.Bar(x=[f"{i}: {t}" for i, t in enumerate(tokens)], y=np.asarray(outside),
                           marker_color=PALETTE[0], hovertemplate="query %{x}<br>%{y:.3f} dropped<extra></extra>"))
    return apply_layout(fig, title=title, x_title="query token (position: token)",
                        y_title="dense mass outside the selection (fraction)")
