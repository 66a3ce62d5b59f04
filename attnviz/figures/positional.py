"""Figures for the positional-encodings page: sinusoidal tables, RoPE rotations and decay, ALiBi slopes and biases,
attention against distance. Numpy in, go.Figure out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.figures import instant, raster
from attnviz.figures.common import (
    DIVERGING_SCALE, PALETTE, apply_layout, below_legend, grid_layout, heatmap, hline, laid_out, legend_below,
    line_chart,
)


def _log_ticks(fig: go.Figure, **kwargs) -> go.Figure:
    """Log axes labelled at the decades only (1, 0.1, 0.01, ...)."""
    fig.update_yaxes(type="log", dtick=1, tickformat=".0e", **kwargs)
    return fig


def encoding_heatmap(pe: np.ndarray, *, title: str = "Sinusoidal encoding PE[position, dimension]") -> go.Figure:
    """pe: [n_positions, d_model] as a heatmap, positions down, dimensions across."""
    return heatmap(pe, title=title, x_title="dimension index (even = sin, odd = cos)", y_title="position (tokens)",
                   colorscale=DIVERGING_SCALE, zmin=-1, zmax=1, colorbar_title="value",
                   hovertemplate="position %{y}<br>dimension %{x}<br>PE %{z:.4f}<extra></extra>", height=420)


def dot_by_offset(offsets, dots, *, d_model: int) -> go.Figure:
    """PE_p . PE_(p+k) against k; one curve, identical for every p."""
    return line_chart(offsets, {"PE_p · PE_(p+k)": dots}, title="Similarity of two encodings k positions apart",
                      x_title="offset k (tokens)", y_title="dot product (unitless)", height=360,
                      **hline(d_model / 2, f"d/2 = {d_model / 2:g} at k = 0", dict(color="#868e96", dash="dot")))


def dot_by_offset_instant(offsets, dots_by_d: Mapping[int, Sequence[float]], d_model: int) -> go.Figure:
    """dot_by_offset with an in-chart slider over d_model: dots_by_d {d_model: PE_p . PE_(p+k) at the offsets}
    (attnviz.positional.sinusoidal_dot). Drawn at d_model."""
    return instant.slider_over(lambda d: dot_by_offset(offsets, dots_by_d[d], d_model=d), list(dots_by_d), d_model,
                               parameter="d_model")


def matrix_heatmap(m: np.ndarray, *, title: str, x_title: str = "input dimension",
                   y_title: str = "output dimension") -> go.Figure:
    """A small signed matrix (rotation, permutation) with a symmetric colour range."""
    lim = float(np.abs(m).max()) or 1.0
    return heatmap(m, title=title, x_title=x_title, y_title=y_title, colorscale=DIVERGING_SCALE, zmin=-lim, zmax=lim,
                   colorbar_title="entry", height=380)


def _arrow(name: str, v, color: str, dash: str) -> dict:
    """A 2-D vector as an arrow from the origin (a plain trace dict)."""
    return dict(type="scatter", x=np.array([0.0, v[0]]), y=np.array([0.0, v[1]]), mode="lines+markers", name=name,
                line=dict(color=color, dash=dash, width=3 if dash == "solid" else 1.5),
                marker=dict(size=[0, 10], symbol="arrow", angleref="previous"))


def _rotation_layout(q_pair, k_pair, title: str) -> tuple[list[dict], dict]:
    """The parts of a pair-rotation figure that no position changes: q and k dotted, the circles their rotations
    stay on, equal axes."""
    traces = [_arrow("q", q_pair, PALETTE[0], "dot"), _arrow("k", k_pair, PALETTE[1], "dot")]
    t = np.linspace(0, 2 * np.pi, 100)
    for v, color in ((q_pair, PALETTE[0]), (k_pair, PALETTE[1])):
        radius = float(np.linalg.norm(v))
        traces.append(dict(type="scatter", x=radius * np.cos(t), y=radius * np.sin(t), mode="lines",
                           showlegend=False, hoverinfo="skip", line=dict(color=color, width=0.5)))
    lim = 1.15 * max(np.linalg.norm(q_pair), np.linalg.norm(k_pair), 1e-9)
    return traces, dict(title=title, xaxis=dict(range=[-lim, lim], zeroline=True),
                        yaxis=dict(range=[-lim, lim], zeroline=True, scaleanchor="x", scaleratio=1))


def rope_pair_rotation_instant(q_pair, k_pair, rotated_q: Mapping[float, np.ndarray],
                               rotated_k: Mapping[float, np.ndarray], positions: Sequence[int], m: int, n: int,
                               base: float, titles: Mapping[float, str]) -> go.Figure:
    """One feature pair of q (at position m) and k (at position n) as 2-D arrows before and after RoPE's rotation,
    with two in-chart sliders: the query position m over `positions` (frames) and the base over the keys of rotated_q
    (a group of traces per base, one visible at a time).

    rotated_q: {base: [len(positions), 2]}, the q pair at each position; rotated_k: {base: [2]}, the k pair at
    position n; titles: {base: the chart's title at that base}. Drawn at (m, base)."""
    q_pair, k_pair = np.asarray(q_pair, float), np.asarray(k_pair, float)
    bases, positions = list(rotated_q), list(positions)
    shared, layout = _rotation_layout(q_pair, k_pair, titles[base])

    def traces(i: int) -> list[dict]:
        out = list(shared)
        for b in bases:
            out += [_arrow(f"R_m q (m = {positions[i]})", rotated_q[b][i], PALETTE[0], "solid"),
                    _arrow(f"R_n k (n = {n})", rotated_k[b], PALETTE[1], "solid")]
        return out

    fig = laid_out(traces(positions.index(m)), layout, title=titles[base], x_title="first coordinate (unitless)",
                   y_title="second coordinate (unitless)", height=480,
                   legend=below_legend(y=-0.22), margin=dict(b=115))  # two rows of legend in a half-width column
    stops = [{"data": traces(i), "layout": {}} for i in range(len(positions))]
    instant.add_frame_slider(fig, stops, [str(p) for p in positions], positions.index(m),
                             parameter="query position m")
    groups = [[len(shared) + 2 * j, len(shared) + 2 * j + 1] for j in range(len(bases))]
    return instant.add_group_slider(fig, groups, [f"{b:,.0f}" for b in bases], bases.index(base), parameter="base",
                                    layouts=[{"title.text": titles[b]} for b in bases])


def _rope_layouts_parts(paper, half, permutation) -> tuple[list[dict], dict]:
    """rope_layouts' traces and layout as plain dicts (a stop of its slider is built without plotly's checks): the
    three matrices are pictures (attnviz.figures.raster: the slider swaps the two rotations in place), on one colour
    bar."""
    layout = grid_layout(1, 3, ["Paper layout R_m", "rotate_half layout R_m",
                                "Permutation P: interleaved → rotate_half"], horizontal_spacing=0.09)
    layout["images"] = []
    traces = []
    template = "row %{y}<br>column %{x}<br>entry %{customdata:.4f}<extra></extra>"
    titles = (("input dimension", "output dimension"),) * 2 + (("interleaved index", "rotate_half index"),)
    for i, (z, (x_title, y_title)) in enumerate(zip((paper, half, permutation), titles)):
        suffix = "" if i == 0 else str(i + 1)
        axes = (f"x{suffix}", f"y{suffix}")
        z = np.asarray(z, dtype=float)
        layout["images"].append(raster.map_image(z, axes=axes, colorscale=DIVERGING_SCALE, vmin=-1.0, vmax=1.0))
        traces.append(raster.map_hover(z, axes=axes, hovertemplate=template))
        x_range, y_range = raster.map_ranges(z.shape)
        layout[f"xaxis{suffix}"].update(x_range, title=dict(text=x_title))
        layout[f"yaxis{suffix}"].update(y_range, title=dict(text=y_title))
    traces.append(raster.colour_bar(axes=("x3", "y3"), colorscale=DIVERGING_SCALE, vmin=-1.0, vmax=1.0,
                                    colorbar=dict(title=dict(text="entry"))))
    return traces, layout


def rope_layouts(paper, half, permutation) -> go.Figure:
    """The RoPE rotation R_m [d, d] at one position m in the paper's layout and in rotate_half's, and the permutation
    matrix [d, d] that turns one into the other, side by side on one signed colour scale (-1 to 1)."""
    traces, layout = _rope_layouts_parts(paper, half, permutation)
    fig = go.Figure(data=traces, layout=layout)
    apply_layout(fig, height=380)
    return fig.update_layout(margin=dict(t=60))


def rope_layouts_instant(paper_by_m: Sequence, half_by_m: Sequence, permutation, positions: Sequence[int],
                         m: int) -> go.Figure:
    """rope_layouts with an in-chart slider over the position m: paper_by_m[i], half_by_m[i] are R_m [d, d] at
    positions[i] in the two layouts (attnviz.positional.rope_rotation_matrix). Drawn at m."""
    positions = list(positions)
    stops = []
    for paper, half in zip(paper_by_m, half_by_m):
        traces, layout = _rope_layouts_parts(paper, half, permutation)
        stops.append({"data": traces, "layout": {"images": layout["images"]}})
    i = positions.index(m)
    return instant.add_frame_slider(rope_layouts(paper_by_m[i], half_by_m[i], permutation), stops,
                                    [str(p) for p in positions], i, parameter="query position m")


def decay_bound_chart(distances, curves: Mapping[str, Sequence[float]], *, log_x: bool = False) -> go.Figure:
    """RoFormer Figure 2: the relative upper bound against distance, one curve per setting."""
    names = list(curves)
    fig = line_chart(distances, curves, title="RoFormer §3.4.3 relative upper bound against distance",
                     x_title="relative distance (tokens)", y_title="relative upper bound (unitless)", log_x=log_x,
                     dashed=names[1:], height=420)
    return legend_below(fig, y=-0.22, bottom=90)


def decay_bound_instant(distances, curves_by_base: Mapping[float, Mapping[str, Sequence[float]]], base: float, *,
                        log_x: bool = False) -> go.Figure:
    """decay_bound_chart with an in-chart slider over the RoPE base: {base: {name: bound at the distances}}
    (attnviz.positional.rope_decay_bound), the same curves in the same order at every base. Drawn at `base`."""
    return instant.slider_over(lambda b: decay_bound_chart(distances, curves_by_base[b], log_x=log_x),
                               list(curves_by_base), base, parameter="base",
                               labels=[f"{b:,.0f}" for b in curves_by_base])


def slopes_bar(slopes: np.ndarray, n_geometric: int | None = None) -> go.Figure:
    """ALiBi slope per head, log scale: a geometric sequence is a straight line. The first n_geometric heads
    (the power-of-two part) in one colour, the interleaved extra heads in another."""
    heads = np.arange(len(slopes))
    n_geometric = len(slopes) if n_geometric is None else n_geometric
    fig = go.Figure()
    for name, sel, color in (("2^⌊log2 n⌋ geometric heads", heads < n_geometric, PALETTE[0]),
                             ("extra heads (odd powers of the next sequence)", heads >= n_geometric, PALETTE[1])):
        if sel.any():
            fig.add_trace(go.Bar(x=heads[sel], y=slopes[sel], marker_color=color, name=name,
                                 hovertemplate="head %{x}<br>slope %{y:.6g}<extra></extra>"))
    _log_ticks(fig)
    apply_layout(fig, title=f"ALiBi slopes for {len(slopes)} heads", x_title="head index",
                 y_title="slope m (score per token, log scale)", height=380)
    return legend_below(fig, y=-0.22, bottom=90)


def bias_heatmap(bias: np.ndarray, *, title: str) -> go.Figure:
    """bias [query, key] with -inf (masked) shown blank."""
    z = np.where(np.isfinite(bias), bias, np.nan)
    return heatmap(z, title=title, x_title="key position (tokens)", y_title="query position (tokens)",
                   colorscale="Blues_r", colorbar_title="bias",
                   hovertemplate="query %{y}<br>key %{x}<br>bias %{z:.4g}<extra></extra>", height=380)


def pattern_heatmap(pattern: np.ndarray, *, title: str) -> go.Figure:
    """Attention pattern [query, key], rows sum to 1."""
    return heatmap(pattern, title=title, x_title="key position (tokens)", y_title="query position (tokens)",
                   zmin=0, zmax=1, colorbar_title="weight",
                   hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.4f}<extra></extra>", height=380)


# a colour ramp per group of layers (light to dark with depth) and the dark tone of its theory lines
_RAMPS = (((59, 91, 219), (239, 51, 49)), ((12, 166, 120), (8, 80, 50)), ((247, 103, 7), (150, 50, 0)))
_GROUP_LINE = ("#364fc7", "#087f5b", "#d9480f")


def distance_profile(per_layer: np.ndarray, *, layers: Sequence[int], title: str, theory=None,
                     theory_name: str = "theory", baselines: Mapping[str, Sequence[float]] | None = None,
                     relative: Mapping[str, Sequence[float]] | None = None, groups: Sequence[str] | None = None,
                     curve_groups: Mapping[str, str] | None = None, log_y: bool = True,
                     distances=None) -> go.Figure:
    """Measured mean attention weight against distance, one line per layer, beside theory.

    per_layer: [layer, n_distances]. theory: [n_distances] attention weights on the same axis; baselines: {name:
    [n_distances]} position-free weights (dotted). relative: {name: [n_distances]} unitless curves (the RoPE bound
    over its value at 0) on a second y axis. groups: each layer's group (its mask and RoPE base): a group gets its
    own colour ramp; curve_groups: {baseline or bound name: group}, drawn in that group's dark tone.
    distances: the x of each column, default 0, 1, ... (query − key, keys back); signed distances (negative: keys
    after the query, for a bidirectional model) get a line at 0 and an axis title that says so.
    """
    per_layer = np.asarray(per_layer, dtype=float)
    x = np.arange(per_layer.shape[1]) if distances is None else np.asarray(distances)
    groups = list(groups) if groups is not None else [""] * len(per_layer)
    names = list(dict.fromkeys(groups))
    fig = make_subplots(specs=[[{"secondary_y": bool(relative)}]])
    for g, group in enumerate(names):
        members = [i for i, name in enumerate(groups) if name == group]
        (r0, g0, b0), (r1, g1, b1) = _RAMPS[g % len(_RAMPS)]
        for rank, i in enumerate(members):
            t = rank / max(len(members) - 1, 1)
            color = f"rgba({int(r0 + (r1 - r0) * t)}, {int(g0 + (g1 - g0) * t)}, {int(b0 + (b1 - b0) * t)}, 0.75)"
            label = f"layer {layers[i]}" + (f" ({group})" if len(names) > 1 else "")
            fig.add_trace(go.Scatter(x=x, y=np.where(per_layer[i] > 0, per_layer[i], np.nan), mode="lines",
                                     name=label, line=dict(color=color, width=1.3), legendgroup=f"layers{g}",
                                     showlegend=len(members) <= 8 or rank in (0, len(members) - 1),
                                     hovertemplate=f"{label}<br>distance %{{x}}<br>mean weight %{{y:.4g}}"
                                                   "<extra></extra>"))
    def tone(curve: str, default: str) -> str:
        group = (curve_groups or {}).get(curve)
        return _GROUP_LINE[names.index(group) % len(_GROUP_LINE)] if len(names) > 1 and group in names else default

    for name, curve in (baselines or {}).items():
        fig.add_trace(go.Scatter(x=x, y=np.where(np.asarray(curve) > 0, curve, np.nan), mode="lines", name=name,
                                 line=dict(color=tone(name, "#495057"), dash="dot", width=3.5)))
    if theory is not None:
        fig.add_trace(go.Scatter(x=x, y=theory, mode="lines", name=theory_name,
                                 line=dict(color="#212529", dash="dash", width=3)))
    for name, curve in (relative or {}).items():
        fig.add_trace(go.Scatter(x=x, y=curve, mode="lines", name=name,
                                 line=dict(color=tone(name, "#212529"), dash="dash", width=3)), secondary_y=True)
    if relative:
        fig.update_yaxes(title_text="RoFormer bound (1 at distance 0)", secondary_y=True, range=[0, 1.05],
                         tickformat=".1f", dtick=0.2, showgrid=False)
    if log_y:
        _log_ticks(fig, secondary_y=False)
    if (x < 0).any():
        fig.add_vline(x=0, line=dict(color="#adb5bd", width=1))
    apply_layout(fig, title=title, height=480,
                 x_title="query − key distance (tokens; < 0: key after the query, > 0: before it)" if (x < 0).any()
                 else "query − key distance (tokens)")
    fig.update_yaxes(title_text="mean attention weight (fraction of the row)", secondary_y=False)
    return legend_below(fig, y=-0.22, bottom=90)


def scheme_panels(distances, scores: Mapping[str, Sequence[float]],
                  weights: Mapping[str, Sequence[float]]) -> go.Figure:
    """The schemes against distance in one figure, one line per scheme and one legend: left their scores, right the
    attention weight of the last query after the softmax (log scale)."""
    layout = grid_layout(1, 2, ["Score against distance", "Attention of the last query against distance"],
                         horizontal_spacing=0.1)
    x = np.asarray(distances)
    traces = []
    for panel, (curves, suffix) in enumerate(((scores, ""), (weights, "2"))):
        for i, (name, y) in enumerate(curves.items()):
            traces.append(go.Scatter(x=x, y=np.asarray(y, dtype=float), mode="lines", name=name, legendgroup=name,
                                     showlegend=panel == 0, line=dict(color=PALETTE[i % len(PALETTE)]),
                                     xaxis=f"x{suffix}", yaxis=f"y{suffix}"))
        layout[f"xaxis{suffix}"]["title"] = dict(text="query − key distance (tokens)")
    layout["yaxis"]["title"] = dict(text="score q·k/√d (unitless)")
    layout["yaxis2"].update(title=dict(text="attention weight (fraction, log scale)"), type="log", dtick=1,
                            tickformat=".0e")
    return laid_out(traces, layout, height=440, margin=dict(t=60, b=100), legend=below_legend(y=-0.2))


def scheme_panels_instant(distances, scores_by_slope: Mapping[float, Mapping[str, Sequence[float]]],
                          weights_by_slope: Mapping[float, Mapping[str, Sequence[float]]], slope: float) -> go.Figure:
    """scheme_panels with an in-chart slider over the ALiBi slope: {slope: {scheme: scores}} and {slope: {scheme:
    attention weights}} (attnviz.positional.compare_schemes, softmax_over_distance). Drawn at `slope`."""
    slopes = list(scores_by_slope)
    return instant.slider_over(lambda s: scheme_panels(distances, scores_by_slope[s], weights_by_slope[s]), slopes,
                               slope, parameter="ALiBi slope m",
                               labels=[f"1/{1 / s:.4g}" if s < 1 else f"{s:.4g}" for s in slopes])
