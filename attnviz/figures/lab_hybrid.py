"""Toy-lab figures of the Qwen3-Next hybrid beside its softmax models: every layer's map of one head (a Gated DeltaNet
layer's implicit map on a diverging scale, a softmax layer's pattern on the attention scale), every head's
previous-token and induction scores, and the attention on the first token over training.

The maps arrive as attnviz.lab.hybrid.LayerMaps (read for tokens, kinds, maps, prev_token, induction): numpy arrays,
no torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.common import (ATTENTION_SCALE, DIVERGING_SCALE, PALETTE, apply_layout, grid_layout,
                                    label_margins, legend_below, unique_labels)

SOFTMAX_KINDS = ("softmax", "gated softmax")
SHORT = {"gated delta rule": "Gated DeltaNet", "gated softmax": "gated softmax", "softmax": "softmax"}
STATISTICS = {"prev_token": "previous-token score", "induction": "induction score"}


def _is_linear(kind: str) -> bool:
    return kind not in SOFTMAX_KINDS


def _w_range(maps: Mapping, head: int) -> float:
    """The largest |w| of `head` over every linear layer drawn: the diverging scale runs from -it to +it."""
    peaks = [float(np.abs(m.maps[layer][head]).max()) for m in maps.values()
             for layer, kind in enumerate(m.kinds) if _is_linear(kind)]
    return max(peaks, default=0.0) or 1.0


def _panel_title(layer: int, kind: str, prev: float, ind: float) -> str:
    return f"L{layer} {SHORT.get(kind, kind)}<br>prev {prev:.2f} · ind {ind:.2f}"


def layer_maps_grid(maps: Mapping, *, head: int, panel_px: int = 260) -> go.Figure:
    """One row per model (named in its query axis), one panel per layer: head `head`'s map on the same text (query
    down, key across). A Gated DeltaNet layer draws its implicit map w on a diverging scale centred on 0 (from
    -max|w| to +max|w| over the linear panels: w can be negative and its rows need not sum to 1); a softmax layer
    draws its pattern on the 0-1 attention scale. Each panel's title gives the head's previous-token and induction
    scores on |w| / row sum. maps: model name -> LayerMaps. Built in one go from grid_layout."""
    names = list(maps)
    cols = max(len(m.kinds) for m in maps.values())
    tokens = unique_labels(next(iter(maps.values())).tokens)
    titles, traces = [], []
    layout = {}
    peak = _w_range(maps, head)
    every_token = dict(dtick=1) if len(tokens) <= 40 else {}
    for row, name in enumerate(names):
        m = maps[name]
        for layer in range(cols):
            i = row * cols + layer
            suffix = "" if i == 0 else str(i + 1)
            if layer >= len(m.kinds):
                titles.append("")
                continue
            kind = m.kinds[layer]
            titles.append(_panel_title(layer, kind, m.prev_token[layer, head], m.induction[layer, head]))
            what = "w" if _is_linear(kind) else "weight"
            traces.append(go.Heatmap(
                z=np.asarray(m.maps[layer][head], dtype=float), x=tokens, y=tokens, xaxis=f"x{suffix}",
                yaxis=f"y{suffix}", coloraxis="coloraxis2" if _is_linear(kind) else "coloraxis",
                hovertemplate=f"{name} layer {layer} ({kind})<br>query %{{y}}<br>key %{{x}}<br>{what} %{{z:.3f}}"
                              "<extra></extra>"))
    layout.update(grid_layout(len(names), cols, titles, horizontal_spacing=0.06, vertical_spacing=0.16))
    for i in range(len(names) * cols):
        suffix = "" if i == 0 else str(i + 1)
        row, col = divmod(i, cols)
        bottom, left = row == len(names) - 1, col == 0
        layout[f"xaxis{suffix}"].update(showticklabels=bottom, tickangle=-90, **every_token,
                                        **({"title": dict(text="key token")} if bottom else {}))
        layout[f"yaxis{suffix}"].update(autorange="reversed", showticklabels=left, **every_token,
                                        **({"title": dict(text=f"{names[row]}: query token")} if left else {}))
    for annotation in layout["annotations"]:
        annotation["font"] = dict(size=11)
    layout["coloraxis"] = dict(colorscale=ATTENTION_SCALE, cmin=0.0, cmax=1.0,
                               colorbar=dict(title=dict(text="softmax weight"), x=1.02, len=0.45, y=0.78))
    if any(t.coloraxis == "coloraxis2" for t in traces):
        layout["coloraxis2"] = dict(colorscale=DIVERGING_SCALE, cmin=-peak, cmax=peak, cmid=0.0,
                                    colorbar=dict(title=dict(text="implicit w (signed)"), x=1.02, len=0.45, y=0.22))
    fig = apply_layout(go.Figure(data=traces, layout=layout),
                       title=f"Head {head} of every layer, on the same text", height=len(names) * panel_px + 240)
    return label_margins(fig.update_layout(margin=dict(t=140)), x_labels=tokens, y_labels=tokens, x_angle=90)


def layer_scores_grid(maps: Mapping, *, panel_px: int = 200) -> go.Figure:
    """One row per model, one panel per statistic: every head's previous-token and induction score [layer, head]
    on the shares |w| / row sum (0-1, one colour bar). Layers are labelled with their mixer. maps: model name ->
    LayerMaps."""
    names = list(maps)
    titles = [f"{name}: {title}" for name in names for title in STATISTICS.values()]
    layout = grid_layout(len(names), len(STATISTICS), titles, horizontal_spacing=0.06, vertical_spacing=0.18)
    traces = []
    for row, name in enumerate(names):
        m = maps[name]
        labels = [f"L{layer} {SHORT.get(kind, kind)}" for layer, kind in enumerate(m.kinds)]
        for col, stat in enumerate(STATISTICS):
            i = row * len(STATISTICS) + col
            suffix = "" if i == 0 else str(i + 1)
            z = np.asarray(getattr(m, stat), dtype=float)
            traces.append(go.Heatmap(z=z, x=[f"H{h}" for h in range(z.shape[1])], y=labels, coloraxis="coloraxis",
                                     xaxis=f"x{suffix}", yaxis=f"y{suffix}",
                                     hovertemplate=f"{name}<br>%{{y}}, head %{{x}}<br>{STATISTICS[stat]} "
                                                   "%{z:.3f}<extra></extra>"))
            layout[f"yaxis{suffix}"].update(autorange="reversed", showticklabels=col == 0,
                                            title=dict(text="layer" if col == 0 else ""))
            layout[f"xaxis{suffix}"].update(title=dict(text="head" if row == len(names) - 1 else ""))
    for annotation in layout["annotations"]:
        annotation["font"] = dict(size=13)
    layout["coloraxis"] = dict(colorscale=ATTENTION_SCALE, cmin=0.0, cmax=1.0,
                               colorbar=dict(title=dict(text="score (share of |w|, 0–1)")))
    fig = apply_layout(go.Figure(data=traces, layout=layout), title="Each head's scores on the shares |w| / row sum",
                       height=len(names) * panel_px + 140)
    labels = [f"L{layer} {SHORT.get(kind, kind)}" for m in maps.values() for layer, kind in enumerate(m.kinds)]
    return label_margins(fig, y_labels=labels)


def first_token_curves(steps: Mapping[str, Sequence[int]], mass: Mapping[str, Sequence[float]],
                       rate: Mapping[str, Sequence[float]], *, eps: float = 0.3,
                       total_steps: int | None = None) -> go.Figure:
    """Per model, over training: the mean attention its softmax layers give the first token (alpha_0 averaged over
    texts, layers and heads; solid) and Gu et al.'s Sink_0^eps, the share of (text, layer, head) triples with
    alpha_0 > eps (dashed), both 0-1. steps, mass, rate: model -> [checkpoint]."""
    fig = go.Figure()
    for i, name in enumerate(steps):
        color = PALETTE[i % len(PALETTE)]
        x = np.asarray(steps[name])
        fig.add_trace(go.Scatter(x=x, y=np.asarray(mass[name], dtype=float), mode="lines+markers",
                                 name=f"{name}: mean α₀ (weight on the first token)", line=dict(color=color),
                                 marker=dict(size=4)))
        fig.add_trace(go.Scatter(x=x, y=np.asarray(rate[name], dtype=float), mode="lines",
                                 name=f"{name}: Sink₀^{eps:g} (share of heads with α₀ > {eps:g})",
                                 line=dict(color=color, dash="dash")))
    fig.update_yaxes(range=[0, 1.02])
    if total_steps:
        fig.update_xaxes(range=[0, total_steps])
    fig = apply_layout(fig, title="Attention on the first token over training (softmax layers)",
                       x_title="training step", y_title="share (0–1)", height=440)
    return legend_below(fig, y=-0.26, bottom=180)


def best_score_curves(steps: Mapping[str, Sequence[int]], best: Mapping[str, Mapping[str, Sequence[float]]], *,
                      statistic: str, total_steps: int | None = None) -> go.Figure:
    """Per model and mixer kind, over training: the highest score of `statistic` ("prev_token" or "induction") over
    the heads of that kind's layers, on |w| / row sum (0-1). Gated DeltaNet solid, softmax dotted; one colour per
    model. steps: model -> [checkpoint]; best: model -> kind -> [checkpoint]."""
    fig = go.Figure()
    for i, (name, kinds) in enumerate(best.items()):
        for kind, y in kinds.items():
            fig.add_trace(go.Scatter(x=np.asarray(steps[name]), y=np.asarray(y, dtype=float), mode="lines",
                                     name=f"{name}: {SHORT.get(kind, kind)}",
                                     line=dict(color=PALETTE[i % len(PALETTE)],
                                               dash="solid" if _is_linear(kind) else "dot")))
    fig.update_yaxes(range=[0, 1.02])
    if total_steps:
        fig.update_xaxes(range=[0, total_steps])
    title = STATISTICS[statistic]
    fig = apply_layout(fig, title=f"Best {title} by kind of layer", x_title="training step",
                       y_title=f"highest {title} (share of |w|, 0–1)", height=400)
    return legend_below(fig, y=-0.22, bottom=130)
