"""Figures as files for papers: SVG, PDF and PNG through plotly's own exporter (kaleido), and a print style.

kaleido draws a figure in a headless Chromium. attnviz gives it Debian's chromium (`apt-get install chromium`, which
`scripts/setup.sh --dev` installs), or the program BROWSER_PATH names; it never downloads a browser. One Chromium
is started on the first export and serves every later one (and every thread) until the process ends. Without a
browser the vector and raster formats raise ExportError with NO_BROWSER; `unavailable()` says so beforehand.

The print style (`print_style`, the default for files) lays a figure out at a print width (one column of a
two-column paper, 3.3 inches; both columns, 7 inches, for a figure of several panels) with a white background,
fonts legible at that size and colour-blind-safe colours; a PNG is drawn at 300 dpi (scale 300/96 of that layout).
Pure plotly: no streamlit.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import json
import os
import re
import shutil
import textwrap
import threading
from pathlib import Path

import numpy as np
import plotly.colors
import plotly.graph_objects as go

from attnviz.errors import AttnvizError
from attnviz.figures.common import PALETTE

FORMATS = {"svg": "image/svg+xml", "pdf": "application/pdf", "png": "image/png"}  # suffix -> MIME type
CSS_DPI = 96  # plotly lays a figure out in CSS pixels, 96 to the inch
PNG_DPI = 300
PNG_SCALE = PNG_DPI / CSS_DPI
COLUMN_INCHES = 3.3  # one column of a two-column paper
PAGE_INCHES = 7.0  # both columns: a figure of several panels, or one not in the print style
SCREEN_WIDTH = 700  # about the width a page draws a chart at, in CSS pixels: heights scale from it
FONT_PX, TICK_PX, TITLE_PX = 10, 9, 11  # 7.5, 6.8 and 8.3 points on paper
# DejaVu Sans draws the readable tokens' marks (␣ ↵ ⇥) itself: with a font that lacks them, plotly measures tick
# labels in one font and Chromium draws them with another, and a label runs into its axis title
FONT_FAMILY = "'DejaVu Sans', Verdana, sans-serif"
SEQUENTIAL_SCALE = "Viridis"
# Okabe and Ito's colour-blind-safe palette, taking the place of attnviz.figures.common.PALETTE's colours in turn
OKABE_ITO = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#56B4E9", "#E69F00", "#F0E442", "#000000")
RENDER_TIMEOUT_S = 60  # one figure; a Chromium that takes longer is closed and started again on the next export

NO_BROWSER = ("Figure files need Chromium, which this machine does not have (apt-get install chromium); "
              "the data exports still work.")


class ExportError(AttnvizError, ValueError):
    """A figure that cannot be written: an unknown suffix, no browser, or a drawing that failed."""


def browser_path() -> str | None:
    """The browser kaleido drives: BROWSER_PATH when it names a program, else Debian's chromium on PATH; None
    when there is neither (never a downloaded one)."""
    named = os.environ.get("BROWSER_PATH", "").strip()
    if named and os.path.isfile(named) and os.access(named, os.X_OK):
        return named
    return shutil.which("chromium") or shutil.which("chromium-browser")


def unavailable() -> str | None:
    """Why figures cannot be drawn as files here (NO_BROWSER), or None when they can."""
    return None if browser_path() else NO_BROWSER


def format_of(path) -> str:
    """The file format a path's suffix names ("svg", "pdf", "png", "html"); ExportError for any other."""
    fmt = Path(os.fspath(path)).suffix.lower().lstrip(".")
    if fmt not in (*FORMATS, "html"):
        raise ExportError(f"Cannot save as {Path(os.fspath(path)).suffix or 'a file with no suffix'}: "
                          "use .html, .svg, .pdf or .png.")
    return fmt


def file_stem(fig: go.Figure, fallback: str = "figure") -> str:
    """A file name (no suffix) from the figure's title, else from `fallback`: lower case words joined by -."""
    text = re.sub(r"<[^>]*>", " ", fig.layout.title.text or fallback)
    words = re.findall(r"[a-z0-9]+", text.lower())
    stem = "-".join(words)[:60].rstrip("-")
    return stem or "figure"


def figure_digest(fig: go.Figure) -> str:
    """A digest of everything the figure draws (its JSON with sorted keys): equal for a copy, for a cache key."""
    from plotly.utils import PlotlyJSONEncoder

    text = json.dumps(fig.to_plotly_json(), cls=PlotlyJSONEncoder, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


# -- the print style --
def print_size(fig: go.Figure, *, styled: bool = True) -> tuple[float, float]:
    """(width, height) in CSS pixels of the figure on paper: one column (COLUMN_INCHES), or both (PAGE_INCHES) for
    several panels or without the print style; the height keeps the screen's aspect (its height over SCREEN_WIDTH),
    at least the width for one map, 3/4 of it for one chart, 1/2 for several panels; both rounded so that a 300 dpi
    PNG has whole pixels."""
    panels = sum(1 for _ in fig.select_xaxes())
    inches = COLUMN_INCHES if styled and panels <= 1 else PAGE_INCHES
    width = round(inches * PNG_DPI) / PNG_SCALE
    maps = any(trace.type in ("heatmap", "image") for trace in fig.data)
    aspect = 0.5 if panels > 1 else 1.0 if maps else 0.75  # one map is square
    height = max((fig.layout.height or 450) * width / SCREEN_WIDTH, aspect * width)
    dots = round(height * PNG_SCALE)
    return width, dots / PNG_SCALE


def print_style(fig: go.Figure, *, size: tuple[float, float] | None = None) -> go.Figure:
    """A copy of `fig` for paper: white background, black text in FONT_PX-pixel type (TICK_PX ticks, TITLE_PX
    titles, wrapped to the width of `size`, default print_size's), slim colour bars, margins that grow to fit their
    labels (axis titles kept), Okabe-Ito colours for the figures' palette, and Viridis for every sequential continuous
    colour scale (a diverging scale, a stepped one or an image's pixels are left as they are)."""
    out = go.Figure(fig)
    width, height = print_size(out) if size is None else size
    title = out.layout.title.text
    lines = _wrapped(title, width) if title else []
    # plotly puts a title's first line at its y and each further line 1.3 em below; anchored at the bottom, the first
    # line's baseline, as every SVG reader draws it (the em shift of a top anchor is lost on a title of several lines)
    baseline = 6 + 0.9 * TITLE_PX
    title_px = int(baseline + TITLE_PX * (1.3 * (len(lines) - 1) + 0.3)) + 6 if lines else 0
    top = max(8, title_px) + (int(1.6 * TITLE_PX) if _panel_titles(out) else 0)
    out.update_layout(
        template="plotly_white", paper_bgcolor="white", plot_bgcolor=fig.layout.plot_bgcolor or "white",
        font=dict(family=FONT_FAMILY, size=FONT_PX, color="black"),
        margin=dict(l=8, r=8, b=8, t=top, autoexpand=True),
        legend=dict(font=dict(size=TICK_PX)),
    )
    if lines:
        out.update_layout(title=dict(text="<br>".join(lines), font=dict(size=TITLE_PX), x=0.0, xanchor="left",
                                     xref="container", y=1 - baseline / height, yanchor="bottom",
                                     yref="container", automargin=False, pad=dict(l=6, b=0)))
    axes = dict(automargin=True, title_font=dict(size=FONT_PX), tickfont=dict(size=TICK_PX), linecolor="black",
                gridcolor="#e5e5e5", zerolinecolor="#bdbdbd", ticklabeloverflow="allow")
    out.update_xaxes(**axes)
    out.update_yaxes(**axes)
    for note in out.layout.annotations:  # subplot titles are drawn at 16 px
        note.font.size = min(note.font.size or FONT_PX, TITLE_PX)
    bar = dict(thickness=10, outlinewidth=0, tickfont=dict(size=TICK_PX), title=dict(font=dict(size=FONT_PX)))
    for holder in _colour_holders(out):
        if "colorbar" in holder and _draws_scale(holder):  # a colour bar set on a plain marker would be drawn
            holder.colorbar.update(bar)
    _recolour(out)
    return out


def _panel_titles(fig: go.Figure) -> bool:
    """Whether annotations stand above the plot area (subplot titles): the top margin holds them."""
    return any(note.yref == "paper" and (note.y or 0) >= 1 for note in fig.layout.annotations)


def _wrapped(text: str, width: float) -> list[str]:
    """A plain title cut into lines that fit `width` pixels at TITLE_PX (about 0.62 em a character in DejaVu Sans);
    a title with markup is left whole."""
    if "<" in text:
        return [text]
    return textwrap.wrap(text, max(12, int((width - 16) / (TITLE_PX * 0.62)))) or [text]


_SCALE_TRACES = ("heatmap", "contour", "histogram2d", "histogram2dcontour", "surface")


def _draws_scale(holder) -> bool:
    """Whether a holder of _colour_holders draws a colour bar: showscale where it is set, else the traces that
    draw one by default (heatmaps, contours) and the layout's colour axes; a marker or line does not."""
    shows = holder.showscale if "showscale" in holder else None
    if shows is not None:
        return bool(shows)
    return getattr(holder, "type", None) in _SCALE_TRACES or holder.plotly_name.startswith("coloraxis")


def _colour_holders(fig: go.Figure) -> list:
    """Everything that carries a colour scale: traces, their markers and lines, the layout's colour axes."""
    holders = []
    for trace in fig.data:
        holders.append(trace)
        for part in ("marker", "line"):
            if part in trace and trace[part] is not None:
                holders.append(trace[part])
    holders += [fig.layout[name] for name in fig.layout if name.startswith("coloraxis")]
    return holders


def _recolour(fig: go.Figure) -> None:
    swap = {colour.lower(): OKABE_ITO[i % len(OKABE_ITO)] for i, colour in enumerate(PALETTE)}
    for trace in fig.data:
        for part in ("marker", "line"):
            holder = trace[part] if part in trace else None
            if holder is not None and "color" in holder and isinstance(holder.color, str):
                holder.color = swap.get(holder.color.lower(), holder.color)
    if any(trace.type == "image" for trace in fig.data) or fig.layout.images:  # pixels and colour bar keep one scale
        return
    fig.update_layout(colorscale=dict(sequential=SEQUENTIAL_SCALE))
    for holder in _colour_holders(fig):
        if "colorscale" not in holder or holder.colorscale is None:
            continue
        trend = scale_trend(holder.colorscale)
        if trend:
            holder.colorscale = SEQUENTIAL_SCALE if trend > 0 else SEQUENTIAL_SCALE + "_r"


def scale_trend(colorscale) -> int:
    """+1 when a continuous colour scale only gets lighter from its low end to its high end (CIE L*), -1 when it only
    gets darker (a sequential scale), 0 otherwise: diverging (lightest or darkest in the middle), stepped
    (categories: two stops at one position) or a colour not read."""
    try:
        stops = plotly.colors.get_colorscale(colorscale) if isinstance(colorscale, str) else colorscale
        positions = [float(p) for p, _ in stops]
        rgb = np.array(plotly.colors.convert_colors_to_same_type([c for _, c in stops], colortype="tuple")[0])
    except Exception:  # a named CSS colour or anything else plotly's helpers do not read
        return 0
    if len(set(positions)) < len(positions) or len(rgb) < 2:
        return 0
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    y = linear @ np.array([0.2126, 0.7152, 0.0722])
    lightness = np.where(y > (6 / 29) ** 3, 116 * np.cbrt(y) - 16, y * (29 / 3) ** 3)
    steps = np.diff(lightness)
    if abs(lightness[-1] - lightness[0]) < 20:
        return 0
    if (steps >= -2).all():
        return 1
    if (steps <= 2).all():
        return -1
    return 0


# -- drawing with kaleido --
class _Chromium:
    """One kaleido browser on an event loop of its own thread; render() may be called from any thread (kaleido's
    one tab takes the figures in turn)."""

    def __init__(self, path: str):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="attnviz-kaleido")
        self.thread.start()
        try:
            self.kaleido = self._run(self._open(path))
        except BaseException:
            self.loop.call_soon_threadsafe(self.loop.stop)
            raise

    @staticmethod
    async def _open(path: str):
        import kaleido

        browser = kaleido.Kaleido(n=1, path=path, mathjax=False, timeout=RENDER_TIMEOUT_S)
        await browser.open()
        return browser

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=RENDER_TIMEOUT_S + 30)

    def render(self, fig_dict: dict, opts: dict) -> bytes:
        return self._run(self.kaleido.calc_fig(fig_dict, opts=opts))

    def close(self) -> None:
        try:
            self._run(self.kaleido.close())
        except Exception:  # a browser that already died: nothing left to close
            pass
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)


_browser: _Chromium | None = None
_browser_lock = threading.Lock()


def _chromium() -> _Chromium:
    global _browser
    with _browser_lock:
        if _browser is None:
            path = browser_path()
            if path is None:
                raise ExportError(NO_BROWSER)
            os.environ.setdefault("BROWSER_PATH", path)  # any kaleido call outside attnviz finds the same one
            try:
                _browser = _Chromium(path)
            except Exception as exc:
                raise ExportError("Could not start Chromium to draw the figure.", detail=repr(exc)) from exc
        return _browser


def close() -> None:
    """Closes the Chromium that draws figures (started again by the next export)."""
    global _browser
    with _browser_lock:
        browser, _browser = _browser, None
    if browser is not None:
        browser.close()


atexit.register(close)


def figure_bytes(fig: go.Figure, fmt: str, *, styled: bool = True) -> bytes:
    """The figure as an SVG, PDF or PNG file's bytes, laid out at print_size (in the print style unless
    styled=False); a PNG at PNG_DPI (scale PNG_SCALE), an SVG or PDF at its size on paper."""
    global _browser
    fmt = fmt.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ExportError(f"Cannot draw a figure as {fmt!r}: choose one of {', '.join(FORMATS)}.")
    if browser_path() is None:
        raise ExportError(NO_BROWSER)
    width, height = print_size(fig, styled=styled)
    drawn = print_style(fig, size=(width, height)) if styled else fig
    opts = dict(format=fmt, width=width, height=height, scale=PNG_SCALE if fmt == "png" else 1)
    browser = _chromium()
    try:
        return browser.render(drawn.to_dict(), opts)
    except Exception as exc:
        with _browser_lock:  # a browser that failed once is not trusted again
            if _browser is browser:
                _browser = None
        browser.close()
        raise ExportError(f"Could not draw the figure as {fmt.upper()}.", detail=repr(exc)) from exc


def write_figure(fig: go.Figure, path, *, styled: bool = True) -> Path:
    """Writes the figure to `path` in the format its suffix names (.svg, .pdf, .png; figure_bytes); returns it."""
    path = Path(os.fspath(path))
    fmt = format_of(path)
    if fmt == "html":
        raise ExportError("write_figure draws .svg, .pdf or .png; a View's save() writes .html.")
    path.write_bytes(figure_bytes(fig, fmt, styled=styled))
    return path
