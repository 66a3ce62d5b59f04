"""Toy-lab figures: the loss curve against chance, per-head scores over training, the final scores per head, and
the attention variants side by side (losses, sink metric, one head's map each)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.common import (
    ATTENTION_SCALE, PALETTE, apply_layout, grid_layout, heatmap, label_margins, legend_below, unique_labels,
)

SCORE_TITLES = {"previous_token": "previous-token score", "induction": "induction score", "sink": "sink score"}


def moving_average(values: Sequence[float], window: int) -> np.ndarray:
    """Mean of the last `window` values at each step (fewer at the start). [n] -> [n]."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return v
    c = np.concatenate([[0.0], np.cumsum(v)])
    i = np.arange(1, v.size + 1)
    lo = np.maximum(0, i - window)
    return (c[i] - c[lo]) / (i - lo)


def loss_curve(losses: Sequence[float], chance: float, *, total_steps: int | None = None,
               window: int = 20, chance_of: str = "letters") -> go.Figure:
    """Training loss per step (faint), its moving average, and the chance level as a dashed line.
    losses [steps], nats; chance = log(number of symbols the task draws its answers from: chance_of), nats."""
    y = np.asarray(losses, dtype=float)
    x = np.arange(1, y.size + 1)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name="loss per step", line=dict(color=PALETTE[0], width=1),
                             opacity=0.35))
    fig.add_trace(go.Scatter(x=x, y=moving_average(y, window), mode="lines", name=f"mean of last {window} steps",
                             line=dict(color=PALETTE[0], width=2.5)))
    _chance_line(fig, chance, total_steps or y.size, PALETTE[1], chance_of=chance_of)
    if total_steps:
        fig.update_xaxes(range=[0, total_steps])
    fig.update_yaxes(rangemode="tozero")
    apply_layout(fig, title="Loss on the answer tokens", x_title="training step",
                 y_title="cross-entropy (nats)", height=380)
    fig.update_layout(margin=dict(b=110), legend=dict(orientation="h", yanchor="top", y=-0.22, xanchor="left", x=0.0))
    return fig


def chance_symbols(task: str) -> str:
    """What chance guesses among on `task`, as the loss curves name it: the 256 bytes of the text task, else the
    task's letters."""
    return "bytes" if task == "text" else "letters"


def saved_loss_curve(saved: Mapping) -> go.Figure:
    """loss_curve of a saved run, as the Toy lab draws it: `saved` is its LAB_FILE (attnviz.lab.saved_history),
    with its per-step losses, its chance level and its config's steps and task."""
    cfg = saved["config"]
    return loss_curve(saved["losses"], saved["chance_loss"], total_steps=cfg["steps"],
                      chance_of=chance_symbols(cfg["task"]))


def _chance_line(fig: go.Figure, chance: float, last_step: int, color: str, suffix: str = "",
                 chance_of: str = "letters") -> None:
    """The chance level as a dashed line named in the legend: a label drawn on the plot sits where the loss
    curve, which spends its early steps at chance, runs over it."""
    fig.add_trace(go.Scatter(x=[0, max(int(last_step), 1)], y=[chance, chance], mode="lines",
                             name=f"chance: log({chance_of}) = {chance:.2f} nats{suffix}",
                             line=dict(color=color, dash="dash", width=1.5),
                             hovertemplate=f"chance: {chance:.3f} nats<extra></extra>"))


def score_curves(steps: Sequence[int], scores, *, statistic: str = "induction",
                 total_steps: int | None = None) -> go.Figure:
    """One line per head: a statistic over training. steps [checkpoint]; scores [checkpoint, layer, head]."""
    s = np.asarray(scores, dtype=float)
    fig = go.Figure()
    n_layers, n_heads = (s.shape[1], s.shape[2]) if s.ndim == 3 else (0, 0)
    for layer in range(n_layers):
        for head in range(n_heads):
            fig.add_trace(go.Scatter(
                x=np.asarray(steps), y=s[:, layer, head], mode="lines+markers", name=f"L{layer}H{head}",
                line=dict(color=PALETTE[head % len(PALETTE)], dash="solid" if layer % 2 else "dot"),
                marker=dict(size=4),
                hovertemplate=f"layer {layer} head {head}<br>step %{{x}}<br>score %{{y:.3f}}<extra></extra>"))
    if total_steps:
        fig.update_xaxes(range=[0, total_steps])
    fig.update_yaxes(range=[0, 1.02])
    title = SCORE_TITLES.get(statistic, statistic)
    apply_layout(fig, title=f"{title[0].upper() + title[1:]} of every head (Lx = layer, Hy = head)",
                 x_title="training step", y_title=f"{title} (attention weight, 0–1)", height=380)
    fig.update_layout(legend=dict(orientation="v", yanchor="top", y=1.0, xanchor="left", x=1.02))
    return fig


def best_heads_curve(steps: Sequence[int], losses: Sequence[float], best: dict[str, Sequence[float]],
                     chance: float, *, total_steps: int | None = None, chance_of: str = "letters") -> go.Figure:
    """The story in one chart: loss at each checkpoint (left axis, nats) against the best head's score for each
    statistic (right axis, 0-1). steps, losses [checkpoint]; best: statistic -> [checkpoint]."""
    x = np.asarray(steps)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=np.asarray(losses, dtype=float), mode="lines+markers", name="loss (left axis)",
                             line=dict(color=PALETTE[0], width=2.5), marker=dict(size=4)))
    _chance_line(fig, chance, total_steps or (int(x.max()) if x.size else 1), PALETTE[0], " (left axis)",
                 chance_of=chance_of)
    for i, (name, y) in enumerate(best.items()):
        fig.add_trace(go.Scatter(x=x, y=np.asarray(y, dtype=float), mode="lines+markers",
                                 name=f"best {SCORE_TITLES.get(name, name)} (right axis)", yaxis="y2",
                                 line=dict(color=PALETTE[(i + 1) % len(PALETTE)]), marker=dict(size=4)))
    apply_layout(fig, title="As the loss falls, heads specialise", x_title="training step",
                 y_title="loss (nats)", height=460)
    fig.update_layout(yaxis2=dict(title=dict(text="highest score over heads (0–1)"), overlaying="y", side="right",
                                  range=[0, 1.02], dtick=0.2, showgrid=False),
                      yaxis=dict(rangemode="tozero"), margin=dict(r=70, b=150),
                      legend=dict(orientation="h", yanchor="top", y=-0.26, xanchor="left", x=0.0))
    if total_steps:
        fig.update_xaxes(range=[0, total_steps])
    return fig


def final_scores_heatmap(scores, statistic: str) -> go.Figure:
    """A statistic for every head at the end of training. scores [layer, head]."""
    s = np.asarray(scores, dtype=float)
    title = SCORE_TITLES.get(statistic, statistic)
    return heatmap(s, x_labels=[f"H{h}" for h in range(s.shape[1])], y_labels=[f"L{l}" for l in range(s.shape[0])],
                   title=f"Final {title}", x_title="head", y_title="layer", zmin=0.0, zmax=1.0,
                   colorbar_title="score (0–1)", height=260,
                   hovertemplate="layer %{y} head %{x}<br>score %{z:.3f}<extra></extra>")


def target_pattern_heatmaps(tokens: Sequence[str], patterns) -> list[go.Figure]:
    """One heatmap per named target pattern [query, key], token labels on both axes."""
    # plotly slants the key labels of a crowded axis by up to 90 degrees
    return [label_margins(heatmap(p, x_labels=tokens, y_labels=tokens, title=f"A perfect {name} head",
                                  x_title="key token", y_title="query token", zmin=0.0, zmax=1.0,
                                  colorbar_title="weight", height=360,
                                  hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.2f}<extra></extra>"),
                          x_labels=tokens, y_labels=tokens, x_angle=90)
            for name, p in patterns.items()]


def variant_loss_curves(losses: dict[str, Sequence[float]], *, total_steps: int | None = None,
                        window: int = 20) -> go.Figure:
    """One line per attention variant: the moving average of its training loss. losses: variant -> [steps], nats."""
    fig = go.Figure()
    for i, (name, y) in enumerate(losses.items()):
        y = np.asarray(y, dtype=float)
        fig.add_trace(go.Scatter(x=np.arange(1, y.size + 1), y=moving_average(y, window), mode="lines", name=name,
                                 line=dict(color=PALETTE[i % len(PALETTE)], width=2)))
    if total_steps:
        fig.update_xaxes(range=[0, total_steps])
    fig.update_yaxes(rangemode="tozero")
    return legend_below(apply_layout(fig, title=f"Training loss of each variant (mean of the last {window} steps)",
                                      x_title="training step", y_title="cross-entropy (nats)", height=400),
                        y=-0.22, bottom=110)


def variant_sink_curves(steps: dict[str, Sequence[int]], rates: dict[str, Sequence[float]], *, eps: float,
                        threshold: float, total_steps: int | None = None) -> go.Figure:
    """One line per attention variant: Gu et al.'s Sink_0^eps at each checkpoint, in percent, with the threshold
    the benchmark waits for as a dashed line. steps, rates: variant -> [checkpoint]."""
    fig = go.Figure()
    for i, (name, y) in enumerate(rates.items()):
        fig.add_trace(go.Scatter(x=np.asarray(steps[name]), y=100 * np.asarray(y, dtype=float), mode="lines+markers",
                                 name=name, line=dict(color=PALETTE[i % len(PALETTE)]), marker=dict(size=4)))
    last = total_steps or max((max(s) for s in steps.values() if len(s)), default=1)
    fig.add_trace(go.Scatter(x=[0, last], y=[100 * threshold] * 2, mode="lines", name=f"{threshold:.0%}",
                             line=dict(color="#868e96", dash="dash", width=1)))
    fig.update_yaxes(range=[0, 100])
    if total_steps:
        fig.update_xaxes(range=[0, total_steps])
    return legend_below(apply_layout(fig, title=f"Sink metric over training (α₀ > {eps:g})", x_title="training step",
                                      y_title="Sink₀^ε (% of (text, layer, head) triples)", height=400),
                        y=-0.22, bottom=110)


def variant_maps(tokens: Sequence[str], maps: Mapping[str, np.ndarray], on_tokens: Mapping[str, float], *,
                 layer: int, head: int, cols: int = 2, panel_px: int = 300) -> go.Figure:
    """One head's attention map per variant, in a grid of `cols` columns on one 0-1 colour scale (one colour bar):
    key tokens along the bottom row, query tokens down the left column. maps: variant -> [query, key]; on_tokens:
    variant -> the mean share of a row on tokens, in the panel's title. Built in one go from grid_layout."""
    names = list(maps)
    labels = unique_labels(tokens)
    rows = -(-len(names) // cols)
    layout = grid_layout(rows, cols, [f"{n.replace('_', ' ')}: {on_tokens[n]:.0%} on tokens" for n in names],
                         horizontal_spacing=0.04, vertical_spacing=0.1)
    every_token = dict(dtick=1) if len(labels) <= 40 else {}  # beyond that plotly's own spacing keeps them legible
    traces = []
    for i, name in enumerate(names):
        suffix = "" if i == 0 else str(i + 1)
        bottom, left = i >= len(names) - cols, i % cols == 0
        traces.append(go.Heatmap(z=np.asarray(maps[name], dtype=float), x=labels, y=labels, coloraxis="coloraxis",
                                 xaxis=f"x{suffix}", yaxis=f"y{suffix}",
                                 hovertemplate=f"{name.replace('_', ' ')}<br>query %{{y}}<br>key %{{x}}<br>"
                                               "weight %{z:.3f}<extra></extra>"))
        layout[f"xaxis{suffix}"].update(showticklabels=bottom, tickangle=-90, **every_token,
                                        **({"title": dict(text="key token")} if bottom else {}))
        layout[f"yaxis{suffix}"].update(autorange="reversed", showticklabels=left, **every_token,
                                        **({"title": dict(text="query token")} if left else {}))
    layout["coloraxis"] = dict(colorscale=ATTENTION_SCALE, cmin=0.0, cmax=1.0,
                               colorbar=dict(title=dict(text="attention weight")))
    fig = apply_layout(go.Figure(data=traces, layout=layout), title=f"Layer {layer}, head {head} of each variant",
                       height=rows * panel_px + 200)
    return label_margins(fig.update_layout(margin=dict(t=80)), x_labels=labels, y_labels=labels, x_angle=90)
