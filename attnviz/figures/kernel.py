"""Figures for the tiled kernel: peak memory and timings, and the pieces of the step view that
attnviz.figures.kernel_steps draws (tile states and their key, the mask's edges, the online-softmax state's traces,
the panels' titles)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from .common import PALETTE, apply_layout, label_margins, line_chart

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

