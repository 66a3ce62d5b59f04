"""Figures of the variants page: head sharing, KV-cache memory, FLOPs against N, toy maps, parameter shares."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.common import ATTENTION_SCALE, PALETTE, apply_layout, grid_layout, legend_below, line_chart

GIB = 2 ** 30


PANEL_PX = 220  # the narrowest a panel gets: three panels side by side in a wide page on a 1280 px screen
LABEL_PX_PER_CHAR, LABEL_GAP_PX = 6, 8  # an 11 px label's width per character, and the space kept between labels


def label_step(count: int, prefix: str = "Q") -> int:
    """Label every k-th of `count` heads in a row: k = 1 while all labels (prefix + index) fit side by side in a
    PANEL_PX-wide panel, else the smallest power of two that makes them fit (powers of two line up with the groups
    of the usual head counts: 32 query heads are labelled every 4th, 64 every 8th, 128 every 32nd)."""
    width = LABEL_PX_PER_CHAR * len(f"{prefix}{max(count - 1, 0)}") + LABEL_GAP_PX
    step = 1
    while -(-count // step) * width > PANEL_PX:
        step *= 2
    return step


def _marker_px(count: int, largest: int) -> float:
    """A marker no wider than the gap between neighbours in a PANEL_PX-wide panel, between 3 and `largest` px."""
    return float(np.clip(0.8 * PANEL_PX / max(count, 1), 3, largest))


def head_sharing_figure(n_heads: int, layouts: Mapping[str, Sequence[int]]) -> go.Figure:
    """One panel per variant: query heads on top, KV heads below, a line from each query head to the KV head it
    reads. layouts: variant name -> kv_head_of list (length n_heads). Colours mark groups sharing a KV head.

    Readable from 1 to 128 heads: when a row's labels would not fit side by side, only every label_step-th head
    is labelled (the hover names every head), and markers shrink so that neighbours do not overlap."""
    names = list(layouts)
    # each panel's title on two lines: on one ("GQA (4 KV): 8 query, 4 KV heads") neighbouring titles ran into each
    # other once a narrow window made the panels narrower than PANEL_PX
    layout = grid_layout(1, len(names), [
        f"{name}<br>{n_heads} query, {max(layouts[name]) + 1} KV head{'s' if max(layouts[name]) else ''}"
        for name in names], horizontal_spacing=0.04)
    for note in layout["annotations"]:
        note["font"] = dict(size=13)
    q_step = label_step(n_heads, "Q")
    traces = []
    for i, name in enumerate(names):
        on = {"xaxis": f"x{'' if i == 0 else i + 1}", "yaxis": f"y{'' if i == 0 else i + 1}"}
        kv_of = list(layouts[name])
        n_kv = max(kv_of) + 1
        kv_step = label_step(n_kv, "KV")
        kv_x = [(g + 0.5) * n_heads / n_kv - 0.5 for g in range(n_kv)]  # each KV head centred under its group
        # the lines of one colour are one trace, broken by None: 128 heads draw 8 traces, not 128
        for colour in range(min(n_kv, len(PALETTE))):
            x, y = [], []
            for h, g in enumerate(kv_of):
                if g % len(PALETTE) == colour:
                    x += [h, kv_x[g], None]
                    y += [1, 0, None]
            traces.append(go.Scatter(x=x, y=y, mode="lines", showlegend=False, hoverinfo="skip",
                                     line=dict(color=PALETTE[colour], width=2 if n_heads <= 32 else 1), **on))
        traces.append(go.Scatter(
            x=list(range(n_heads)), y=[1] * n_heads, mode="markers+text", showlegend=False, cliponaxis=False,
            text=[f"Q{h}" if h % q_step == 0 else "" for h in range(n_heads)], textposition="top center",
            textfont=dict(size=11),
            marker=dict(symbol="square", size=_marker_px(n_heads, 16),
                        color=[PALETTE[g % len(PALETTE)] for g in kv_of]),
            customdata=kv_of, hovertemplate="query head %{x} reads KV head %{customdata}<extra></extra>", **on))
        traces.append(go.Scatter(
            x=kv_x, y=[0] * n_kv, mode="markers+text", showlegend=False, cliponaxis=False,
            text=[f"KV{g}" if g % kv_step == 0 else "" for g in range(n_kv)], textposition="bottom center",
            textfont=dict(size=11),
            marker=dict(symbol="diamond", size=_marker_px(n_kv, 18),
                        color=[PALETTE[g % len(PALETTE)] for g in range(n_kv)]),
            customdata=[[g, kv_of.count(g)] for g in range(n_kv)],
            hovertemplate="KV head %{customdata[0]}: shared by %{customdata[1]} query heads<extra></extra>", **on))
        pad = max(0.8, 0.04 * n_heads)  # room for the first and last labels, half of each outside the heads
        layout[on["xaxis"].replace("x", "xaxis")].update(
            title=dict(text="query head index"), range=[-pad, n_heads - 1 + pad], showgrid=False, zeroline=False,
            tickvals=list(range(0, n_heads, q_step)))
        layout[on["yaxis"].replace("y", "yaxis")].update(
            range=[-0.45, 1.45], tickvals=[0, 1], ticktext=["K/V heads", "query heads"], showticklabels=i == 0,
            showgrid=False, zeroline=False)
    fig = apply_layout(go.Figure(data=traces, layout=layout), title="Which key/value head each query head reads",
                       height=320)
    return fig.update_layout(margin=dict(t=80))  # the figure's title and the panels' two-line titles


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
    return legend_below(fig, y=-0.2, bottom=110)


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
    return legend_below(fig, y=-0.2, bottom=110)


def variant_maps_figure(patterns: Mapping[str, np.ndarray], heads: Sequence[int], kv_heads: Mapping[str, Sequence[int]]
                        ) -> go.Figure:
    """A grid of attention maps: one row per variant, one column per chosen head. patterns: name -> [head, n, n].
    Built in one go from grid_layout: per-panel plotly updates of up to 3 x 8 maps took most of its build time."""
    names = list(patterns)
    titles = [f"{name} · head {h} (KV {kv_heads[name][h]})" for name in names for h in heads]
    layout = grid_layout(len(names), len(heads), titles, horizontal_spacing=0.02, vertical_spacing=0.08)
    for note in layout["annotations"]:
        note["font"] = dict(size=11)
    traces = []
    for r, name in enumerate(names):
        for c, h in enumerate(heads):
            i = r * len(heads) + c
            suffix = "" if i == 0 else str(i + 1)
            traces.append(go.Heatmap(z=patterns[name][h], coloraxis="coloraxis", xaxis=f"x{suffix}",
                                     yaxis=f"y{suffix}",
                                     hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.3f}<extra></extra>"))
            layout[f"yaxis{suffix}"].update(autorange="reversed", showticklabels=c == 0,
                                            **({"title": dict(text="query position")} if c == 0 else {}))
            layout[f"xaxis{suffix}"].update(showticklabels=r == len(names) - 1,
                                            **({"title": dict(text="key position")} if r == len(names) - 1 else {}))
    layout["coloraxis"] = dict(colorscale=ATTENTION_SCALE, cmin=0, cmax=1, colorbar=dict(title=dict(text="weight")))
    return apply_layout(go.Figure(data=traces, layout=layout), title="The same input through MHA, GQA and MQA",
                        height=190 * len(names) + 90)


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
                             customdata=raw,
                             hovertemplate="%{x}: %{y:.1f}% (%{customdata:,})<extra>" + part + "</extra>"))
    fig.update_layout(barmode="stack")
    return apply_layout(fig, title="Where the parameters are", x_title="model", y_title="share of parameters (%)",
                        height=400)
