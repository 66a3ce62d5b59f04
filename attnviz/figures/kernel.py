"""Figures for the tiled kernel: the tile map, one tile's scores, the online-softmax state, peak memory, timings;
the pieces of the step view (attnviz.figures.kernel_steps)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import DIVERGING_SCALE, PALETTE, apply_layout, label_margins, line_chart

# Tile states, indexed by the values of tile_states(): what the map colours and its key (tile_key) say.
TILE_STATES = ("skipped (causal mask)", "to do", "to do, masked", "done", "done, masked", "current",
               "skipped (sliding window)")
TILE_COLOURS = ("#f8f9fa", "#ced4da", "#ffd43b", "#74c0fc", "#1c7ed6", "#e8590c", "#d0bfff")
WINDOW_EDGE = "#7048e8"  # a sliding window's left edge on the tile map
SKIPPED, FULL, MASKED, WINDOW = 0, 1, 2, 3  # the tile_map codes of attnviz.kernels.stages (figures import no torch)


def tile_states(codes, done: Sequence[tuple[int, int]], current: tuple[int, int] | None) -> np.ndarray:
    """[n_query_blocks, n_key_blocks] indices into TILE_STATES from tile_map codes (0 skipped by the causal mask,
    1 run without a mask, 2 run masked: the causal diagonal, a window's edge or the ragged last key block, 3 skipped
    left of a sliding window), the (query block, key block) pairs already done, and the current one."""
    codes = np.asarray(codes)
    states = np.select([codes == SKIPPED, codes == WINDOW, codes == MASKED], [0, 6, 2], 1)
    for qb, kb in done:
        states[qb, kb] = 4 if codes[qb, kb] == MASKED else 3
    if current is not None:
        states[current] = 5
    return states


def _tile_map_traces(states, q_edges, k_edges, *, causal: bool, window: int | None) -> list[dict]:
    """The tile map as plain trace dicts: states [n_query_blocks, n_key_blocks] (TILE_STATES indices) between the
    tiles' boundaries, the causal diagonal and a sliding window's left edge (tile_key names them); the hover gives
    each tile's positions and state."""
    # the positions written out: plotly's %{x} on a map drawn between edges is the tile's centre
    hover = np.array([[f"queries {q_edges[a]}–{q_edges[a + 1] - 1}, keys {k_edges[b]}–{k_edges[b + 1] - 1}<br>"
                       f"{TILE_STATES[int(state)]}" for b, state in enumerate(row)] for a, row in enumerate(states)],
                     dtype=object)
    states = np.asarray(states, dtype=float)
    n_query, n_key = q_edges[-1], k_edges[-1]
    n_states = len(TILE_STATES)
    colourscale = []
    for i, colour in enumerate(TILE_COLOURS):
        colourscale += [[i / n_states, colour], [(i + 1) / n_states, colour]]
    traces = [dict(type="heatmap", z=states, x=np.asarray(k_edges, dtype=float), y=np.asarray(q_edges, dtype=float),
                   colorscale=colourscale, zmin=-0.5, zmax=n_states - 0.5, xgap=1, ygap=1, showscale=False,
                   customdata=hover, hovertemplate="%{customdata}<extra></extra>")]
    return traces + mask_edges(n_query, n_key, causal=causal, window=window)


def mask_edges(n_query: int, n_key: int, *, causal: bool, window: int | None) -> list[dict]:
    """The causal diagonal and a sliding window's left edge over the tile map, as lines."""
    traces = []
    if causal:
        offset = n_key - n_query
        traces.append(dict(type="scatter", x=[max(offset, 0), n_key], y=[max(-offset, 0), n_query], mode="lines",
                           line=dict(color=PALETTE[7], dash="dot"), name="causal diagonal", hoverinfo="skip",
                           showlegend=False))
        if window:  # the window's left edge, key = query + offset - window + 1 (drawn to the chart's edge)
            x0 = max(offset - window + 1, 0)
            traces.append(dict(type="scatter", x=[x0, n_key],
                               y=[x0 - offset + window - 1, n_key - offset + window - 1], mode="lines",
                               line=dict(color=WINDOW_EDGE, dash="dash"), name=f"window edge ({window} keys)",
                               hoverinfo="skip", showlegend=False))
    return traces


def tile_key(*, causal: bool, window: int | None, per_line: int = 4) -> str:
    """The tile map's key as one annotation's text (one element to draw, where a legend of one trace per state
    made every step's redraw slower): a square of each state's colour before its name (an outlined one for the
    near-white state), per_line states a line, then the causal diagonal's and the window edge's line styles."""
    gap = "\u2003"
    entries = []
    for name, colour in zip(TILE_STATES, TILE_COLOURS):
        if name == TILE_STATES[-1] and not window:
            continue
        glyph, shade = ("□", "#868e96") if colour == TILE_COLOURS[0] else ("■", colour)
        entries.append(f"<span style='color:{shade}'>{glyph}</span> {name}")
    lines = [gap.join(entries[i:i + per_line]) for i in range(0, len(entries), per_line)]
    drawn = ([f"<span style='color:{PALETTE[7]}'>┈┈</span> causal diagonal"] if causal else []) + (
        [f"<span style='color:{WINDOW_EDGE}'>╌╌</span> window edge ({window} keys)"] if causal and window else [])
    return "<br>".join(lines + ([gap.join(drawn)] if drawn else []))


def key_note(text: str, x: float, y: float) -> dict:
    """tile_key's annotation, its top left corner at (x, y) in paper units."""
    return dict(text=text, x=x, y=y, xref="paper", yref="paper", xanchor="left", yanchor="top", align="left",
                showarrow=False, font=dict(size=12, color="#495057"))


def _scores_trace(scores, q_start: int, k_start: int) -> dict:
    """The current tile's scores [rows, cols] from query q_start and key k_start, masked entries (-inf) blank, on a
    diverging scale centred on 0, over numeric position axes (a categorical axis labelled every row and column, and
    each step of the in-chart slider redrew those labels: slower)."""
    scores = np.asarray(scores, dtype=float)
    shown = np.where(np.isneginf(scores), np.nan, scores)
    rows, cols = scores.shape
    return dict(type="heatmap", z=shown, x=list(range(k_start, k_start + cols)),
                y=list(range(q_start, q_start + rows)), colorscale=DIVERGING_SCALE,
                colorbar=dict(title=dict(text="score")), **_symmetric(shown),
                hovertemplate="query %{y}<br>key %{x}<br>score %{z:.4g}<extra></extra>")


def scores_title(scores, q_start: int, k_start: int) -> str:
    rows, cols = np.shape(scores)
    return f"S tile: queries {q_start}–{q_start + rows - 1}, keys {k_start}–{k_start + cols - 1}"


def state_traces(rows, m_prev, m_i, l_prev, l_i, alpha) -> list[tuple[int, dict]]:
    """(panel 1-3, trace dict) for the online-softmax state per query row: m_i and l_i before and after, alpha."""
    rows = np.asarray(rows)
    panels = ((1, ("before", m_prev), ("after", m_i)), (2, ("before", l_prev), ("after", l_i)), (3, ("alpha", alpha),))
    traces = []
    for col, *series in panels:
        for i, (name, y) in enumerate(series):
            y = np.asarray(y, dtype=float)
            traces.append((col, dict(
                type="scatter", x=rows, y=np.where(np.isfinite(y), y, np.nan), mode="markers+lines", name=name,
                legendgroup=name, showlegend=col == 1 or name == "alpha",
                marker=dict(color=PALETTE[2] if name == "alpha" else PALETTE[i], size=6),
                line=dict(dash="dot" if name == "before" else "solid", width=1))))
    return traces


STATE_TITLES = ("running max m_i", "running sum l_i", "alpha = exp(m_before - m_after)")
STATE_Y_TITLES = ("max score (logit units)", "sum of exp(score - m_i) (unitless)", "rescale factor (unitless)")
ACC_TITLES = ("acc · alpha (old acc, rescaled)", "acc after + p v (this tile's values)")


def _acc_traces(acc_rescaled, acc, q_start: int) -> list[dict]:
    """The accumulator tile [rows, d] before this tile's values are added (rescaled by alpha) and after, on one
    colour scale with one colour bar."""
    acc_rescaled, acc = np.asarray(acc_rescaled, dtype=float), np.asarray(acc, dtype=float)
    limits = _symmetric(np.concatenate([acc_rescaled.ravel(), acc.ravel()]))
    y = list(range(q_start, q_start + acc.shape[0]))
    return [dict(type="heatmap", z=values, x=list(range(values.shape[1])), y=y, colorscale=DIVERGING_SCALE,
                 showscale=i == 1, colorbar=dict(title=dict(text="value")), **limits,
                 hovertemplate="query %{y}<br>channel %{x}<br>value %{z:.4g}<extra></extra>")
            for i, values in enumerate((acc_rescaled, acc))]


def step_figure(states, q_edges, k_edges, scores, q_start: int, k_start: int, *, causal: bool,
                title: str, window: int | None = None) -> go.Figure:
    """One step of the kernel in one figure (one chart to draw per step, not two): left, the [N_query, N_key] score
    matrix by tiles, states [n_query_blocks, n_key_blocks] (TILE_STATES indices) between the tiles' boundaries
    q_edges and k_edges (positions), its states in the key under it (tile_key); right, the current tile's scores
    [rows, cols] (q k^T * scale) from query q_start and key k_start, masked entries (-inf) blank."""
    n_query, n_key = q_edges[-1], k_edges[-1]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        "Score matrix by tiles", scores_title(scores, q_start, k_start)))
    for trace in _tile_map_traces(states, q_edges, k_edges, causal=causal, window=window):
        fig.add_trace(trace, row=1, col=1)
    fig.add_trace(_scores_trace(scores, q_start, k_start), row=1, col=2)
    fig.update_xaxes(range=[0, n_key], row=1, col=1)
    fig.update_yaxes(range=[n_query, 0], row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=2)
    apply_layout(fig, title=title, x_title="key position (token index)", y_title="query position (token index)",
                 height=480)
    fig.add_annotation(key_note(tile_key(causal=causal, window=window, per_line=3), 0.0, -0.2))
    return fig.update_layout(margin=dict(t=80, b=130))


def accumulator_figure(acc_rescaled, acc, q_start: int) -> go.Figure:
    """The accumulator tile [rows, d] before this tile's values are added (rescaled by alpha) and after, side by
    side on one colour scale (one chart to draw per step): one row per query, one column per head-dim channel."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=ACC_TITLES)
    for col, trace in enumerate(_acc_traces(acc_rescaled, acc, q_start), start=1):
        fig.add_trace(trace, row=1, col=col)
    fig.update_yaxes(autorange="reversed")
    apply_layout(fig, title="The accumulator before and after this tile", x_title="head-dim channel (index)",
                 y_title="query position (token index)", height=340)
    return fig.update_layout(margin=dict(t=80))


def state_figure(rows, m_prev, m_i, l_prev, l_i, alpha) -> go.Figure:
    """The online-softmax state of one step per query row: m_i and l_i before and after, and alpha."""
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.1, subplot_titles=STATE_TITLES)
    for col, trace in state_traces(rows, m_prev, m_i, l_prev, l_i, alpha):
        fig.add_trace(trace, row=1, col=col)
    apply_layout(fig, title="Online-softmax state per query row (before and after this tile)", height=360)
    fig.update_layout(margin=dict(t=90, b=110), legend=dict(y=-0.35, yanchor="top", x=0.5, xanchor="center"))
    fig.update_xaxes(title_text="query position (token index)")
    for col, y_title in enumerate(STATE_Y_TITLES, start=1):
        fig.update_yaxes(title_text=y_title, row=1, col=col, **(dict(range=[0, 1.05]) if col == 3 else {}))
    return fig


def peak_memory_figure(sizes, peaks: Mapping[str, Sequence[float | None]]) -> go.Figure:
    """Measured peak bytes against N, one line per method, in MiB on log-log axes."""
    series = {name: [np.nan if b is None else b / 2**20 for b in values] for name, values in peaks.items()}
    fig = line_chart(sizes, series, title="Peak memory of the attention call, measured",
                     x_title="sequence length N (tokens, log scale)", y_title="peak memory (MiB, log scale)",
                     log_x=True, log_y=True, height=340)
    fig.update_traces(mode="lines+markers")
    fig.update_xaxes(tickvals=list(sizes), ticktext=[str(n) for n in sizes])
    return fig.update_yaxes(dtick=1)


def timing_figure(methods: Sequence[str], milliseconds: Sequence[float]) -> go.Figure:
    """Wall time per method as a dot plot on a log axis (ms), one row per method (only methods whose time is a
    speed). Dots, not bars: on a log axis a bar's length depends on where the axis starts and means nothing."""
    ms = [float(t) for t in milliseconds]
    fig = go.Figure(go.Scatter(
        x=ms, y=list(methods), mode="markers+text", marker=dict(color=PALETTE[0], size=12),
        text=[f"{t:.3g} ms" for t in ms], textposition="middle right", cliponaxis=False,
        hovertemplate="%{y}: %{x:.3g} ms<extra></extra>"))
    finite = [t for t in ms if t > 0 and np.isfinite(t)]
    lo, hi = (min(finite), max(finite)) if finite else (1.0, 1.0)
    # a decade of room each side, and a little more on the right for the labels
    fig.update_xaxes(type="log", dtick=1, range=[np.floor(np.log10(lo)) - 0.2, np.ceil(np.log10(hi)) + 0.6],
                     showgrid=True)
    fig.update_yaxes(autorange="reversed", showgrid=True)
    apply_layout(fig, title="Wall time per call on this machine, one run",
                 x_title="time per call (ms, log scale)", y_title="method", height=max(260, 60 * len(ms) + 120))
    return label_margins(fig, y_labels=list(methods))


def _symmetric(z) -> dict:
    """zmin, zmax centred on 0, so a diverging scale puts white at zero."""
    finite = np.asarray(z, dtype=float)[np.isfinite(z)]
    limit = float(np.abs(finite).max()) if finite.size and np.abs(finite).max() > 0 else 1.0
    return {"zmin": -limit, "zmax": limit}
