"""Figures of the variants page: head sharing, KV-cache memory, FLOPs against N, toy maps, parameter shares."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.figures.common import ATTENTION_SCALE, PALETTE, apply_layout, line_chart

GIB = 2 ** 30


def head_sharing_figure(n_heads: int, layouts: Mapping[str, Sequence[int]]) -> go.Figure:
    """One panel per variant: query heads on top, KV heads below, a line from each query head to the KV head it
    reads. layouts: variant name -> kv_head_of list (length n_heads). Colours mark groups sharing a KV head."""
    names = list(layouts)
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=[
        f"{name}: {n_heads} query heads, {max(layouts[name]) + 1} KV head{'s' if max(layouts[name]) else ''}"
        for name in names], horizontal_spacing=0.04)
    for col, name in enumerate(names, start=1):
        kv_of = list(layouts[name])
        n_kv = max(kv_of) + 1
        kv_x = [(g + 0.5) * n_heads / n_kv - 0.5 for g in range(n_kv)]  # each KV head centred under its group
        for h, g in enumerate(kv_of):
            fig.add_trace(go.Scatter(x=[h, kv_x[g]], y=[1, 0], mode="lines", showlegend=False, hoverinfo="skip",
                                     line=dict(color=PALETTE[g % len(PALETTE)], width=2)), row=1, col=col)
        fig.add_trace(go.Scatter(
            x=list(range(n_heads)), y=[1] * n_heads, mode="markers+text", showlegend=False,
            text=[f"Q{h}" for h in range(n_heads)], textposition="top center",
            marker=dict(symbol="square", size=16, color=[PALETTE[g % len(PALETTE)] for g in kv_of]),
            hovertemplate="query head %{x}<extra></extra>"), row=1, col=col)
        fig.add_trace(go.Scatter(
            x=kv_x, y=[0] * n_kv, mode="markers+text", showlegend=False,
            text=[f"KV{g}" for g in range(n_kv)], textposition="bottom center",
            marker=dict(symbol="diamond", size=18, color=[PALETTE[g % len(PALETTE)] for g in range(n_kv)]),
            customdata=[[kv_of.count(g)] for g in range(n_kv)],
            hovertemplate="KV head: shared by %{customdata[0]} query heads<extra></extra>"), row=1, col=col)
        fig.update_xaxes(title_text="head index", range=[-0.8, n_heads - 0.2], showgrid=False, zeroline=False,
                         row=1, col=col)
        fig.update_yaxes(range=[-0.45, 1.45], tickvals=[0, 1], ticktext=["K/V heads", "query heads"],
                         showticklabels=col == 1, showgrid=False, zeroline=False, row=1, col=col)
    return apply_layout(fig, title="Which key/value head each query head reads", height=300)


def kv_cache_figure(seq_lens, curves: Mapping[str, Sequence[float]], *, batch: int, bytes_per_value: float,
                    budget_gib: float | None = None) -> go.Figure:
    """KV-cache size (GiB) against context length, one line per model; log-log. curves hold bytes."""
    fig = line_chart(np.asarray(seq_lens), {name: np.asarray(b, dtype=float) / GIB for name, b in curves.items()},
                     title=f"KV cache for batch {batch} at {bytes_per_value:g} bytes per value",
                     x_title="context length (tokens)", y_title="KV cache (GiB)", log_x=True, log_y=True, height=420)
    fig.update_traces(hovertemplate="%{x:,} tokens: %{y:.3g} GiB")
    if budget_gib:
        x = np.asarray(seq_lens)
        fig.add_trace(go.Scatter(x=[x.min(), x.max()], y=[budget_gib, budget_gib], mode="lines",
                                 name=f"{budget_gib:g} GiB budget", line=dict(color="#868e96", dash="dot"),
                                 hovertemplate=f"{budget_gib:g} GiB<extra></extra>"))
    return fig


def flops_figure(seq_lens, projections, attention, *, crossover: float, d_model: int, causal: bool) -> go.Figure:
    """FLOPs of one layer's projections and attention matmuls against N, log-log, with the crossover marked."""
    fig = line_chart(np.asarray(seq_lens), {"projections Q, K, V, O": projections,
                                            "attention matmuls Q K^T and pattern V": attention},
                     title=f"FLOPs of one attention layer, d_model = {d_model}{', causal' if causal else ''}",
                     x_title="sequence length N (tokens)", y_title="FLOPs per layer (multiply-add = 2)",
                     log_x=True, log_y=True, height=420)
    fig.update_traces(hovertemplate="N = %{x:,}: %{y:.3g} FLOPs")
    fig.add_vline(x=crossover, line=dict(color="#c2255c", dash="dash"),
                  annotation_text=f"crossover N = {crossover:,.0f}", annotation_position="top left")
    return fig


def variant_maps_figure(patterns: Mapping[str, np.ndarray], heads: Sequence[int], kv_heads: Mapping[str, Sequence[int]]
                        ) -> go.Figure:
    """A grid of attention maps: one row per variant, one column per chosen head. patterns: name -> [head, n, n]."""
    names = list(patterns)
    titles = [f"{name} · head {h} (KV {kv_heads[name][h]})" for name in names for h in heads]
    fig = make_subplots(rows=len(names), cols=len(heads), subplot_titles=titles,
                        horizontal_spacing=0.02, vertical_spacing=0.08)
    for r, name in enumerate(names, start=1):
        for c, h in enumerate(heads, start=1):
            fig.add_trace(go.Heatmap(z=patterns[name][h], coloraxis="coloraxis",
                                     hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.3f}<extra></extra>"),
                          row=r, col=c)
            fig.update_yaxes(autorange="reversed", showticklabels=c == 1, row=r, col=c,
                             title_text="query position" if c == 1 else None)
            fig.update_xaxes(showticklabels=r == len(names), row=r, col=c,
                             title_text="key position" if r == len(names) else None)
    fig.update_layout(coloraxis=dict(colorscale=ATTENTION_SCALE, cmin=0, cmax=1,
                                     colorbar=dict(title=dict(text="weight"))))
    fig.update_annotations(font_size=11)
    return apply_layout(fig, title="The same input through MHA, GQA and MQA", height=190 * len(names) + 90)


def param_share_figure(counts: Mapping[str, Mapping[str, int]],
                       parts: Sequence[str] = ("embeddings", "attention", "mlp", "norms", "lm_head", "pooler")
                       ) -> go.Figure:
    """Stacked bars: each model's parameters split by part, as a percentage of its total."""
    models = list(counts)
    fig = go.Figure()
    for i, part in enumerate(parts):
        share = [100.0 * counts[m][part] / counts[m]["total"] for m in models]
        raw = [counts[m][part] for m in models]
        fig.add_trace(go.Bar(x=models, y=share, name=part.replace("_", " "), marker_color=PALETTE[i % len(PALETTE)],
                             customdata=raw, hovertemplate="%{x}: %{y:.1f}% (%{customdata:,})<extra>" + part + "</extra>"))
    fig.update_layout(barmode="stack")
    return apply_layout(fig, title="Where the parameters are", x_title="model", y_title="share of parameters (%)",
                        height=400)
