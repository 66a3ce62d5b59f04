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


CSS_CLASS = "attnviz-text"
STYLE = (f"<style>.{CSS_CLASS}{{font-family:ui-monospace,monospace;font-size:0.85rem;line-height:1.7;"
         "white-space:pre-wrap;word-break:break-word;max-height:420px;overflow-y:auto}"
         f".{CSS_CLASS} span{{padding:1px 0;border-radius:2px}}.{CSS_CLASS} .unseen{{color:#aaa}}</style>")


def _span(i: int, token: str, value: float, level: float, label: str, fmt: str, selected: bool) -> str:
    """One visible token: shaded by level in [0, 1] (unshaded where NaN), its title "i: token — label value"."""
    tip = html.escape(f"{i}: {token}", quote=True)
    style = ""
    if np.isnan(value):
        tip += f" — {html.escape(label)}: none"
    else:
        tip += f" — {html.escape(label)} {value:{fmt}}"
        if f"{level:.3f}" != "0.000":  # an unshaded span carries no style: less for the browser to parse
            style = f"background:rgba({SHADE[0]},{SHADE[1]},{SHADE[2]},{level:.3f});"
            style += "color:white;" if level > 0.55 else ""
    style += f"outline:2px solid {HIGHLIGHT};" if selected else ""
    return f'<span title="{tip}"' + (f' style="{style}"' if style else "") + f">{_token_html(token)}</span>"


def shaded_text(tokens: Sequence[str], values: np.ndarray, *, selected: int | None = None,
                visible: int | None = None, label: str = "weight", vmax: float | None = None,
                fmt: str = ".4f") -> str:
    """HTML of the text with token i shaded by values[i] (relative to the largest value, or vmax).

    selected: the token outlined (the query). visible: tokens from this position on are drawn faint and unshaded
    (a causal query cannot see them), as one span titled with their positions: a query early in a long text sends
    and sanitises one element for the rest of the text, not one per token. NaN values (a row blanked with the sink
    hidden) are unshaded. Each visible token's title reads "position: token — label value"."""
    values = np.asarray(values, dtype=np.float64)
    n = len(tokens)
    if values.shape != (n,):
        raise ValueError(f"values must have one entry per token ({n}), not shape {values.shape}")
    shown = n if visible is None else min(max(int(visible), 0), n)
    level = shade_levels(values[:shown], vmax=vmax)
    spans = [_span(i, tokens[i], values[i], level[i], label, fmt, i == selected) for i in range(shown)]
    if shown < n:
        tip = f"tokens {shown:,}–{n - 1:,}: not visible to the query" if shown < n - 1 else \
            f"token {shown:,}: not visible to the query"
        spans.append(f'<span class="unseen" title="{tip}">' + "".join(_token_html(t) for t in tokens[shown:])
                     + "</span>")
    return f'{STYLE}<div class="{CSS_CLASS}">{"".join(spans)}</div>'


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
