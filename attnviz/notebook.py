"""Notebook views of a capture: the grid of all heads, one head, where a token looks, the text shaded by weight.

Each view is a View: its _repr_html_ is self-contained, so it draws in JupyterLab 4, VS Code and classic Jupyter with
no network. plotly's JavaScript is inlined once per output (plotly.offline.get_plotlyjs(); its bundle sets
window.Plotly itself and calls neither define nor require, so classic Jupyter's require.js does not take it over),
and nothing is loaded from a CDN. View.to_html(path) writes the same view as a standalone page;
AttentionCapture.to_html(path) (page_view) writes all four views on one page. View.save(path) writes .html, or its
charts as .svg, .pdf or .png for a paper (attnviz.export: plotly's exporter in the print style).

    grid_view(cap)                    the grid of all heads                 cap.show()
    head_view(cap, layer, head)       one head (overview + zoom when long)  cap.head_view(layer, head)
    token_view(cap, query)            where one query looks, head by head   cap.token_view(query)
    text_view(cap, layer, head, q)    the text shaded by that head's row    cap.text_view(layer, head, q)

Long texts are drawn as the Heads page draws them: above FULL_MAP_MAX_TOKENS tokens, or in the long-text ("qk")
store, one head is a max-pooled overview (attnviz.views.pooled_heads, or figures.heads.max_pool of the dense map)
plus a window of exact weights at full resolution (the zoom), and the grid is pooled block by block from q and k.
The figures are attnviz.figures' own; this module only picks the data and lays them out. No streamlit.
"""

from __future__ import annotations

import html
import os
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from attnviz import views
from attnviz.errors import CaptureError
from attnviz.pooling import MIN_REMAINING

try:  # the figures draw with plotly, which the library alone does not install
    from attnviz import export
    from attnviz.figures import heads as figs
    from attnviz.figures import text as text_figs
except ImportError as exc:
    raise ImportError(f"attnviz's notebook views need plotly ({exc}): pip install 'attnviz[app]'") from exc

OVERVIEW, FULL_MAP_MAX_TOKENS = views.OVERVIEW, views.FULL_MAP_MAX_TOKENS  # as on the Heads page
ZOOM_SIZE = 64  # tokens per side of the zoom window, the Heads page's default


class View:
    """One or more charts and notes that draw without a network: a notebook shows its _repr_html_, to_html(path)
    writes it as a page. parts: plotly figures and HTML strings (already escaped), in order."""

    def __init__(self, title: str, parts: Sequence):
        self.title = title
        self.parts = list(parts)

    @property
    def figures(self) -> list:
        """The plotly figures of the view, in order."""
        return [p for p in self.parts if not isinstance(p, str)]

    def __repr__(self) -> str:
        return f"<attnviz View: {self.title} ({len(self.figures)} charts)>"

    def html(self) -> str:
        """The view as an HTML fragment: plotly's JavaScript inlined once (when there is a chart), then each part.
        Every chart gets a fresh element id, so the same view shown twice on one page draws twice."""
        out = ['<div class="attnviz-view" style="font-family:system-ui,sans-serif;max-width:1200px">']
        if self.figures:
            from plotly.offline import get_plotlyjs

            out.append(f'<script type="text/javascript">{get_plotlyjs()}</script>')
        for part in self.parts:
            out.append(part if isinstance(part, str) else _figure_html(part))
        out.append("</div>")
        return "\n".join(out)

    def _repr_html_(self) -> str:
        return self.html()

    def to_html(self, path) -> Path:
        """Writes the view as a standalone page (UTF-8, everything inline) and returns its path."""
        path = Path(os.fspath(path))
        page = ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                f"<title>{html.escape(self.title)}</title></head>\n<body>\n{self.html()}\n</body></html>\n")
        path.write_text(page, encoding="utf-8")
        return path

    def save(self, path, *, print_style: bool = True) -> list[Path]:
        """Writes the view in the format its suffix names and returns the files written: .html, the page (to_html);
        .svg, .pdf or .png, each chart drawn by plotly's exporter (attnviz.export: Chromium, in the print style
        unless print_style=False, a PNG at 300 dpi), the first at `path` and the next at <name>-2<suffix>, ...
        Notes are left out of those. Another suffix, a view without charts, or no browser: ExportError."""
        path = Path(os.fspath(path))
        fmt = export.format_of(path)
        if fmt == "html":
            return [self.to_html(path)]
        if not self.figures:
            raise export.ExportError(f"{self.title} has no chart to draw as {fmt.upper()}: save it as .html.")
        if export.unavailable():
            raise export.ExportError(export.NO_BROWSER)
        paths = [path] + [path.with_name(f"{path.stem}-{i}{path.suffix}") for i in range(2, len(self.figures) + 1)]
        return [export.write_figure(fig, target, styled=print_style) for fig, target in zip(self.figures, paths)]


def _figure_html(fig) -> str:
    """One plotly figure as a div and the script that draws it into that div (no plotly.js: View.html has it)."""
    height = fig.layout.height or 450
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"attnviz-{uuid.uuid4().hex}",
                       default_width="100%", default_height=f"{height}px", config={"displaylogo": False})


def _note(text: str) -> str:
    return f'<p style="font-size:0.9rem;color:#555;margin:0.2rem 0 1rem">{html.escape(text)}</p>'


def _heading(text: str) -> str:
    return f'<h3 style="margin:1.2rem 0 0.4rem">{html.escape(text)}</h3>'


# -- what is drawn, in both stores --
def _check(cap, layer: int | None = None, head: int | None = None, query: int | None = None) -> int | None:
    """Refuses a capture with no maps and a head or query out of range; returns the layer (None: the first)."""
    if cap.pattern is None and not cap.inputs:
        raise CaptureError("This capture kept neither the pattern nor q and k (keep_inputs=False): it has no maps.")
    if head is not None and not 0 <= int(head) < cap.n_heads:
        raise CaptureError(f"Head {head} does not exist: the capture has heads 0 to {cap.n_heads - 1}.")
    if query is not None and not 0 <= int(query) < cap.n_tokens:
        raise CaptureError(f"Query {query} does not exist: the text has tokens 0 to {cap.n_tokens - 1}.")
    layer = cap.layers[0] if layer is None else int(layer)
    cap.index_of(layer)  # refuses a layer that was not captured
    return layer


def is_long(cap) -> bool:
    """Whether one head is drawn as an overview plus a zoom window: the qk store, or more than
    FULL_MAP_MAX_TOKENS tokens (the Heads page's rule)."""
    return cap.pattern is None or cap.n_tokens > FULL_MAP_MAX_TOKENS


def default_gamma(cap) -> float:
    """0.5 from figures.heads.BOOST_FROM_TOKENS tokens on (most weights are near 1/n, near black), else 1: the
    Heads page's default for Boost small weights."""
    return 0.5 if cap.n_tokens >= figs.BOOST_FROM_TOKENS else 1.0


def overview(cap, layer: int, head: int, *, hide_sink: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """(one head max-pooled to at most OVERVIEW pixels [m, m], the weight each row keeps off token 0 [query] or
    None): from the dense map, else a block of rows at a time from q and k with the same block edges."""
    if cap.pattern is not None:
        p = cap.head_pattern(layer, head)
        return (figs.max_pool(views.sink_hidden(p) if hide_sink else p, OVERVIEW),
                views.mass_off_sink(p) if hide_sink else None)
    x = cap.inputs[layer]
    return (views.pooled_heads(x, OVERVIEW, hide_sink=hide_sink, heads=[head])[0],
            views.mass_off_sink(x, head) if hide_sink else None)


def zoom_window(cap, layer: int, head: int, rows: tuple[int, int], keys: tuple[int, int], *,
                hide_sink: bool = False) -> np.ndarray:
    """One head's exact weights [rows, keys]: the rows read (or computed from q and k) whole, the sink hidden over
    each whole row, as on the full map, then the keys cut."""
    p = cap.head_pattern(layer, head, rows=rows)
    return (views.sink_hidden(p) if hide_sink else p)[:, keys[0]:keys[1]]


def zoom_start(n: int, size: int, window: tuple[int, int] | None) -> tuple[int, int]:
    """(first query, first key) of the zoom window: `window` kept inside the text, or by default the last queries
    and the keys on their diagonal (the Heads page's default)."""
    span = max(0, n - size)
    if window is None:
        return span, span
    return min(max(0, int(window[0])), span), min(max(0, int(window[1])), span)


def query_rows(cap, layers: Sequence[int], query: int, *, hide_sink: bool = False) -> np.ndarray:
    """[layer x head, key]: every head of `layers` (model layer numbers) from one query, in either store."""
    rows = np.concatenate([cap.layer_rows(layer, query, query + 1)[:, 0] for layer in layers])
    return views.sink_hidden(rows) if hide_sink else rows


def _sink_note(cap) -> str:
    return (f"With the sink hidden, token 0's weight is removed and each row is rescaled to sum to 1, except rows "
            f"that had under {MIN_REMAINING:.0%} of their weight off token 0: they are grey"
            + (" (row 0 always: in a causal model query 0 sees only token 0)." if cap.causal else "."))


# -- the views --
def grid_view(cap, *, hide_sink: bool = False, gamma: float = 0.5) -> View:
    """Every captured head at a glance (figures.heads.head_grid): a layer x head mosaic, each map max-pooled to
    GRID_TILE pixels; in the qk store each layer is pooled from q and k a block of rows at a time."""
    _check(cap)
    tile = figs.GRID_TILE
    if cap.pattern is None:
        pooled = np.stack([views.pooled_heads(cap.inputs[layer], tile, hide_sink=hide_sink) for layer in cap.layers])
        fig = figs.head_grid(pooled, cap.layers, gamma=gamma, tile=tile, causal=cap.causal, n_tokens=cap.n_tokens)
    else:
        fig = figs.head_grid(cap.pattern, cap.layers, gamma=gamma, tile=tile, causal=cap.causal,
                             layer_map=views.sink_hidden if hide_sink else None)
    note = (f"Each small map is one head (query down, key across, max-pooled to {tile} px). A bright left column is "
            "a sink; a bright diagonal is a self head; a stripe just below it is a previous-token head."
            + (" Grey blocks lie wholly above the diagonal: a causal query cannot see later keys." if cap.causal
               else ""))
    return View(f"{cap.model_name}: all heads", [fig, _note(note)] + ([_note(_sink_note(cap))] if hide_sink else []))


def head_view(cap, layer: int | None = None, head: int = 0, *, hide_sink: bool = False, gamma: float | None = None,
         window: tuple[int, int] | None = None, size: int = ZOOM_SIZE) -> View:
    """One head's map (figures.heads.head_detail); for a long capture (is_long) its max-pooled overview and a
    zoom window of exact weights, size x size tokens from window = (first query, first key) (default: the last
    queries). With hide_sink, also what each row keeps off token 0 (figures.heads.remaining_mass)."""
    layer = _check(cap, layer, head)
    gamma = default_gamma(cap) if gamma is None else gamma
    name, n = f"Layer {layer}, head {head}", cap.n_tokens
    if not is_long(cap):
        p = cap.head_pattern(layer, head)
        kept = views.mass_off_sink(p) if hide_sink else None
        parts = [figs.head_detail(views.sink_hidden(p) if hide_sink else p, cap.tokens, gamma=gamma,
                                  causal=cap.causal,
                                  title=f"{name}: attention weights (reads KV head {cap.kv_head_of[head]})"),
                 _note("Row = the query token, column = the key it attends to; each row sums to 1.")]
    else:
        pooled, kept = overview(cap, layer, head, hide_sink=hide_sink)
        m = pooled.shape[-1]
        q0, k0 = zoom_start(n, size, window)
        w = zoom_window(cap, layer, head, (q0, min(n, q0 + size)), (k0, min(n, k0 + size)), hide_sink=hide_sink)
        parts = [figs.pooled_overview(pooled, n, gamma=gamma, causal=cap.causal,
                                      title=f"{name}: every {n:,} x {n:,} weight, max-pooled to {m} px"),
                 _note(f"Each pixel is the largest weight in a block of about {n / m:.0f} x {n / m:.0f} query x key "
                       "tokens, so a one-token stripe (the diagonal, a sink column) survives. Below, a window at full "
                       "resolution: head_view(..., window=(first query, first key)) moves it."),
                 figs.window_detail(w, cap.tokens, q0, k0, gamma=gamma, causal_offset=0 if cap.causal else None,
                                    title=f"{name}: queries {q0:,}–{q0 + w.shape[0] - 1:,}, "
                                          f"keys {k0:,}–{k0 + w.shape[1] - 1:,}")]
    if hide_sink:
        parts += [_note(_sink_note(cap)),
                  figs.remaining_mass(kept, title=f"{name}: what is left off the sink, row by row")]
    return View(f"{cap.model_name}: {name}", parts)


def token_view(cap, query: int | None = None, *, layers: Sequence[int] | None = None, hide_sink: bool = False,
          gamma: float | None = None) -> View:
    """Where one query token (default: the last) looks, one row per head of `layers` (model layer numbers;
    default: every captured layer), over the keys it can see (figures.heads.token_looks)."""
    query = cap.n_tokens - 1 if query is None else int(query)
    _check(cap, query=query)
    layers = list(cap.layers) if layers is None else [int(x) for x in layers]
    for layer in layers:
        cap.index_of(layer)
    gamma = default_gamma(cap) if gamma is None else gamma
    rows = query_rows(cap, layers, query, hide_sink=hide_sink)
    keys = query + 1 if cap.causal else cap.n_tokens
    labels = [f"L{layer} H{h}" for layer in layers for h in range(cap.n_heads)]
    fig = figs.token_looks(rows[:, :keys], cap.tokens, labels, query, gamma=gamma)
    note = "One row per head: how the query token splits its attention over the keys it can see."
    return View(f"{cap.model_name}: where token {query} looks", [fig, _note(note)])


def text_view(cap, layer: int | None = None, head: int = 0, query: int | None = None, *,
         hide_sink: bool = False) -> View:
    """The text with each token shaded by the weight `query` (default: the last token) of (layer, head) gives it,
    relative to the row's largest weight (figures.text.shaded_text); hover a token for its exact weight."""
    query = cap.n_tokens - 1 if query is None else int(query)
    layer = _check(cap, layer, head, query)
    weights = query_rows(cap, [layer], query, hide_sink=hide_sink)[head]
    body = text_figs.shaded_text(cap.tokens, weights, selected=query, visible=query + 1 if cap.causal else None,
                                 label=f"weight from token {query}")
    name = f"The text as token {query} of layer {layer}, head {head} reads it"
    note = ("Each token is shaded by the weight this query gives it, relative to the row's largest weight; hover a "
            "token for its position and exact weight." + (" Later tokens are faint: a causal query cannot see them."
                                                           if cap.causal else ""))
    return View(f"{cap.model_name}: {name}", [_heading(name), body, _note(note)])


def page_view(cap, layer: int | None = None, head: int = 0, query: int | None = None, *,
         hide_sink: bool = False) -> View:
    """All four views of one capture on one page: the grid, one head, where `query` looks in that head's layer,
    and the text as that head reads it (plotly's JavaScript once for the page)."""
    layer = _check(cap, layer, head, query)
    n = cap.n_tokens
    intro = (f"{cap.model_name}: {n:,} tokens, layers {cap.layers[0]}–{cap.layers[-1]}, {cap.n_heads} heads, "
             f"{cap.store} store.")
    parts = [f"<h2>{html.escape(cap.model_name)}: attention</h2>", _note(intro)]
    parts += [_heading("All heads")] + grid_view(cap, hide_sink=hide_sink).parts
    parts += [_heading(f"Layer {layer}, head {head}")] + head_view(cap, layer, head, hide_sink=hide_sink).parts
    parts += [_heading("Where a token looks")] + token_view(cap, query, layers=[layer], hide_sink=hide_sink).parts
    parts += text_view(cap, layer, head, query, hide_sink=hide_sink).parts
    return View(f"{cap.model_name}: attention", parts)
