"""Matrices drawn as pictures: a palette PNG (one byte per cell before compression) that a go.Image or a layout
image shows, an invisible line through the cells for the hover, and a colour bar from a marker trace.

`map_image`, `map_hover` and `colour_bar` draw a map that an in-chart slider can change without plotly drawing the
figure again: plotly.animate swaps a layout image's picture and restyles a line in place (redraw: false), where a
heatmap whose values change makes it draw every panel of the figure again (attnviz.figures.instant). The picture's
cells are colours of the scale quantised to 255 steps; the hover gives each cell's value as the library computed
it.
"""

from __future__ import annotations

import base64
import functools
import struct
import zlib

import numpy as np
import plotly.colors

from attnviz.figures.common import ATTENTION_SCALE

MASKED_GREY = (170, 170, 170)  # a neutral grey, distinct from both ends of Viridis and from white gaps
PICTURE_PX = 400  # a map's picture is at least this many pixels on its longer side, each cell a square of pixels
MAX_CELL_PX = 32  # (a picture of one pixel per cell is scaled up smoothly by the browser: its cells blur)


def palette_png(values: np.ndarray, *, colorscale=ATTENTION_SCALE, vmin: float = 0.0, vmax: float = 1.0,
                masked: np.ndarray | None = None, cell_px: int = 1) -> str:
    """values [rows, cols] -> a data: URI of a palette PNG of 256 entries (255 colours of colorscale over [vmin, vmax],
    then white), each cell cell_px by cell_px pixels.

    NaN cells are drawn white (palette entry 255 is reserved for them). masked [rows, cols] (bool), if given, marks
    cells drawn MASKED_GREY (entry 254); the colour scale then has 254 steps instead of 255."""
    v = np.asarray(values, dtype=np.float64)
    scaled = np.clip((v - vmin) / max(vmax - vmin, 1e-12), 0.0, 1.0)
    steps = 254 if masked is None else 253
    index = np.where(np.isnan(v), 255, np.rint(np.nan_to_num(scaled) * steps)).astype(np.uint8)
    if masked is not None:
        index[np.asarray(masked, dtype=bool)] = 254
    palette = _palette(colorscale, steps + 1) + (list(MASKED_GREY) if masked is not None else []) + [255, 255, 255]
    return "data:image/png;base64," + base64.b64encode(_png(index, palette, cell_px)).decode("ascii")


def _png(index: np.ndarray, palette: list[int], cell_px: int) -> bytes:
    """The bytes of an 8-bit palette PNG of index [rows, cols], each cell cell_px by cell_px pixels.

    Written here rather than by PIL, 2-4 times faster for a small map drawn large (the kernel's step view encodes
    three a step, on every setting moved): the first pixel row of each row of cells is stored as it is, the
    cell_px - 1 rows that repeat it with PNG's "up" filter (each byte minus the byte above it: all zeros), packed at
    zlib's fastest level. A picture of one pixel per cell of up to a million cells is packed at level 6 (a third
    smaller, in a few ms)."""
    rows, cols = index.shape
    if not rows or not cols or cell_px < 1:
        raise ValueError(f"a picture needs at least one cell and one pixel a cell, not {rows} x {cols} at {cell_px}")
    lines = np.zeros((rows * cell_px, cols * cell_px + 1), dtype=np.uint8)  # a filter byte, then the row's pixels
    lines[::cell_px, 1:] = index.repeat(cell_px, axis=1)
    lines[:, 0] = 2  # up
    lines[::cell_px, 0] = 0  # none
    level = 6 if cell_px == 1 and index.size <= 1_000_000 else 1
    header = struct.pack(">IIBBBBB", lines.shape[1] - 1, lines.shape[0], 8, 3, 0, 0, 0)  # 8-bit palette, no interlace
    return b"\x89PNG\r\n\x1a\n" + b"".join(_chunk(kind, data) for kind, data in (
        (b"IHDR", header), (b"PLTE", bytes(palette)), (b"IDAT", zlib.compress(lines.tobytes(), level)),
        (b"IEND", b"")))


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _palette(colorscale, count: int = 255) -> list[int]:
    return list(_sampled(colorscale if isinstance(colorscale, str) else tuple(map(tuple, colorscale)), count))


@functools.lru_cache(maxsize=32)
def _sampled(colorscale, count: int) -> tuple[int, ...]:
    """count colours of colorscale, evenly from its low end to its high end, as r, g, b, r, g, b, ... (plotly's
    sampling takes ~10 ms: once per scale, not once a picture)."""
    colors = plotly.colors.sample_colorscale(colorscale, list(np.linspace(0.0, 1.0, count)), colortype="rgb")
    return tuple(int(round(float(c))) for color in colors for c in color[4:-1].split(","))


def cell_px(rows: int, cols: int) -> int:
    """Pixels per cell side of a map's picture: its longer side at least PICTURE_PX, a cell at most MAX_CELL_PX."""
    return int(min(MAX_CELL_PX, max(1, -(-PICTURE_PX // max(rows, cols, 1)))))


def map_image(values, *, axes: tuple[str, str], x0: float = 0.0, y0: float = 0.0, colorscale, vmin: float,
              vmax: float) -> dict:
    """values [rows, cols] as a layout image on the panel of `axes` ("x2", "y2"): cell (i, j) centred on
    (x0 + j, y0 + i), rows downwards (the y axis reversed, as map_ranges gives it); NaN cells white."""
    values = np.asarray(values, dtype=np.float64)
    rows, cols = values.shape
    return dict(source=palette_png(values, colorscale=colorscale, vmin=vmin, vmax=vmax, cell_px=cell_px(rows, cols)),
                xref=axes[0], yref=axes[1], x=x0 - 0.5, y=y0 - 0.5, sizex=cols, sizey=rows, sizing="stretch",
                xanchor="left", yanchor="top", layer="above")


def map_ranges(shape: tuple[int, int], x0: float = 0.0, y0: float = 0.0) -> tuple[dict, dict]:
    """The x and y axis settings that frame a map_image of `shape` exactly, rows downwards, with no grid over it
    (a picture sets no autorange)."""
    rows, cols = shape
    bare = dict(showgrid=False, zeroline=False)
    return (dict(range=[x0 - 0.5, x0 + cols - 0.5], **bare),
            dict(range=[y0 + rows - 0.5, y0 - 0.5], autorange=False, **bare))


def map_hover(values, *, axes: tuple[str, str], x0: float = 0, y0: float = 0, hovertemplate: str,
              named_from: tuple[int | None, int | None] | None = None) -> dict:
    """The hover of a map_image of values [rows, cols] (same axes and origin): an invisible line through every cell
    (not a marker each: plotly draws one path for a line, and restyles it in place ~15 ms faster for 384 cells),
    whose template reads the cell's value as %{customdata} and its position as %{x} and %{y}. With named_from =
    (first row, first column), the value is %{customdata[0]}, then the cell's row counted from the first row and its
    column counted from the first column, each where it is not None (a map drawn at offsets, named by positions).
    A cell that is not a finite number (blank, or a masked score) has no hover: a page sends a small figure's arrays
    as JSON lists, where it would read null, which plotly writes as 0. The cells' places are the same for every map
    of one shape with none (an in-chart slider sends them once). The values travel in their own precision (float32
    stays float32: half the bytes, and the same numbers); the cells' places as whole numbers are left 64-bit, which
    the page's JSON narrows to the smallest int that holds them (int8 for a tile's offsets: a quarter of int32's
    bytes, in every stop of an in-chart slider whose cells change)."""
    values = np.asarray(values)
    values = values.astype(np.float32 if values.dtype.itemsize <= 4 and values.dtype.kind == "f" else np.float64)
    y, x = np.indices(values.shape, dtype=np.int64)
    shown = np.isfinite(values)
    columns = [values] + [grid + first for grid, first in zip((y, x), named_from or ()) if first is not None]
    custom = np.stack([c[shown] for c in columns], axis=-1).astype(values.dtype)
    return dict(type="scatter", x=(x0 + x)[shown], y=(y0 + y)[shown], customdata=custom[:, 0] if len(columns) == 1
                else custom, mode="lines", line=dict(width=0), showlegend=False, xaxis=axes[0], yaxis=axes[1],
                hovertemplate=hovertemplate)


def colour_bar(*, axes: tuple[str, str], colorscale, vmin: float, vmax: float, colorbar: dict) -> dict:
    """A colour bar for map_image's pictures: a marker trace with no point to draw (a picture draws none). A scale
    by name goes as its [position, colour] stops, as plotly.js reads it (only plotly.py knows names like "RdBu_r")."""
    stops = plotly.colors.get_colorscale(colorscale) if isinstance(colorscale, str) else colorscale
    return dict(type="scatter", x=[None], y=[None], mode="markers", showlegend=False, hoverinfo="skip",
                xaxis=axes[0], yaxis=axes[1],
                marker=dict(color=[vmin], colorscale=stops, cmin=vmin, cmax=vmax, showscale=True,
                            colorbar=colorbar))
