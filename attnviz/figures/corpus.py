"""Figures for the Corpus page, drawn from a corpus run's own tables (attnviz.corpus.CorpusRun): a statistic's mean
over the run's windows for every head with its spread on hover, the statistic against window length, and two runs
compared head by head. Tables in, plotly out."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.colors
import plotly.graph_objects as go

from attnviz.figures import compare
from attnviz.figures.common import DIVERGING_SCALE, PALETTE, apply_layout, heatmap, legend_below

STAT_UNITS = {"entropy": "nats", "mean_distance": "tokens"}  # every other statistic is a share of attention
TEXT_IN_CELLS_UP_TO = (40, 16)  # (layers, heads): a grid this small writes mean ± spread in every cell
SPREAD = ("std", "q10", "q50", "q90")


def units(stat: str) -> str:
    return STAT_UNITS.get(stat, "share of attention")


def grid_arrays(summary: pd.DataFrame, stat: str, window: int) -> dict[str, np.ndarray]:
    """The summary rows of one window length as [layer, head] arrays: "mean" (the statistic), "std", "q10", "q50",
    "q90" and "n_windows", with "layers" and "heads" (their labels)."""
    rows = summary[summary["window"] == window]
    out = {}
    for name, column in (("mean", stat), *((s, f"{stat}_{s}") for s in SPREAD), ("n_windows", "n_windows")):
        table = rows.pivot(index="layer", columns="head", values=column).sort_index().sort_index(axis=1)
        out[name] = table.to_numpy(dtype=float)
    out["layers"], out["heads"] = np.asarray(table.index), np.asarray(table.columns)
    return out


def shown_value(stat: str, value: float) -> str:
    """A statistic's value as the page writes it: tokens to one decimal, the rest to three."""
    return f"{value:.1f}" if stat == "mean_distance" else f"{value:.3f}"


def _short(v: float) -> str:
    return "–" if not np.isfinite(v) else f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}"


def mean_grid(summary: pd.DataFrame, stat: str, window: int, *, title: str) -> go.Figure:
    """Each head's mean of `stat` over the windows of length `window` (summary: CorpusRun.summary()), one cell per
    head; the hover gives its spread over windows (std, 10th, 50th and 90th percentiles) and how many windows
    count, and a small grid writes "mean ± std" in each cell."""
    g = grid_arrays(summary, stat, window)
    mean = g["mean"]
    fig = heatmap(mean, x_labels=[str(h) for h in g["heads"]], y_labels=[str(x) for x in g["layers"]], title=title,
                  x_title="head (query head index)", y_title="layer (0 = nearest the input)",
                  colorbar_title=f"mean {stat} ({units(stat)})",
                  height=max(320, min(70 + 26 * mean.shape[0], 900)))
    custom = np.stack([g[s] for s in (*SPREAD, "n_windows")], axis=-1)  # [layer, head, 5]
    fig.update_traces(customdata=custom, hovertemplate=(
        "layer %{y}, head %{x}<br>mean %{z:.4g} " + units(stat) + "<br>std over windows %{customdata[0]:.4g}"
        "<br>10th / 50th / 90th percentile: %{customdata[1]:.3g} / %{customdata[2]:.3g} / %{customdata[3]:.3g}"
        "<br>%{customdata[4]:.0f} windows<extra></extra>"))
    if mean.shape[0] <= TEXT_IN_CELLS_UP_TO[0] and mean.shape[1] <= TEXT_IN_CELLS_UP_TO[1]:
        text = [[f"{_short(m)} ± {_short(s)}" for m, s in zip(mr, sr)] for mr, sr in zip(mean, g["std"])]
        fig.update_traces(text=text, texttemplate="%{text}", textfont=dict(size=10))
    return fig


def length_lines(table: pd.DataFrame, stat: str, *, title: str, by_depth: bool = False) -> go.Figure:
    """One line per row of `table` (rows: labels such as "layer 3" or "L3 H1"; columns: window lengths in tokens;
    values: the mean of `stat`) against window length. by_depth: the rows are layers in order, coloured from the
    first (dark) to the last (light)."""
    lengths = [int(c) for c in table.columns]
    colors = (plotly.colors.sample_colorscale("Viridis", list(np.linspace(0.0, 0.9, max(len(table), 2))))
              if by_depth else None)
    fig = go.Figure()
    for i, (label, values) in enumerate(table.iterrows()):
        color = colors[i] if colors else PALETTE[i % len(PALETTE)]
        fig.add_trace(go.Scatter(x=lengths, y=values.to_numpy(dtype=float), mode="lines+markers", name=str(label),
                                 line=dict(color=color, width=2), marker=dict(size=8),
                                 hovertemplate=f"{label}<br>window %{{x}} tokens<br>{stat} %{{y:.4g}}<extra></extra>"))
    apply_layout(fig, title=title, x_title="window length (tokens, log scale)",
                 y_title=f"mean {stat} ({units(stat)})", height=420)
    fig.update_xaxes(type="log", tickvals=lengths, ticktext=[str(n) for n in lengths])
    return legend_below(fig, y=-0.2, bottom=110) if len(table) > 1 else fig


def difference_grid(merged: pd.DataFrame, stat: str, *, title: str, a: str, b: str) -> go.Figure:
    """merged: CorpusRun.compare(other, stat) rows of one window length. Each head's mean of `stat` in run a minus
    run b, on a diverging scale centred on 0; the hover gives both means."""
    diff = merged.pivot(index="layer", columns="head", values=f"{stat}_diff").sort_index().sort_index(axis=1)
    both = [merged.pivot(index="layer", columns="head", values=f"{stat}_{s}").sort_index().sort_index(axis=1)
            for s in ("a", "b")]
    z = diff.to_numpy(dtype=float)
    top = float(np.nanmax(np.abs(z))) if np.isfinite(z).any() else 1.0
    fig = heatmap(z, x_labels=[str(h) for h in diff.columns], y_labels=[str(x) for x in diff.index], title=title,
                  x_title="head (query head index)", y_title="layer (0 = nearest the input)",
                  colorscale=DIVERGING_SCALE, zmin=-max(top, 1e-12), zmax=max(top, 1e-12),
                  colorbar_title=f"A − B ({units(stat)})", height=max(320, min(70 + 26 * z.shape[0], 900)))
    fig.update_traces(customdata=np.stack([t.to_numpy(dtype=float) for t in both], axis=-1), hovertemplate=(
        "layer %{y}, head %{x}<br>A − B = %{z:.4g}<br>" + f"A ({a}) " + "%{customdata[0]:.4g}<br>"
        + f"B ({b}) " + "%{customdata[1]:.4g}<extra></extra>"))
    return fig


def relative_depth(layers: Sequence[int], n_layers: int) -> list[float]:
    """layer / (n_layers - 1): 0 the first layer, 1 the last (attnviz.shape.ModelShape.relative_depth, from a run's
    manifest, with no model loaded)."""
    return [int(x) / max(n_layers - 1, 1) for x in layers]


def run_distributions(values: dict[str, Sequence[float]], stat: str, *, title: str) -> go.Figure:
    """One box per run of its heads' means of `stat` (attnviz.figures.compare.distributions), the x axis naming
    runs."""
    fig = compare.distributions(values, title=title, y_title=f"mean {stat} over the windows ({units(stat)})")
    fig.update_xaxes(title_text="run (how many heads)")
    return fig
