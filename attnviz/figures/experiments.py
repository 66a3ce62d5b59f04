"""Figures for the Experiments page: attention rows during generation, top-k and the KV cache, the knock-out effect
grid and its scatter against a per-head statistic, rollout beside the raw last layer, and raw weights beside
norm-based attention."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.figures.common import (
    ATTENTION_SCALE, DIVERGING_SCALE, PALETTE, apply_layout, heatmap, label_margins, line_chart,
)


def _labels(tokens: Sequence[str]) -> list[str]:
    return [f"{i}: {t}" for i, t in enumerate(tokens)]


def step_rows(rows: np.ndarray, tokens: Sequence[str], *, query: str) -> go.Figure:
    """rows [layer, head, key]: one generation step's query row in every head, one heatmap row per head."""
    n_layers, n_heads, n_keys = rows.shape
    z = rows.reshape(n_layers * n_heads, n_keys)
    return heatmap(z, x_labels=_labels(tokens[:n_keys]),
                   y_labels=[f"L{layer} H{head}" for layer in range(n_layers) for head in range(n_heads)],
                   zmin=0.0, zmax=1.0, colorbar_title="weight",
                   title=f"Where the query {query} looks, in every head",
                   x_title="key (position: token, in the cache)", y_title="layer and head",
                   hovertemplate="%{y}<br>key %{x}<br>weight %{z:.3f}<extra></extra>",
                   height=min(1400, max(320, 12 * z.shape[0] + 140)))


def generation_step(gen, step: int) -> go.Figure:
    """step_rows of one step of a Generation (attnviz.generation): the newest token's row in every head, over the
    tokens in the cache when generated token `step` was chosen."""
    s = gen.steps[step]
    return step_rows(s.rows, gen.tokens, query=f"{s.position} ({gen.tokens[s.position]!s})")


def top_k_bars(labels: Sequence[str], probs: np.ndarray, chosen: int | None) -> go.Figure:
    """probs [k] of the k most likely next tokens (labels); the bar at index `chosen` is the token generated."""
    colors = [PALETTE[1] if i == chosen else PALETTE[0] for i in range(len(probs))]
    x = [f"{i + 1}. {label}" for i, label in enumerate(labels)]  # ranked, so equal-looking tokens stay apart
    fig = go.Figure(go.Bar(x=x, y=100 * np.asarray(probs, dtype=float), marker_color=colors,
                           hovertemplate="%{x}<br>%{y:.2f}%<extra></extra>"))
    return apply_layout(fig, title="Most likely next tokens (orange: the one generated)",
                        x_title="next token (rank. token)", y_title="probability (%, temperature 1)", height=320)


def cache_growth(tokens: Sequence[int], nbytes: Sequence[int], current: int) -> go.Figure:
    """The KV cache's size (KiB) against its length after each step; the current step marked."""
    kib = np.asarray(nbytes, dtype=float) / 1024
    fig = line_chart(list(tokens), {"KV cache": kib},
                     title="KV cache after each step (every layer's keys and values)",
                     x_title="tokens in the cache", y_title="size (KiB, float32)", height=300)
    fig.add_trace(go.Scatter(x=[tokens[current]], y=[kib[current]], mode="markers", name="this step",
                             marker=dict(color=PALETTE[1], size=10)))
    return fig


def effect_grid(values: np.ndarray, *, what: str, unit: str) -> go.Figure:
    """values [layer, head]: one knock-out effect per head, diverging around 0 (red: the knock-out raised it)."""
    values = np.asarray(values, dtype=float)
    bound = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 1.0
    return heatmap(values, x_labels=[f"H{h}" for h in range(values.shape[1])],
                   y_labels=[f"L{layer}" for layer in range(values.shape[0])], colorscale=DIVERGING_SCALE,
                   zmin=-bound or -1.0, zmax=bound or 1.0, colorbar_title=unit,
                   title=f"{what} when each head is knocked out", x_title="head",
                   y_title="layer (0 = nearest the input)",
                   hovertemplate="%{y} %{x}<br>%{z:+.4f} " + unit + "<extra></extra>",
                   height=max(300, 18 * values.shape[0] + 140))


def effect_scatter(stat: np.ndarray, effect: np.ndarray, labels: Sequence[str], *, stat_name: str,
                   effect_name: str) -> go.Figure:
    """One point per head: its statistic (x) against its knock-out effect (y)."""
    fig = go.Figure(go.Scatter(x=np.asarray(stat, dtype=float), y=np.asarray(effect, dtype=float), mode="markers",
                               text=list(labels), marker=dict(color=PALETTE[0], size=7, opacity=0.75),
                               hovertemplate="%{text}<br>" + stat_name
                               + " %{x:.3f}<br>effect %{y:+.4f}<extra></extra>"))
    fig.add_hline(y=0, line=dict(color="#868e96", width=1))
    return apply_layout(fig, title=f"Knock-out effect against the head's {stat_name}", x_title=stat_name,
                        y_title=effect_name, height=380)


def rollout_beside_raw(rollout_row: np.ndarray, raw_row: np.ndarray, tokens: Sequence[str], *, query: int,
                       layer: int) -> go.Figure:
    """Two bars per key: the rollout of query `query` through layer `layer`, and that layer's raw attention
    (heads averaged)."""
    x = _labels(tokens[:len(raw_row)])
    fig = go.Figure([
        go.Bar(x=x, y=np.asarray(rollout_row, dtype=float), name=f"rollout (layers 0 to {layer})",
               marker_color=PALETTE[0],
               hovertemplate="%{x}<br>rollout %{y:.3f}<extra></extra>"),
        go.Bar(x=x, y=np.asarray(raw_row, dtype=float), name=f"layer {layer} alone, raw (heads averaged)",
               marker_color=PALETTE[1], hovertemplate="%{x}<br>raw %{y:.3f}<extra></extra>"),
    ])
    fig.update_layout(barmode="group")
    return apply_layout(fig, title=f"Query {query}: {tokens[query]}", x_title="key (position: token)",
                        y_title="share (each set sums to 1)", height=360)


def rollout_map(joint: np.ndarray, tokens: Sequence[str], *, layer: int) -> go.Figure:
    """joint [query, key]: rollout through layer `layer`."""
    labels = _labels(tokens) if len(tokens) <= 120 else None
    return heatmap(joint, x_labels=labels, y_labels=labels, zmin=0.0, colorscale=ATTENTION_SCALE,
                   colorbar_title="share", title=f"Rollout through layer {layer}, every query",
                   x_title="key (position: token)", y_title="query (position: token)",
                   hovertemplate="query %{y}<br>key %{x}<br>%{z:.3f}<extra></extra>", height=520)


def weights_beside_norms(pattern: np.ndarray, shares: np.ndarray, tokens: Sequence[str]) -> go.Figure:
    """pattern and shares [query, key] of one head side by side, on one colour scale."""
    labels = _labels(tokens) if len(tokens) <= 120 else list(range(len(tokens)))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("raw weights α", "norm-based ‖α·v·W_O‖, each row's share"),
                        horizontal_spacing=0.08)
    for col, z in ((1, pattern), (2, shares)):
        fig.add_trace(go.Heatmap(z=np.asarray(z, dtype=float), x=labels, y=labels, coloraxis="coloraxis",
                                 hovertemplate="query %{y}<br>key %{x}<br>%{z:.3f}<extra></extra>"), 1, col)
        fig.update_yaxes(autorange="reversed", row=1, col=col)
        fig.update_xaxes(title_text="key (position: token)", row=1, col=col)
    fig.update_yaxes(title_text="query (position: token)", row=1, col=1)
    fig.update_layout(coloraxis=dict(colorscale=ATTENTION_SCALE, cmin=0, cmax=1, colorbar=dict(title="share")))
    return apply_layout(fig, height=520)


def value_norm_bars(value_norms: np.ndarray, tokens: Sequence[str]) -> go.Figure:
    """value_norms [key]: ||v_j W_O^h||, what each key would add at weight 1."""
    fig = go.Figure(go.Bar(x=_labels(tokens), y=np.asarray(value_norms, dtype=float), marker_color=PALETTE[2],
                           hovertemplate="%{x}<br>‖v·W_O‖ = %{y:.3f}<extra></extra>"))
    return apply_layout(fig, title="Length of each token's value vector through the head's output projection",
                        x_title="key (position: token)", y_title="‖v·W_O‖ (residual-stream units)", height=320)


def patching_grid(values: np.ndarray, columns: Sequence[str], *, title: str, x_title: str,
                  colorbar_title: str = "share of the clean run") -> go.Figure:
    """values [layer, column]: each patched site's normalised metric (0 = the corrupted run, 1 = the clean run),
    diverging around 0, columns the heads or the positions' tokens."""
    values = np.asarray(values, dtype=float)
    bound = max(1.0, float(np.nanmax(np.abs(values)))) if np.isfinite(values).any() else 1.0
    fig = heatmap(values, x_labels=list(columns), y_labels=[f"L{layer}" for layer in range(values.shape[0])],
                  colorscale=DIVERGING_SCALE, zmin=-bound, zmax=bound, colorbar_title=colorbar_title, title=title,
                  x_title=x_title, y_title="layer (0 = nearest the input)",
                  hovertemplate="%{y} %{x}<br>%{z:+.3f}<extra></extra>",
                  height=max(300, 18 * values.shape[0] + 160))
    return label_margins(fig, x_labels=list(columns), x_angle=45 if len(columns) > 12 else 0)


def patching_against_attribution(real: np.ndarray, estimate: np.ndarray, labels: Sequence[str], *,
                                 pearson: float) -> go.Figure:
    """One point per site: real activation patching (x) against its attribution-patching estimate (y), with the
    line where they agree."""
    real, estimate = np.asarray(real, dtype=float).ravel(), np.asarray(estimate, dtype=float).ravel()
    lo, hi = float(np.nanmin([real.min(), estimate.min()])), float(np.nanmax([real.max(), estimate.max()]))
    fig = go.Figure(go.Scatter(x=real, y=estimate, mode="markers", text=list(labels), name="site",
                               marker=dict(color=PALETTE[0], size=7, opacity=0.7),
                               hovertemplate="%{text}<br>patched %{x:+.3f}<br>estimate %{y:+.3f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="estimate = patched",
                             line=dict(color="#868e96", dash="dot")))
    return apply_layout(fig, title=f"Attribution patching against real patching (Pearson r = {pearson:.3f})",
                        x_title="real patching (share of the clean run)",
                        y_title="attribution estimate (share of the clean run)", height=420)


def logit_parts(labels: Sequence[str], values: Sequence[float], *, total: float) -> go.Figure:
    """The parts of the logit difference that are not single heads (embeddings, every layer's MLP, all heads of a
    layer, biases) as bars, with the model's own difference as a line."""
    values = np.asarray(values, dtype=float)
    colors = [PALETTE[3] if v < 0 else PALETTE[0] for v in values]
    fig = go.Figure(go.Bar(x=list(labels), y=values, marker_color=colors,
                           hovertemplate="%{x}<br>%{y:+.3f}<extra></extra>", name="part"))
    fig.add_hline(y=total, line=dict(color=PALETTE[1], dash="dash"),
                  annotation_text=f"model's logit difference {total:+.3f}", annotation_position="top left")
    fig = apply_layout(fig, title="Direct logit attribution by layer: attention heads (summed) and MLP",
                       x_title="part of the residual stream", y_title="logit difference it writes (logits)",
                       height=420)
    return label_margins(fig, x_labels=list(labels), x_angle=45)


BARS_AT_MOST = 300  # bars a chart draws one by one; more are drawn as stepped lines


def bars_by_token(rows: dict[str, np.ndarray], tokens: Sequence[str], *, title: str, y_title: str) -> go.Figure:
    """Grouped bars, one group per key token: each named row's value for that token (rollout beside flow). Past
    BARS_AT_MOST bars, each row is one stepped line instead (flat over each token, the first and last over half a
    token, filled to zero when it is the only row): plotly draws a bar as an element of its own, and 1,800 of them
    took 0.2 s to draw, the line 0.07 s."""
    x = _labels(tokens[:len(next(iter(rows.values())))])
    if len(x) * len(rows) <= BARS_AT_MOST:
        traces = [go.Bar(x=x, y=np.asarray(row, dtype=float), name=name, marker_color=PALETTE[i % len(PALETTE)],
                         hovertemplate="%{x}<br>" + name + " %{y:.3f}<extra></extra>")
                  for i, (name, row) in enumerate(rows.items())]
    else:
        traces = [go.Scatter(x=x, y=np.asarray(row, dtype=float), name=name, mode="lines",
                             line=dict(shape="hvh", width=1, color=PALETTE[i % len(PALETTE)]),
                             fill="tozeroy" if len(rows) == 1 else None,
                             hovertemplate="%{x}<br>" + name + " %{y:.3f}<extra></extra>")
                  for i, (name, row) in enumerate(rows.items())]
    fig = go.Figure(traces)
    fig.update_layout(barmode="group")
    fig = apply_layout(fig, title=title, x_title="key (position: token)", y_title=y_title, height=400)
    return label_margins(fig, x_labels=x, x_angle=45 if len(x) > 12 else 0)


def score_parts(labels: Sequence[str], values: np.ndarray, *, title: str, x_title: str, top: int = 24,
                y_title: str = "part of the residual stream") -> go.Figure:
    """The `top` largest parts by |value| as horizontal bars, largest at the top (score units)."""
    values = np.asarray(values, dtype=float)
    order = np.argsort(-np.abs(values), kind="stable")[:top][::-1]
    fig = go.Figure(go.Bar(x=values[order], y=[labels[i] for i in order], orientation="h",
                           marker_color=[PALETTE[3] if values[i] < 0 else PALETTE[0] for i in order],
                           hovertemplate="%{y}<br>%{x:+.4f}<extra></extra>"))
    fig = apply_layout(fig, title=title, x_title=x_title, y_title=y_title, height=max(320, 22 * len(order) + 120))
    return label_margins(fig, y_labels=[labels[i] for i in order])
