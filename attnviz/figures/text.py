"""The text-centred view (bertviz's line view, CircuitsVis' coloured tokens): the text itself, each token shaded by a
value (the weight one query gives it, a token's loss), as HTML spans.

A text of 1,000+ tokens stays readable (it wraps like prose) where a heatmap sent as an image gives positions only;
every span's tooltip names its position, its token and its value. Token strings are HTML-escaped: the text is the
user's, and nothing in it may become markup. numpy in, a string of HTML out; no streamlit.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np

SHADE = (68, 1, 84)  # the dark end of Viridis, the maps' colour for weight 0, used here as ink for weight 1
HIGHLIGHT = "#f5b700"  # the outline of the selected query token


def shade_levels(values: np.ndarray, *, vmax: float | None = None) -> np.ndarray:
    """[n] -> [n] in [0, 1]: each value over vmax (default: the largest finite value), NaN staying NaN. A shade is
    relative to the row's largest weight, so a row spread as ~1/n over 1,000 keys is still visible."""
    v = np.asarray(values, dtype=np.float64)
    top = float(np.nanmax(v)) if vmax is None and np.isfinite(v).any() else (vmax or 0.0)
    if top <= 0:
        return np.where(np.isnan(v), np.nan, 0.0)
    return np.clip(v / top, 0.0, 1.0)


def _token_html(token: str) -> str:
    """A readable token (capture.readable_tokens: ␣ space, ↵ newline, ⇥ tab) as the text it stands for."""
    shown = html.escape(token.replace("␣", " ").replace("⇥", "\t"))
    return shown.replace("↵", "↵<br>")


def shaded_text(tokens: Sequence[str], values: np.ndarray, *, selected: int | None = None,
                visible: int | None = None, label: str = "weight", vmax: float | None = None,
                fmt: str = ".4f") -> str:
    """HTML of the text with token i shaded by values[i] (relative to the largest value, or vmax).

    selected: the token outlined (the query). visible: tokens from this position on are drawn faint and unshaded
    (a causal query cannot see them). NaN values (a row blanked with the sink hidden) are unshaded. Each span's
    title reads "position: token — label value"."""
    values = np.asarray(values, dtype=np.float64)
    n = len(tokens)
    if values.shape != (n,):
        raise ValueError(f"values must have one entry per token ({n}), not shape {values.shape}")
    level = shade_levels(values[:visible] if visible is not None else values, vmax=vmax)
    spans = []
    for i, token in enumerate(tokens):
        tip = html.escape(f"{i}: {token}", quote=True)
        style = "padding:1px 0;border-radius:2px;"
        if visible is not None and i >= visible:
            style += "color:#aaa;"
            tip += " — not visible to the query"
        elif np.isnan(values[i]):
            tip += f" — {html.escape(label)}: none"
        else:
            alpha = float(level[i])
            style += f"background:rgba({SHADE[0]},{SHADE[1]},{SHADE[2]},{alpha:.3f});"
            if alpha > 0.55:
                style += "color:white;"
            tip += f" — {html.escape(label)} {values[i]:{fmt}}"
        if i == selected:
            style += f"outline:2px solid {HIGHLIGHT};"
        spans.append(f'<span title="{tip}" style="{style}">{_token_html(token)}</span>')
    body = "".join(spans)
    return ('<div style="font-family:ui-monospace,monospace;font-size:0.85rem;line-height:1.7;'
            f'white-space:pre-wrap;word-break:break-word;max-height:420px;overflow-y:auto">{body}</div>')


def loss_chart(losses: np.ndarray, tokens: Sequence[str], *, title: str):
    """losses [n - 1]: the loss in nats of each token after the first (attnviz.lm.token_losses), over the position
    of the token predicted, with the token in the hover."""
    from attnviz.figures.common import line_chart

    positions = np.arange(1, len(losses) + 1)
    fig = line_chart(positions, {"loss": losses}, title=title, x_title="position of the predicted token",
                     y_title="loss (nats)", height=300)
    fig.update_traces(customdata=[tokens[i] for i in positions],
                      hovertemplate="token %{x}: %{customdata}<br>loss %{y:.2f} nats<extra></extra>",
                      mode="lines+markers" if len(losses) <= 200 else "lines")
    fig.update_layout(showlegend=False)
    return fig
