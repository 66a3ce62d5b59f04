"""The tiled kernel's step view: its whole state at each step in one figure, with an in-chart slider over the
steps that the browser draws in place (every map a picture, attnviz.figures.raster; every trace a line). The tile
map's states, its key and the panels' pieces are attnviz.figures.kernel's."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from . import instant, raster
from .common import DIVERGING_SCALE, laid_out
from .kernel import (
    ACC_TITLES, STATE_TITLES, STATE_Y_TITLES, TILE_COLOURS, TILE_STATES, key_note, mask_edges, scores_title,
    state_traces, tile_key,
)

# The step view's panels, top to bottom (fractions of the plot area's height): the tile map and the S tile, the
# online-softmax state, the accumulator; each row's x-axis title and legend sit in the gap under it.
_VIEW_ROWS = ((0.64, 1.0), (0.31, 0.49), (0.0, 0.2))
_VIEW_COLS = (((0.0, 0.44), (0.56, 1.0)), ((0.0, 0.27), (0.365, 0.635), (0.73, 1.0)), ((0.0, 0.44), (0.56, 1.0)))
VIEW_HEIGHT, _VIEW_TOP, _VIEW_BOTTOM = 1150, 80, 70
_BELOW = 50 / (VIEW_HEIGHT - _VIEW_TOP - _VIEW_BOTTOM)  # a row's key or legend, under its tick labels and x title
VIEW_TITLE = "The tiled kernel, one tile a step"
# what the tile map's cells are whatever the step: its hover (the colours of done and current tiles lie over it)
TILE_KINDS = {0: "skipped: the causal mask hides it", 1: "computed without a mask",
              2: "computed masked (the diagonal, a window's edge or the ragged last block)",
              6: "skipped: left of the sliding window"}
_DONE, _DONE_MASKED, _CURRENT = 3, 4, 5  # the TILE_STATES drawn over the map, step by step


def _axes(panel: int) -> tuple[str, str]:
    suffix = "" if panel == 1 else str(panel)
    return f"x{suffix}", f"y{suffix}"


def _tile_boxes(states, state: int, q_edges, k_edges) -> dict:
    """The tiles in `state` (a TILE_STATES index) as one filled line around each (float32, NaN between tiles), in
    that state's colour, with white edges where the map's tiles have gaps."""
    q_edges, k_edges = np.asarray(q_edges, dtype=np.float32), np.asarray(k_edges, dtype=np.float32)
    qb, kb = np.nonzero(np.asarray(states) == state)
    x0, x1, y0, y1 = k_edges[kb], k_edges[kb + 1], q_edges[qb], q_edges[qb + 1]
    gap = np.full_like(x0, np.nan)
    x = np.stack([x0, x1, x1, x0, x0, gap], axis=-1).ravel()
    y = np.stack([y0, y0, y1, y1, y0, gap], axis=-1).ravel()
    return dict(type="scatter", x=x, y=y, mode="lines", fill="toself", fillcolor=TILE_COLOURS[state],
                line=dict(color="white", width=1), hoverinfo="skip", showlegend=False, name=TILE_STATES[state])


def tile_map_lines(base, q_edges, k_edges, *, causal: bool, window: int | None) -> list[dict]:
    """The step view's tile map before any step (base: its tile states), on its first panel, as line traces only
    (plotly.animate animates lines, and stops drawing a heatmap once the slider moves): the tiles of each state of
    base (_tile_boxes), an invisible line through the centres of each kind's tiles for the hover (their positions,
    TILE_KINDS; the layout's hoverdistance -1 takes the nearest), the causal diagonal and the window's edge."""
    base = np.asarray(base)
    kinds = [kind for kind in TILE_KINDS if (base == kind).any()]
    traces = [_tile_boxes(base, kind, q_edges, k_edges) for kind in kinds]
    q_edges, k_edges = np.asarray(q_edges), np.asarray(k_edges)
    for kind in kinds:
        qb, kb = np.nonzero(base == kind)
        first_last = np.stack([q_edges[qb], q_edges[qb + 1] - 1, k_edges[kb], k_edges[kb + 1] - 1], axis=-1)
        traces.append(dict(type="scatter", x=(k_edges[kb] + k_edges[kb + 1]) / 2,
                           y=(q_edges[qb] + q_edges[qb + 1]) / 2, customdata=first_last.astype(np.int32),
                           mode="lines", line=dict(width=0), showlegend=False,
                           hovertemplate="queries %{customdata[0]}–%{customdata[1]}, keys %{customdata[2]}–"
                                         f"%{{customdata[3]}}<br>{TILE_KINDS[kind]}<extra></extra>"))
    traces += mask_edges(int(q_edges[-1]), int(k_edges[-1]), causal=causal, window=window)
    return [dict(t, xaxis="x", yaxis="y") for t in traces]


def step_view_limits(steps: Sequence) -> tuple[float, float]:
    """(scores, accumulator): the largest |value| of the finite scores and of acc and acc·alpha over the steps, the
    step view's two colour scales (one for every stop, so that a colour means one value all along the slider)."""
    def largest(arrays) -> float:
        values = np.concatenate([np.asarray(a, dtype=float).ravel() for a in arrays])
        values = np.abs(values[np.isfinite(values)])
        return float(values.max()) if values.size and values.max() > 0 else 1.0
    return (largest(s.scores for s in steps),
            largest([a for s in steps for a in (s.acc_rescaled, s.acc)]))


def _step_maps(step, limits: tuple[float, float]) -> tuple[list[dict], list[dict]]:
    """(hover traces, layout images) of one step's S tile (panel 2) and accumulator before and after (6, 7), each
    cell at its offset in the tile (the axes stay put along the slider; the hover names the positions)."""
    scores = np.asarray(step.scores)  # -inf where masked: blank, and no hover
    q, k = step.q_start, step.k_start
    maps = [(2, scores, limits[0], (q, k), "query %{customdata[1]}<br>key %{customdata[2]}<br>score "
                                           "%{customdata[0]:.4g}<extra></extra>")]
    maps += [(panel, np.asarray(acc), limits[1], (q, None), "query %{customdata[1]}<br>channel %{x}<br>"
                                                            "value %{customdata[0]:.4g}<extra></extra>")
             for panel, acc in ((6, step.acc_rescaled), (7, step.acc))]
    hovers, images = [], []
    for panel, values, limit, named_from, template in maps:
        hovers.append(raster.map_hover(values, axes=_axes(panel), hovertemplate=template, named_from=named_from))
        shown = np.where(np.isneginf(values), np.nan, values)
        images.append(raster.map_image(shown, axes=_axes(panel), colorscale=DIVERGING_SCALE, vmin=-limit,
                                       vmax=limit))
    return hovers, images


def _state_lines(step) -> list[dict]:
    """m_i, l_i (before and after) and alpha per query row of the tile (panels 3-5), at the row's offset."""
    rows = np.arange(step.q_start, step.q_stop)
    traces = []
    for col, trace in state_traces(rows - step.q_start, step.m_prev, step.m_i, step.l_prev, step.l_i, step.alpha):
        traces.append(dict(trace, legend="legend2", xaxis=_axes(2 + col)[0], yaxis=_axes(2 + col)[1], customdata=rows,
                           hovertemplate=f"query %{{customdata}}<br>{trace['name']}: %{{y:.6g}}<extra></extra>"))
    return traces


def _text(text: str, x: float, y: float, panel: int, position: str, size: int) -> dict:
    """A line of text drawn as a trace (a layout title or annotation would need the figure drawn again)."""
    return dict(type="scatter", x=[x], y=[y], text=[text], mode="text", textposition=position,
                textfont=dict(size=size), cliponaxis=False, hoverinfo="skip", showlegend=False,
                xaxis=_axes(panel)[0], yaxis=_axes(panel)[1])


def step_view_parts(step, states, base_lines: list[dict], title: str, q_edges, k_edges, *,
                    limits: tuple[float, float], block: tuple[int, int]) -> tuple[list[dict], list[dict]]:
    """step_view_figure's traces and layout images for one step, as plain dicts (a stop of its slider; the rest of
    the layout is the same at every step: _view_axes, _view_notes). base_lines: tile_map_lines of the tile states
    before any step, the traces every step shares (the same objects in every stop, which the slider's builder finds
    unchanged at once: not to be changed afterwards); limits: the colour scales' (step_view_limits); block: (rows,
    columns) of the largest tile, the extent of the tile's panels."""
    traces = list(base_lines)
    traces += [dict(_tile_boxes(states, s, q_edges, k_edges), xaxis="x", yaxis="y")
               for s in (_DONE, _DONE_MASKED, _CURRENT)]
    hovers, images = _step_maps(step, limits)
    traces += [hovers[0], _text(scores_title(step.scores, step.q_start, step.k_start), (block[1] - 1) / 2, -0.5,
                                2, "top center", 16),
               raster.colour_bar(axes=_axes(2), colorscale=DIVERGING_SCALE, vmin=-limits[0], vmax=limits[0],
                                 colorbar=dict(title=dict(text="score"), y=sum(_VIEW_ROWS[0]) / 2,
                                               len=_VIEW_ROWS[0][1] - _VIEW_ROWS[0][0]))]
    traces += _state_lines(step)
    traces += hovers[1:] + [raster.colour_bar(axes=_axes(7), colorscale=DIVERGING_SCALE, vmin=-limits[1],
                                              vmax=limits[1], colorbar=dict(title=dict(text="value"),
                                                                            y=sum(_VIEW_ROWS[2]) / 2,
                                                                            len=_VIEW_ROWS[2][1] - _VIEW_ROWS[2][0]))]
    traces.append(_text(title, 0.0, 0.0, 1, "top right", 15))  # over the tile map, the panel's title
    return traces, images


def _view_axes(q_edges, k_edges, block: tuple[int, int]) -> dict:
    """The step view's axes: its seven panels (_VIEW_ROWS, _VIEW_COLS), the tile's panels over offsets in the tile,
    fixed along the slider."""
    axes, panel = {}, 0
    for (y0, y1), cols in zip(_VIEW_ROWS, _VIEW_COLS):
        for x0, x1 in cols:
            panel += 1
            x, y = _axes(panel)
            axes[f"xaxis{x[1:]}"] = dict(anchor=y, domain=[x0, x1])
            axes[f"yaxis{y[1:]}"] = dict(anchor=x, domain=[y0, y1])
    key, query = "key position (token index)", "query position (token index)"
    axes["xaxis"].update(range=[0, k_edges[-1]], showgrid=False, zeroline=False, title=dict(text=key))
    axes["yaxis"].update(range=[q_edges[-1], 0], showgrid=False, zeroline=False, title=dict(text=query))
    x_range, y_range = raster.map_ranges(block)
    axes["xaxis2"].update(x_range, title=dict(text="key, offset in the tile (+ its first key)"))
    axes["yaxis2"].update(y_range, title=dict(text="query, offset in the tile (+ its first query)"))
    for panel, y_title in zip((3, 4, 5), STATE_Y_TITLES):
        axes[f"xaxis{panel}"].update(range=[-0.5, block[0] - 0.5], title=dict(text="query, offset in the tile"))
        axes[f"yaxis{panel}"].update(title=dict(text=y_title), **(dict(range=[0, 1.05]) if panel == 5 else {}))
    for panel in (6, 7):
        axes[f"xaxis{panel}"].update(showgrid=False, zeroline=False, title=dict(text="head-dim channel (index)"))
        axes[f"yaxis{panel}"].update(raster.map_ranges(block)[1], title=dict(text="query, offset in the tile"))
    return axes


def _view_notes(causal: bool, window: int | None) -> list[dict]:
    """The step view's fixed text: the panel titles that do not change with the step (the top row's are its
    lines of text), and the tile map's key."""
    titles = ((), tuple(zip(STATE_TITLES, _VIEW_COLS[1])), tuple(zip(ACC_TITLES, _VIEW_COLS[2])))
    notes = [dict(text=text, x=(x0 + x1) / 2, y=y1, xref="paper", yref="paper", xanchor="center", yanchor="bottom",
                  showarrow=False, font=dict(size=16))
             for (_, y1), row in zip(_VIEW_ROWS, titles) for text, (x0, x1) in row]
    return notes + [key_note(tile_key(causal=causal, window=window), 0.0, _VIEW_ROWS[0][0] - _BELOW)]


def step_view_figure(steps: Sequence, states: Sequence, titles: Sequence[str], active: int, *, base, q_edges,
                     k_edges, causal: bool, window: int | None = None) -> go.Figure:
    """The kernel's whole state at each of `steps` in one figure, with an in-chart slider over them (one stop per
    step, drawn by the browser in place: every map is a picture, attnviz.figures.raster, and nothing in the layout
    but the pictures changes): top, the score matrix by tiles (states[i], TILE_STATES indices, between q_edges and
    k_edges) and the current tile's scores; middle, m_i, l_i and alpha per query row; bottom, the accumulator
    before and after the tile; the tile's panels over offsets in the tile. base: the tile states before any step
    (tile_states(codes, [], None)), the map under the done and current tiles. steps: TileStep-like (scores, q_start,
    q_stop, k_start, m_prev, m_i, l_prev, l_i, alpha, acc_rescaled, acc; attnviz.kernels.tiled_steps); titles[i]:
    the line over the chart at steps[i]; drawn at steps[active]. Steps are labelled by their index."""
    limits = step_view_limits(steps)
    block = (max(np.shape(s.scores)[0] for s in steps), max(np.shape(s.scores)[1] for s in steps))
    lines = tile_map_lines(base, q_edges, k_edges, causal=causal, window=window)
    parts = [step_view_parts(s, st, lines, t, q_edges, k_edges, limits=limits, block=block)
             for s, st, t in zip(steps, states, titles)]
    traces, images = parts[active]
    layout = dict(_view_axes(q_edges, k_edges, block), images=images, annotations=_view_notes(causal, window),
                  title=dict(text=VIEW_TITLE, x=0.0, xanchor="left"), hoverdistance=-1,
                  legend2=dict(orientation="h", yanchor="top", y=_VIEW_ROWS[1][0] - _BELOW, xanchor="left", x=0.0))
    fig = laid_out(traces, layout, height=VIEW_HEIGHT, margin=dict(t=_VIEW_TOP, b=_VIEW_BOTTOM),
                   validate=False)  # its JSON is the validated figure's (a test), built in a third of the time
    return instant.add_frame_slider(fig, [{"data": t, "layout": {"images": im}} for t, im in parts],
                                    [str(s.index) for s in steps], active, parameter="step")
