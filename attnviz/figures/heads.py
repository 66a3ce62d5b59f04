"""Figures for the Heads page: the grid of all heads, one head in detail, where a token looks, comparisons.

Big maps go to the browser as one palette PNG (attnviz.figures.raster) inside a go.Image, not as
a list of floats: plotly's default JSON for a 1024 x 1024 heatmap is ~20 bytes per cell, the PNG is under one.
Small maps (up to DETAIL_MAX_TOKENS tokens) stay go.Heatmap so the hover can name the query and key tokens.

Grey (MASKED_GREY) marks cells that carry no weight to show: keys a causal query cannot see, and, with the sink
hidden, query rows that had almost nothing left off the sink (under MIN_REMAINING), whose rescaled rest would
otherwise be drawn at full brightness.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attnviz.pooling import MIN_REMAINING, block_reduce, pool_edges
from attnviz.figures.common import ATTENTION_SCALE, DIVERGING_SCALE, apply_layout, heatmap, label_margins, line_chart
from attnviz.figures.experiments import bars_by_token
from attnviz.figures.raster import MASKED_GREY, palette_png

DETAIL_MAX_TOKENS = 160  # above this a head is drawn as an image; the hover then shows indices only
GRID_TILE = 48  # pixels per head in the grid of all heads
HEATMAP_MAX_CELLS = 60_000  # token-by-head maps above this many cells become images too
BOOST_FROM_TOKENS = 256  # from this many tokens the page turns weight^0.5 on: most weights are ~1/n, near black


def image_figure(values: np.ndarray, *, title: str, x_title: str, y_title: str, colorscale: str = ATTENTION_SCALE,
                 vmin: float = 0.0, vmax: float = 1.0, colorbar_title: str = "weight",
                 x_ticks: tuple[list, list] | None = None, y_ticks: tuple[list, list] | None = None,
                 hovertemplate: str = "row %{y}<br>column %{x}<extra></extra>", height: int | None = None,
                 masked: np.ndarray | None = None) -> go.Figure:
    """A matrix as one palette PNG, with a colour bar (from an invisible marker) and optional tick labels.
    NaN cells are white, `masked` cells grey (palette_png)."""
    fig = go.Figure(go.Image(source=palette_png(values, colorscale=colorscale, vmin=vmin, vmax=vmax, masked=masked),
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
    (the diagonal, a sink column) survive downsampling instead of being averaged away. NaN cells (blank rows) are
    skipped: a block is NaN only when all its cells are."""
    n = p.shape[-1]
    if n <= size:
        return p
    edges = pool_edges(n, size)[:-1]  # keys first: along the contiguous axis, 3x faster than rows first
    return block_reduce(np.fmax, block_reduce(np.fmax, p, edges, axis=-1), edges, axis=-2)


def max_abs_pool(d: np.ndarray, size: int) -> np.ndarray:
    """d [n, n] (a signed difference) -> [m, m], m = min(n, size): in each block of pool_edges the entry of largest
    magnitude, with its sign, so a one-token stripe of either sign survives downsampling. NaN cells are skipped; a
    block is NaN only when all its cells are."""
    n = d.shape[-1]
    if n <= size:
        return d
    edges = pool_edges(n, size)[:-1]
    high = block_reduce(np.fmax, block_reduce(np.fmax, d, edges, axis=-1), edges, axis=-2)
    low = block_reduce(np.fmin, block_reduce(np.fmin, d, edges, axis=-1), edges, axis=-2)
    return np.where(np.nan_to_num(-low) > np.nan_to_num(high), low, high)


def head_grid(pattern: np.ndarray, layers: Sequence[int], *, gamma: float = 0.5, tile: int = GRID_TILE,
              layer_map: Callable[[np.ndarray], np.ndarray] | None = None, causal: bool = False,
              n_tokens: int | None = None) -> go.Figure:
    """All heads at a glance: pattern [layer, head, query, key] as a layer x head mosaic of small maps.

    Each map is max-pooled to at most `tile` pixels and coloured by weight**gamma (gamma 0.5 lifts the small weights
    so previous-token stripes show next to bright sinks). layer_map, if given, maps each layer [head, query, key]
    before it is pooled (hiding the sink, say), one layer at a time: no changed copy of the whole pattern is made;
    the rows it sets to NaN are grey. causal: pooled blocks wholly above the diagonal (every key after every query
    of the block: block column > block row, as rows and keys share the block edges) are grey, not black.
    n_tokens: the text's length when `pattern` is already pooled (attnviz.views.pooled_heads), for the title."""
    n_layers, n_heads, n, _ = pattern.shape
    m = min(n, tile)
    gap = 2
    mosaic = np.full((n_layers * (m + gap) - gap, n_heads * (m + gap) - gap), np.nan)
    masked = np.zeros(mosaic.shape, dtype=bool)
    above = np.triu(np.ones((m, m), dtype=bool), 1) if causal else np.zeros((m, m), dtype=bool)
    for li in range(n_layers):
        maps = pattern[li] if layer_map is None else layer_map(pattern[li])
        pooled = max_pool(np.asarray(maps, dtype=np.float32), m) ** gamma  # [head, m, m]
        for h in range(n_heads):
            cells = (slice(li * (m + gap), li * (m + gap) + m), slice(h * (m + gap), h * (m + gap) + m))
            mosaic[cells] = pooled[h]
            masked[cells] = np.isnan(pooled[h]) | above
    centers = lambda count: [i * (m + gap) + (m - 1) / 2 for i in range(count)]  # noqa: E731
    step = max(1, n_layers // 16)
    fig = image_figure(
        mosaic, title=f"All heads: {n_layers} layers x {n_heads} heads, {n_tokens or n:,} tokens (each map: query "
                      "down, key across)",
        x_title="head", y_title="layer", colorbar_title=f"weight^{gamma:g}",
        x_ticks=(centers(n_heads), [str(h) for h in range(n_heads)]),
        y_ticks=(centers(n_layers)[::step], [str(layer) for layer in list(layers)[::step]]),
        hovertemplate="pixel %{x}, %{y}<extra></extra>",
        height=max(320, min(60 + n_layers * 70, 1400)), masked=masked if masked.any() else None)
    return fig


def head_detail(p: np.ndarray, tokens: Sequence[str], *, title: str, gamma: float = 1.0,
                causal: bool = False) -> go.Figure:
    """One head p [query, key] with token labels; a heatmap with token hover up to DETAIL_MAX_TOKENS, else an image.

    Grey cells: NaN in p (blank rows, attnviz.views.blank_rows) and, when causal, the keys after each query (masked)."""
    n = p.shape[-1]
    z = np.asarray(p, dtype=np.float64) ** gamma
    if causal:
        z[np.triu_indices(n, 1)] = np.nan
    colorbar = "weight" if gamma == 1 else f"weight^{gamma:g}"
    if n <= DETAIL_MAX_TOKENS:
        labels = [f"{i}: {t}" for i, t in enumerate(tokens)]
        fig = heatmap(z, x_labels=labels, y_labels=labels, title=title, x_title="key token (position: token)",
                      y_title="query token (position: token)", zmin=0.0, zmax=1.0, colorbar_title=colorbar,
                      hovertemplate="query %{y}<br>key %{x}<br>weight %{customdata:.4f}<extra></extra>",
                      height=min(900, 260 + 14 * n))
        fig.data[0].customdata = np.asarray(p, dtype=np.float64)
        return _token_axes(fig, labels, labels)
    ticks = _sparse_ticks(tokens)
    nan = np.isnan(z)
    return image_figure(z, title=title, x_title="key position (token)", y_title="query position (token)",
                        colorbar_title=colorbar, x_ticks=ticks, y_ticks=ticks,
                        hovertemplate="query %{y}<br>key %{x}<extra></extra>", height=800,
                        masked=nan if nan.any() else None)


def pooled_overview(pooled: np.ndarray, n_tokens: int, *, title: str, gamma: float = 1.0,
                    causal: bool = False) -> go.Figure:
    """One head max-pooled to pooled [m, m] (attnviz.views.pooled_heads) as an image whose axes count tokens: pixel
    i covers the tokens between the pooling edges i and i + 1. Grey: blank rows (NaN) and, when causal, blocks
    wholly after the diagonal."""
    m = pooled.shape[-1]
    z = np.asarray(pooled, dtype=np.float64) ** gamma
    masked = np.isnan(z)
    if causal:
        masked |= np.triu(np.ones((m, m), dtype=bool), 1)
    ticks = _pooled_ticks(n_tokens, m)
    colorbar = "max weight" if gamma == 1 else f"max weight^{gamma:g}"
    fig = image_figure(z, title=title, x_title="key position (token)", y_title="query position (token)",
                       colorbar_title=colorbar, x_ticks=ticks, y_ticks=ticks,
                       hovertemplate="block %{y}, %{x}<extra></extra>", height=700,
                       masked=masked if masked.any() else None)
    return fig


def _pooled_ticks(n_tokens: int, m: int) -> tuple[list, list]:
    """Ticks of a map pooled to m pixels: about 8, each labelled with the token where its block starts."""
    edges = pool_edges(n_tokens, m)
    step = max(1, m // 8)
    return list(range(0, m, step)), [f"{int(edges[i]):,}" for i in range(0, m, step)]


def window_detail(w: np.ndarray, tokens: Sequence[str], q0: int, k0: int, *, title: str, gamma: float = 1.0,
                  causal_offset: int | None = None) -> go.Figure:
    """A window w [rows, keys] of one head, queries q0 .. and keys k0 .., with token labels (a zoom of a long map).
    causal_offset: key j is masked (grey) for query i when j > i + causal_offset (None: nothing masked)."""
    rows, keys = w.shape
    z = np.asarray(w, dtype=np.float64) ** gamma
    if causal_offset is not None:
        qi, kj = np.arange(q0, q0 + rows)[:, None], np.arange(k0, k0 + keys)[None, :]
        z = np.where(kj > qi + causal_offset, np.nan, z)
    colorbar = "weight" if gamma == 1 else f"weight^{gamma:g}"
    x_labels = [f"{k0 + j}: {tokens[k0 + j]}" for j in range(keys)]
    y_labels = [f"{q0 + i}: {tokens[q0 + i]}" for i in range(rows)]
    fig = heatmap(z, x_labels=x_labels, y_labels=y_labels, title=title,
                  x_title="key token (position: token)", y_title="query token (position: token)", zmin=0.0, zmax=1.0,
                  colorbar_title=colorbar,
                  hovertemplate="query %{y}<br>key %{x}<br>weight %{customdata:.4f}<extra></extra>",
                  height=min(900, 260 + 14 * rows))
    fig.data[0].customdata = np.asarray(w, dtype=np.float64)
    return _token_axes(fig, x_labels, y_labels)


def remaining_mass(kept: np.ndarray, *, title: str, min_mass: float = MIN_REMAINING) -> go.Figure:
    """kept [query]: each query row's weight off token 0 (attnviz.views.mass_off_sink), on a log axis, with the
    MIN_REMAINING line under which the page leaves the row blank."""
    q = np.arange(len(kept))
    floor = 1e-12  # a row with nothing left (query 0 of a causal model) is drawn at the floor of the log axis
    fig = line_chart(q, {"weight off token 0": np.maximum(np.asarray(kept, dtype=np.float64), floor)}, title=title,
                     x_title="query position (token)", y_title="share of the row (log)",
                     log_y=True, height=280)
    fig.add_hline(y=min_mass, line_dash="dot", annotation_text=f"{min_mass:.0%}: rows below are blank",
                  annotation_position="bottom right")
    fig.update_traces(mode="lines+markers" if len(kept) <= 200 else "lines",
                      hovertemplate="query %{x}<br>weight off token 0 %{y:.3g}<extra></extra>")
    fig.update_layout(showlegend=False)
    fig.update_yaxes(exponentformat="power")  # 10^-6, not the SI "1µ"
    return fig


def _token_axes(fig: go.Figure, x_labels: Sequence[str], y_labels: Sequence[str]) -> go.Figure:
    """A heatmap with a token on every tick: key labels slanted, no grid, NaN cells (blank rows, masked keys) grey
    and without hover, margins wide enough for the labels."""
    fig.data[0].hoverongaps = False
    fig.update_layout(plot_bgcolor="rgb({}, {}, {})".format(*MASKED_GREY))  # NaN cells are not drawn: it shows
    fig.update_xaxes(tickangle=-60, showgrid=False)
    fig.update_yaxes(showgrid=False)
    return label_margins(fig, x_labels=x_labels, y_labels=y_labels, x_angle=60)


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
        x_labels = [f"{i}: {t}" for i, t in enumerate(tokens[:n_keys])]
        fig = heatmap(z, x_labels=x_labels, y_labels=list(row_labels),
                      title=title, x_title="key token (position: token)", y_title="head (layer, head)",
                      zmin=0.0, zmax=1.0, colorbar_title=colorbar,
                      hovertemplate="%{y}<br>key %{x}<br>weight^γ %{z:.4f}<extra></extra>", height=height)
        return _token_axes(fig, x_labels, list(row_labels))
    step = max(1, len(row_labels) // 30)
    nan = np.isnan(z)
    x_ticks = _sparse_ticks(list(tokens[:n_keys]))
    fig = image_figure(z, title=title, x_title="key position (token)", y_title="head (layer, head)",
                       colorbar_title=colorbar, x_ticks=x_ticks,
                       y_ticks=(list(range(0, len(row_labels), step)), list(row_labels)[::step]),
                       hovertemplate="row %{y}<br>key %{x}<extra></extra>", height=height,
                       masked=nan if nan.any() else None)
    # An image keeps square pixels by default: 9 heads x 1,000 keys would be a strip 9 pixels tall.
    fig.update_yaxes(scaleanchor=False)
    return label_margins(fig, x_labels=x_ticks[1], x_angle=30)  # plotly slants crowded labels by 30 degrees


def difference(a: np.ndarray, b: np.ndarray, tokens: Sequence[str], *, title: str,
               pool: int | None = None) -> go.Figure:
    """a - b for two maps of the same shape [query, key], on a diverging scale symmetric about 0. pool: the
    difference drawn max-|.|-pooled to this many pixels (max_abs_pool), its axes in tokens."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if pool is not None:
        return pooled_difference(max_abs_pool(d, pool), d.shape[-1], _bound(d), title=title)
    return signed_map(d, tokens, title=title, colorbar_title="weight A − B", hover_name="A − B")


def _bound(d: np.ndarray) -> float:
    return float(max(np.nanmax(np.abs(d), initial=0.0, where=~np.isnan(d)), 1e-6))  # blank rows are NaN


def signed_map(d: np.ndarray, tokens: Sequence[str], *, title: str, colorbar_title: str,
               hover_name: str = "w") -> go.Figure:
    """A signed map [query, key] (a difference of two maps, a linear mixer's implicit map) on a diverging scale
    symmetric about 0: white is 0, red and blue the two signs; NaN cells (keys a causal query cannot see, blank
    rows) grey."""
    d = np.asarray(d, dtype=np.float64)
    bound, n = _bound(d), d.shape[-1]
    if n <= DETAIL_MAX_TOKENS:
        labels = [f"{i}: {t}" for i, t in enumerate(tokens)]
        fig = heatmap(d, x_labels=labels, y_labels=labels, title=title, x_title="key token (position: token)",
                      y_title="query token (position: token)", colorscale=DIVERGING_SCALE, zmin=-bound, zmax=bound,
                      colorbar_title=colorbar_title,
                      hovertemplate=f"query %{{y}}<br>key %{{x}}<br>{hover_name} %{{z:.4g}}<extra></extra>",
                      height=min(900, 260 + 14 * n))
        return _token_axes(fig, labels, labels)
    ticks = _sparse_ticks(tokens)
    nan = np.isnan(d)
    return image_figure(d, title=title, x_title="key position (token)", y_title="query position (token)",
                        colorscale=DIVERGING_SCALE, vmin=-bound, vmax=bound, colorbar_title=colorbar_title,
                        x_ticks=ticks, y_ticks=ticks, height=800, masked=nan if nan.any() else None)


def pooled_difference(pooled: np.ndarray, n_tokens: int, bound: float, *, title: str) -> go.Figure:
    """A − B already pooled (max_abs_pool, or attnviz.compare block by block) to pooled [m, m], on a diverging scale
    from -bound to bound (the largest |A − B| of the full maps), its axes in tokens; blank rows grey."""
    bound = max(float(bound), 1e-6)
    m = pooled.shape[-1]
    ticks = _pooled_ticks(n_tokens, m)
    nan = np.isnan(pooled)
    return image_figure(pooled, title=f"{title} (each pixel the largest difference of its block, max-pooled to "
                                      f"{m} px)", x_title="key position (token)",
                        y_title="query position (token)", colorscale=DIVERGING_SCALE, vmin=-bound, vmax=bound,
                        colorbar_title="weight A − B", x_ticks=ticks, y_ticks=ticks,
                        hovertemplate="block %{y}, %{x}<extra></extra>", height=700,
                        masked=nan if nan.any() else None)


def stat_grid(stats: pd.DataFrame, column: str, *, title: str, colorbar_title: str) -> go.Figure:
    """One statistic as a layer x head heatmap, so the heads of a role stand out at a glance."""
    table = stats.pivot(index="layer", columns="head", values=column)
    return heatmap(table.to_numpy(), x_labels=[str(h) for h in table.columns],
                   y_labels=[str(layer) for layer in table.index], title=title, x_title="head", y_title="layer",
                   colorbar_title=colorbar_title,
                   hovertemplate="layer %{y}, head %{x}<br>" + column + " %{z:.3f}<extra></extra>",
                   height=max(300, min(60 + 22 * len(table.index), 900)))


def span_bars(weights: np.ndarray, tokens: Sequence[str], layer: int, head: int, queries: Sequence[int],
              how: str) -> go.Figure:
    """The attention a set of queries gives every key in one head (AttentionCapture.span_attention), weights [key],
    `how` "sum" or "mean" of their rows: one bar per key token (bars_by_token: past BARS_AT_MOST keys, a stepped
    line)."""
    queries = [int(q) for q in queries]
    if queries == list(range(queries[0], queries[-1] + 1)):
        shown = f"queries {queries[0]}–{queries[-1]}"
    else:
        shown = f"queries {', '.join(map(str, queries[:8]))}{'…' if len(queries) > 8 else ''}"
    total = "sum over the queries" if how == "sum" else "mean over the queries"
    return bars_by_token({f"{how} of {len(queries)} rows": weights}, tokens,
                         title=f"Layer {layer}, head {head}: the attention of {shown}, {how} of their rows",
                         y_title=f"attention weight ({total})")
