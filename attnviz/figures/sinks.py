"""Figures for the attention-sinks page: sink scores per head, sink heads per layer, the keys that soak up attention,
one head with or without its sink, and the loss curves of the StreamingLLM eviction experiment."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.common import PALETTE, apply_layout, heatmap, label_margins, line_chart

MAX_LABELLED_TOKENS = 120  # above this a map's axes show positions, not token strings


def sink_score_grid(alpha0, layers: Sequence[int], *, threshold: float) -> go.Figure:
    """alpha0 [layer, head]: each head's sink score on token 0, one cell per head, the value written in the cell."""
    alpha0 = np.asarray(alpha0, dtype=float)
    fig = heatmap(alpha0, x_labels=[f"head {h}" for h in range(alpha0.shape[1])],
                  y_labels=[f"layer {i}" for i in layers], zmin=0.0, zmax=1.0,
                  title=f"Sink score α₀ of every head (a sink head has α₀ > {threshold:g})",
                  x_title="head (query head index)", y_title="layer (0 = nearest the input)",
                  colorbar_title="α₀ (share of attention)",
                  hovertemplate="%{y}, %{x}<br>α₀ = %{z:.3f}<extra></extra>",
                  height=max(320, 22 * alpha0.shape[0] + 120))
    fig.update_traces(text=np.round(alpha0, 2), texttemplate="%{text:.2f}", textfont=dict(size=9))
    return label_margins(fig, y_labels=[f"layer {i}" for i in layers])


def sink_share_bars(share, layers: Sequence[int], *, threshold: float) -> go.Figure:
    """share [layer]: the fraction of each layer's heads that are sink heads, as percentages."""
    fig = go.Figure(go.Bar(x=list(layers), y=100 * np.asarray(share, dtype=float), marker_color=PALETTE[0],
                           hovertemplate="layer %{x}<br>%{y:.0f}% of heads<extra></extra>"))
    fig.update_yaxes(range=[0, 100])
    return apply_layout(fig, title=f"Share of sink heads per layer (α₀ > {threshold:g})",
                        x_title="layer (0 = nearest the input)", y_title="sink heads (% of the layer's heads)",
                        height=320)


UNJUDGED_GREY = "#adb5bd"


def key_score_bars(mean_alpha, tokens: Sequence[str], *, highlight: Sequence[int] = (),
                   unjudged: Sequence[int] = ()) -> go.Figure:
    """mean_alpha [key]: alpha_k averaged over every captured head, for every key position. Three colours, each a
    legend entry: highlighted keys (the sinks) orange, unjudged keys (seen by too few queries) grey, the rest blue."""
    mean_alpha = np.asarray(mean_alpha, dtype=float)
    labels = np.array([f"{k}: {t}" for k, t in enumerate(tokens)], dtype=object)
    sink, grey = set(int(k) for k in highlight), set(int(k) for k in unjudged)
    groups = [("sink key", PALETTE[1], sorted(sink)),
              ("not a sink", PALETTE[0], [k for k in range(len(mean_alpha)) if k not in sink | grey]),
              ("seen by too few queries to judge", UNJUDGED_GREY, sorted(grey - sink))]
    fig = go.Figure()
    for name, color, keys in groups:
        if keys:
            # width: plotly sizes a trace's bars by its closest pair of keys, far too wide for a sparse group
            fig.add_trace(go.Bar(x=keys, y=mean_alpha[keys], name=name, marker_color=color, width=0.8,
                                 customdata=labels[keys],
                                 hovertemplate="key %{customdata}<br>mean α = %{y:.3f}<extra>" + name + "</extra>"))
    fig.update_layout(barmode="overlay", showlegend=True)
    fig.update_xaxes(range=[-0.6, len(mean_alpha) - 0.4])
    return apply_layout(fig, title="Mean attention each key receives (α_k averaged over every head)",
                        x_title="key position (token index)", y_title="mean α_k (share of attention)", height=320)


def head_map(pattern, tokens: Sequence[str], *, title: str) -> go.Figure:
    """pattern [query, key] of one head; token labels on the axes when the text is short. NaN rows (a row left with
    too little weight once the sink is hidden: attnviz.views.sink_hidden) are drawn blank."""
    pattern = np.asarray(pattern, dtype=float)
    top = float(np.nanmax(pattern)) if np.isfinite(pattern).any() else 0.0
    labelled = pattern.shape[0] <= MAX_LABELLED_TOKENS
    fig = heatmap(pattern, x_labels=list(tokens) if labelled else None, y_labels=list(tokens) if labelled else None,
                  zmin=0.0, zmax=max(top, 1e-9), title=title,
                  x_title="key (token attended to)", y_title="query (token attending)",
                  colorbar_title="weight (share of the row)",
                  hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.3f}<extra></extra>",
                  height=max(380, min(700, 6 * pattern.shape[0] + 150)))
    # plotly slants the key labels of a crowded axis by up to 90 degrees
    return label_margins(fig, x_labels=list(tokens), y_labels=list(tokens), x_angle=90) if labelled else fig


def loss_curves(positions, losses: Mapping[str, Sequence[float]], *, window: int, smoothing: int) -> go.Figure:
    """Per-token loss (already smoothed) of each setting against the position of the predicted token, with the
    first prediction made without token 0 in the window (position window + 1) marked."""
    fig = line_chart(positions, losses, title="Next-token loss along the text",
                     x_title="position of the predicted token (tokens)",
                     y_title=f"loss (nats per token, mean of the last {smoothing})" if smoothing > 1
                     else "loss (nats per token)", height=420)
    fig.add_vline(x=window + 1, line=dict(color="#868e96", dash="dot"),
                  annotation_text="from here the window has lost token 0", annotation_position="top right")
    return fig



def sink_rate_bars(rate_by_layer, layers: Sequence[int], *, eps: float, whole: float, n_texts: int,
                   model: str | None = None, kinds: Sequence[str] | None = None) -> go.Figure:
    """rate_by_layer [layer]: Gu et al.'s Sink_0^eps of each layer (share of its (text, head) pairs with
    alpha_0 > eps), as percentages, with the whole model's value as a dashed line. kinds: each layer's "local" or
    "global" where the model has both, one colour each."""
    rates = 100 * np.asarray(rate_by_layer, dtype=float)
    groups = dict.fromkeys(kinds) if kinds else {None: None}
    fig = go.Figure()
    for i, kind in enumerate(groups):
        keep = [j for j in range(len(rates)) if kinds is None or kinds[j] == kind]
        fig.add_trace(go.Bar(x=[layers[j] for j in keep], y=rates[keep], marker_color=PALETTE[2 * i],
                             name=f"{kind} layers" if kind else "per layer",
                             hovertemplate="layer %{x}<br>Sink = %{y:.1f}%<extra></extra>"))
    fig.add_trace(go.Scatter(x=[min(layers) - 0.5, max(layers) + 0.5], y=[100 * whole] * 2, mode="lines",
                             name=f"whole model: {100 * whole:.1f}%", line=dict(color=PALETTE[1], dash="dash")))
    fig.update_yaxes(range=[0, 100])
    return apply_layout(fig, title=(f"{model}: s" if model else "S") + f"ink metric per layer over {n_texts} texts "
                        f"(α₀ > {eps:g})", x_title="layer (0 = nearest the input)",
                        y_title="Sink₀^ε (% of the layer's (text, head) pairs)", height=340)


def sink_rate_curve(eps_values, rates, *, eps: float, model: str | None = None) -> go.Figure:
    """Sink_0^eps of the whole model against the threshold eps, the chosen eps marked."""
    fig = line_chart(np.asarray(eps_values), {"whole model": 100 * np.asarray(rates, dtype=float)},
                     title=(f"{model}: h" if model else "H") + "ow the sink metric depends on the threshold ε",
                     x_title="threshold ε (share of attention)",
                     y_title="Sink₀^ε (% of (text, layer, head) triples)", height=340)
    fig.add_vline(x=eps, line=dict(color="#868e96", dash="dot"))
    fig.update_yaxes(range=[0, 100])
    return fig


def massive_values(peaks, medians) -> go.Figure:
    """peaks [layer]: the largest |hidden-state value| after each layer; medians [layer]: each layer's median
    |value|. Log scale: massive activations sit three or four orders of magnitude above the median."""
    layers = np.arange(len(peaks))
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=layers, y=np.asarray(peaks, dtype=float), mode="lines+markers",
                             name="largest |value|", line=dict(color=PALETTE[1])))
    fig.add_trace(go.Scatter(x=layers, y=np.asarray(medians, dtype=float), mode="lines+markers",
                             name="median |value|", line=dict(color=PALETTE[0])))
    fig.update_yaxes(type="log")
    return apply_layout(fig, title="Largest and median hidden-state magnitude after each layer",
                        x_title="layer (0 = nearest the input)", y_title="|hidden-state value| (log scale)",
                        height=360)


def sink_mass_change(mass, edited_mass, *, label: str) -> go.Figure:
    """mass, edited_mass [layer]: each layer's mean sink mass (share of attention on token 0), before and after
    the intervention, as grouped bars in percent."""
    layers = np.arange(len(mass))
    fig = go.Figure([go.Bar(x=layers, y=100 * np.asarray(mass, dtype=float), name="as the model runs",
                            marker_color=PALETTE[0]),
                     go.Bar(x=layers, y=100 * np.asarray(edited_mass, dtype=float), name=label,
                            marker_color=PALETTE[1])])
    fig.update_layout(barmode="group")
    fig.update_yaxes(range=[0, 100])
    return apply_layout(fig, title="Sink mass per layer, with and without the massive activations",
                        x_title="layer (0 = nearest the input)",
                        y_title="sink mass (% of attention on token 0)", height=360)
