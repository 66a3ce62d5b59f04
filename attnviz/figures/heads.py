"""Figures for the Heads page: the grid of all heads, one head in detail, where a token looks, comparisons.

Big maps go to the browser as one palette PNG (one byte per cell before compression) inside a go.Image, not as
a list of floats: plotly's default JSON for a 1024 x 1024 heatmap is ~20 bytes per cell, the PNG is under one.
Small maps (up to DETAIL_MAX_TOKENS tokens) stay go.Heatmap so the hover can name the query and key tokens.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import plotly.colors
import plotly.graph_objects as go
from PIL import Image

from attnviz.figures.common import ATTENTION_SCALE, DIVERGING_SCALE, apply_layout, heatmap

DETAIL_MAX_TOKENS = 160  # above this a head is drawn as an image; the hover then shows indices only
GRID_TILE = 48  # pixels per head in the grid of all heads
HEATMAP_MAX_CELLS = 60_000  # token-by-head maps above this many cells become images too


def palette_png(values: np.ndarray, *, colorscale: str = ATTENTION_SCALE, vmin: float = 0.0,
                vmax: float = 1.0) -> str:
    """values [rows, cols] -> a data: URI of a palette PNG (256 colours of colorscale over [vmin, vmax]).

    NaN cells are drawn white (palette entry 255 is reserved for them)."""
    v = np.asarray(values, dtype=np.float64)
    scaled = np.clip((v - vmin) / max(vmax - vmin, 1e-12), 0.0, 1.0)
    index = np.where(np.isnan(v), 255, np.rint(np.nan_to_num(scaled) * 254)).astype(np.uint8)
    image = Image.fromarray(index, mode="P")
    image.putpalette(_palette(colorscale))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _palette(colorscale: str) -> list[int]:
    colors = plotly.colors.sample_colorscale(colorscale, list(np.linspace(0.0, 1.0, 255)), colortype="rgb")
    rgb = [int(round(float(c))) for color in colors for c in color[4:-1].split(",")]
    return rgb + [255, 255, 255]


def image_figure(values: np.ndarray, *, title: str, x_title: str, y_title: str, colorscale: str = ATTENTION_SCALE,
                 vmin: float = 0.0, vmax: float = 1.0, colorbar_title: str = "weight",
                 x_ticks: tuple[list, list] | None = None, y_ticks: tuple[list, list] | None = None,
                 hovertemplate: str = "row %{y}<br>column %{x}<extra></extra>", height: int | None = None) -> go.Figure:
    """A matrix as one palette PNG, with a colour bar (from an invisible marker) and optional tick labels."""
    fig = go.Figure(go.Image(source=palette_png(values, colorscale=colorscale, vmin=vmin, vmax=vmax),
                             x0=0, y0=0, dx=1, dy=1, hovertemplate=hovertemplate))
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", showlegend=False, hoverinfo="skip",
                             marker=dict(colorscale=colorscale, cmin=vmin, cmax=vmax, color=[vmin], showscale=True,
                                         colorbar=dict(title=dict(text=colorbar_title)))))
    apply_layout(fig, title=title, x_title=x_title, y_title=y_title, height=height)
    if x_ticks:
        fig.update_xaxes(tickmode="array", tickvals=x_ticks[0], ticktext=x_ticks[1])
    if y_ticks:
        fig.update_yaxes(tickmode="array", tickvals=y_ticks[0], ticktext=y_ticks[1])
    fig.update_xaxes(showgrid=False, zeroline=False)
    fig.update_yaxes(showgrid=False, zeroline=False, autorange="reversed")
    return fig


def max_pool(p: np.ndarray, size: int) -> np.ndarray:
    """p [..., n, n] -> [..., m, m] with m = min(n, size): the largest weight of each block, so thin stripes
    (the diagonal, a sink column) survive downsampling instead of being averaged away."""
    n = p.shape[-1]
    if n <= size:
        return p
    edges = np.linspace(0, n, size + 1).round().astype(int)
    rows = np.maximum.reduceat(p, edges[:-1], axis=-2)
    return np.maximum.reduceat(rows, edges[:-1], axis=-1)


def head_grid(pattern: np.ndarray, layers: Sequence[int], *, gamma: float = 0.5, tile: int = GRID_TILE,
              layer_map: Callable[[np.ndarray], np.ndarray] | None = None) -> go.Figure:
    """All heads at a glance: pattern [layer, head, query, key] as a layer x head mosaic of small maps.

    Each map is max-pooled to at most `tile` pixels and coloured by weight**gamma (gamma 0.5 lifts the small weights
    so previous-token stripes show next to bright sinks). layer_map, if given, maps each layer [head, query, key]
    before it is pooled (hiding the sink, say), one layer at a time: no changed copy of the whole pattern is made."""
    n_layers, n_heads, n, _ = pattern.shape
    m = min(n, tile)
    gap = 2
    mosaic = np.full((n_layers * (m + gap) - gap, n_heads * (m + gap) - gap), np.nan)
    for li in range(n_layers):
        maps = pattern[li] if layer_map is None else layer_map(pattern[li])
        pooled = max_pool(np.asarray(maps, dtype=np.float32), m) ** gamma  # [head, m, m]
        for h in range(n_heads):
            mosaic[li * (m + gap): li * (m + gap) + m, h * (m + gap): h * (m + gap) + m] = pooled[h]
    centers = lambda count: [i * (m + gap) + (m - 1) / 2 for i in range(count)]  # noqa: E731
    step = max(1, n_layers // 16)
    fig = image_figure(
        mosaic, title=f"All heads: {n_layers} layers x {n_heads} heads, {n} tokens (each map: query down, key across)",
        x_title="head", y_title="layer", colorbar_title=f"weight^{gamma:g}",
        x_ticks=(centers(n_heads), [str(h) for h in range(n_heads)]),
        y_ticks=(centers(n_layers)[::step], [str(layer) for layer in list(layers)[::step]]),
        hovertemplate="pixel %{x}, %{y}<extra></extra>",
        height=max(320, min(60 + n_layers * 70, 1400)))
    return fig


def head_detail(p: np.ndarray, tokens: Sequence[str], *, title: str, gamma: float = 1.0) -> go.Figure:
    """One head p [query, key] with token labels; a heatmap with token hover up to DETAIL_MAX_TOKENS, else an image."""
    n = p.shape[-1]
    z = np.asarray(p, dtype=np.float64) ** gamma
    colorbar = "weight" if gamma == 1 else f"weight^{gamma:g}"
    if n <= DETAIL_MAX_TOKENS:
        labels = [f"{i}: {t}" for i, t in enumerate(tokens)]
        fig = heatmap(z, x_labels=labels, y_labels=labels, title=title, x_title="key token (position: token)",
                      y_title="query token (position: token)", zmin=0.0, zmax=1.0, colorbar_title=colorbar,
                      hovertemplate="query %{y}<br>key %{x}<br>weight %{customdata:.4f}<extra></extra>",
                      height=min(900, 260 + 14 * n))
        fig.data[0].customdata = np.asarray(p, dtype=np.float64)
        fig.update_xaxes(tickangle=-60)
        return fig
    ticks = _sparse_ticks(tokens)
    return image_figure(z, title=title, x_title="key position (token)", y_title="query position (token)",
                        colorbar_title=colorbar, x_ticks=ticks, y_ticks=ticks,
                        hovertemplate="query %{y}<br>key %{x}<extra></extra>", height=800)


def _sparse_ticks(tokens: Sequence[str], count: int = 24) -> tuple[list, list]:
    step = max(1, len(tokens) // count)
    positions = list(range(0, len(tokens), step))
    return positions, [f"{i}: {tokens[i]}" for i in positions]


def token_looks(weights: np.ndarray, tokens: Sequence[str], row_labels: Sequence[str], query: int, *,
                gamma: float = 1.0) -> go.Figure:
    """weights [row, key]: each head's weights from one query over the keys (rows = heads, "L3 H2")."""
    n_keys = weights.shape[-1]
    z = np.asarray(weights, dtype=np.float64) ** gamma
    title = f"Where token {query} ({tokens[query]}) looks, head by head"
    colorbar = "weight" if gamma == 1 else f"weight^{gamma:g}"
    height = min(1400, max(340, 200 + 22 * len(row_labels)))
    if z.size <= HEATMAP_MAX_CELLS and n_keys <= 400:
        fig = heatmap(z, x_labels=[f"{i}: {t}" for i, t in enumerate(tokens[:n_keys])], y_labels=list(row_labels),
                      title=title, x_title="key token (position: token)", y_title="head (layer, head)",
                      zmin=0.0, zmax=1.0, colorbar_title=colorbar,
                      hovertemplate="%{y}<br>key %{x}<br>weight^γ %{z:.4f}<extra></extra>", height=height)
        fig.update_xaxes(tickangle=-60)
        return fig
    step = max(1, len(row_labels) // 30)
    return image_figure(z, title=title, x_title="key position (token)", y_title="head (layer, head)",
                        colorbar_title=colorbar, x_ticks=_sparse_ticks(list(tokens[:n_keys])),
                        y_ticks=(list(range(0, len(row_labels), step)), list(row_labels)[::step]),
                        hovertemplate="row %{y}<br>key %{x}<extra></extra>", height=height)


def difference(a: np.ndarray, b: np.ndarray, tokens: Sequence[str], *, title: str) -> go.Figure:
    """a - b for two maps of the same shape [query, key], on a diverging scale symmetric about 0."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    bound = float(max(np.abs(d).max(), 1e-6))
    n = d.shape[-1]
    if n <= DETAIL_MAX_TOKENS:
        labels = [f"{i}: {t}" for i, t in enumerate(tokens)]
        fig = heatmap(d, x_labels=labels, y_labels=labels, title=title, x_title="key token (position: token)",
                      y_title="query token (position: token)", colorscale=DIVERGING_SCALE, zmin=-bound, zmax=bound,
                      colorbar_title="weight A − B",
                      hovertemplate="query %{y}<br>key %{x}<br>A − B %{z:.4f}<extra></extra>",
                      height=min(900, 260 + 14 * n))
        fig.update_xaxes(tickangle=-60)
        return fig
    ticks = _sparse_ticks(tokens)
    return image_figure(d, title=title, x_title="key position (token)", y_title="query position (token)",
                        colorscale=DIVERGING_SCALE, vmin=-bound, vmax=bound, colorbar_title="weight A − B",
                        x_ticks=ticks, y_ticks=ticks, height=800)


def stat_grid(stats: pd.DataFrame, column: str, *, title: str, colorbar_title: str) -> go.Figure:
    """One statistic as a layer x head heatmap, so the heads of a role stand out at a glance."""
    table = stats.pivot(index="layer", columns="head", values=column)
    return heatmap(table.to_numpy(), x_labels=[str(h) for h in table.columns],
                   y_labels=[str(layer) for layer in table.index], title=title, x_title="head", y_title="layer",
                   colorbar_title=colorbar_title,
                   hovertemplate="layer %{y}, head %{x}<br>" + column + " %{z:.3f}<extra></extra>",
                   height=max(300, min(60 + 22 * len(table.index), 900)))
