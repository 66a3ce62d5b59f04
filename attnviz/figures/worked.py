"""Figures of the worked-example page: small matrices as heatmaps with every number written in its cell."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.figures.common import ATTENTION_SCALE, DIVERGING_SCALE, MARGIN_RIGHT, apply_layout


def _cell_text(z: np.ndarray, digits: int) -> list[list[str]]:
    return [["−∞" if np.isneginf(x) else f"{x:.{digits}f}" for x in row] for row in z]


def scores_and_pattern_figure(masked_scores: np.ndarray, pattern: np.ndarray, *, scale_text: str,
                              query_labels: Sequence[str] | None = None, key_labels: Sequence[str] | None = None,
                              digits: int = 3) -> go.Figure:
    """Left: the scores after scaling and masking [n_query, n_key] (masked cells read −∞); right: the pattern
    after the row-wise softmax, each row summing to 1."""
    n_q, n_k = pattern.shape
    x = list(key_labels or [f"k{j + 1}" for j in range(n_k)])
    y = list(query_labels or [f"q{i + 1}" for i in range(n_q)])
    finite = np.where(np.isfinite(masked_scores), masked_scores, np.nan)
    bound = float(np.nanmax(np.abs(finite))) if np.isfinite(finite).any() else 1.0
    spacing = 0.12
    fig = make_subplots(rows=1, cols=2, subplot_titles=[f"scores {scale_text}", "pattern = row-wise softmax"],
                        horizontal_spacing=spacing)
    # Each colour bar lies flat under its own map, as wide as the map: standing beside the left map, in the gap
    # between the two, it ran over the right map's title and axis in a narrow window.
    height, top, bottom = 245 + 45 * n_q, 50, 165
    below = -85 / (height - top - bottom)  # paper units: 85 px under the maps, past the axis titles
    half = (1 - spacing) / 2
    bar = dict(orientation="h", len=half, lenmode="fraction", thickness=12, y=below, yanchor="top",
               xanchor="center", title=dict(side="top"))
    fig.add_trace(go.Heatmap(z=finite, x=x, y=y, colorscale=DIVERGING_SCALE, zmin=-bound or -1, zmax=bound or 1,
                             text=_cell_text(masked_scores, digits), texttemplate="%{text}",
                             colorbar={**bar, "x": half / 2, "title": dict(text="score (nats)", side="top")},
                             hovertemplate="%{y}, %{x}: %{text}<extra>score</extra>"), row=1, col=1)
    fig.add_trace(go.Heatmap(z=pattern, x=x, y=y, colorscale=ATTENTION_SCALE, zmin=0, zmax=1,
                             text=_cell_text(pattern, digits), texttemplate="%{text}",
                             colorbar={**bar, "x": 1 - half / 2, "title": dict(text="weight (0 to 1)", side="top")},
                             hovertemplate="%{y}, %{x}: %{text}<extra>weight</extra>"), row=1, col=2)
    for col in (1, 2):
        fig.update_xaxes(title_text="key (row of K)", side="bottom", row=1, col=col)
        fig.update_yaxes(title_text="query (row of Q)", autorange="reversed", row=1, col=col)
    fig = apply_layout(fig, height=height)
    fig.update_layout(margin=dict(t=top, b=bottom, r=MARGIN_RIGHT))  # no bar on the right
    return fig
