"""Maps drawn as pictures (attnviz.figures.raster): each cell's colour against plotly's own colour scale, the
picture's place on its axes, the hover's values."""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib

import numpy as np
import pytest
import plotly.colors
import plotly.graph_objects as go
import plotly.io as pio
from PIL import Image

from attnviz.figures import raster, typed_arrays

QUANTUM = 6  # colour units one of the picture's 255 steps can move a channel of Viridis or RdBu (about 3), twice


def cell_colours(image: dict, shape: tuple[int, int]) -> np.ndarray:
    """The RGB colour at the centre of each cell of a layout image drawing a map of `shape`, [rows, cols, 3]."""
    picture = np.asarray(Image.open(io.BytesIO(base64.b64decode(image["source"].split(",", 1)[1]))).convert("RGB"))
    rows, cols = shape
    height, width = picture.shape[:2]
    assert height % rows == 0 and width % cols == 0 and height // rows == width // cols  # square cells
    px = height // rows
    return picture[px // 2::px, px // 2::px].astype(int)


def expected_colours(values, colorscale, vmin: float, vmax: float) -> np.ndarray:
    """plotly's colour of each value on the scale (plotly.colors, not the code under test), NaN white."""
    values = np.asarray(values, dtype=float)
    scaled = np.clip((np.nan_to_num(values) - vmin) / (vmax - vmin), 0, 1).ravel()
    rgb = [[float(c) for c in s[4:-1].split(",")] for s in plotly.colors.sample_colorscale(colorscale, list(scaled))]
    out = np.asarray(rgb).reshape(*values.shape, 3)
    out[np.isnan(values)] = 255
    return out


def test_a_map_image_shows_each_cell_in_plotlys_colour_at_its_place():
    rng = np.random.default_rng(0)
    values = rng.normal(size=(5, 7))
    values[1, 2] = np.nan
    image = raster.map_image(values, axes=("x3", "y3"), x0=10, y0=20, colorscale="RdBu_r", vmin=-3.0, vmax=3.0)
    np.testing.assert_allclose(cell_colours(image, values.shape), expected_colours(values, "RdBu_r", -3.0, 3.0),
                               atol=QUANTUM)
    # cell (i, j) centred on (10 + j, 20 + i): the picture's top left corner half a cell before the first
    assert (image["xref"], image["yref"], image["x"], image["y"]) == ("x3", "y3", 9.5, 19.5)
    assert (image["sizex"], image["sizey"], image["sizing"]) == (7, 5, "stretch")
    x_axis, y_axis = raster.map_ranges(values.shape, x0=10, y0=20)
    assert x_axis["range"] == [9.5, 16.5] and y_axis["range"] == [24.5, 19.5]  # rows downwards


def test_a_small_maps_picture_has_cells_many_pixels_wide_and_a_big_ones_one():
    assert raster.cell_px(12, 32) * 32 >= raster.PICTURE_PX
    assert raster.cell_px(1, 1) == raster.MAX_CELL_PX
    assert raster.cell_px(1000, 900) == 1


@pytest.mark.parametrize("shape, cell", [((3, 5), 1), ((3, 5), 2), ((16, 16), 25), ((7, 2), 32), ((40, 1), 9)])
@pytest.mark.parametrize("with_mask", [False, True])
def test_a_picture_decodes_to_each_cells_palette_entry_in_a_square_of_pixels(shape, cell, with_mask):
    """The PNG written by hand, read chunk by chunk (each chunk's CRC, each pixel row's filter: none for a row of cells'
    first, up for the rows repeating it) and decoded by PIL: every pixel of a cell's square is its entry (NaN 255,
    masked 254); the palette's last entries are the mask's grey and white."""
    rng = np.random.default_rng(sum(shape) + cell)
    values = rng.uniform(-0.2, 1.2, size=shape)
    values.flat[::4] = np.nan
    masked = rng.random(shape) < 0.3 if with_mask else None
    uri = raster.palette_png(values, masked=masked, cell_px=cell)
    png = base64.b64decode(uri.split(",", 1)[1])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, at = {}, 8
    while at < len(png):
        (length,), kind = struct.unpack(">I", png[at:at + 4]), png[at + 4:at + 8]
        data, (crc,) = png[at + 8:at + 8 + length], struct.unpack(">I", png[at + 8 + length:at + 12 + length])
        assert crc == zlib.crc32(kind + data), kind
        chunks[kind], at = data, at + 12 + length
    assert list(chunks) == [b"IHDR", b"PLTE", b"IDAT", b"IEND"] and len(chunks[b"PLTE"]) == 3 * 256
    width = shape[1] * cell
    rows = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), dtype=np.uint8).reshape(shape[0] * cell, width + 1)
    assert rows[:, 0].tolist() == [0 if r % cell == 0 else 2 for r in range(shape[0] * cell)]
    image = Image.open(io.BytesIO(png))
    steps = 253 if with_mask else 254
    entry = np.where(np.isnan(values), 255, np.rint(np.clip(np.nan_to_num(values), 0, 1) * steps))
    if with_mask:
        entry[masked] = 254
    assert image.mode == "P" and image.size == (shape[1] * cell, shape[0] * cell)
    np.testing.assert_array_equal(np.asarray(image), entry.repeat(cell, 0).repeat(cell, 1))
    palette = np.asarray(image.getpalette()).reshape(-1, 3)
    assert len(palette) == 256 and tuple(palette[255]) == (255, 255, 255)
    assert not with_mask or tuple(palette[254]) == raster.MASKED_GREY


def test_the_hover_lines_places_travel_as_the_smallest_int_that_holds_them():
    """A tile's offsets go as int8 (a quarter of int32's bytes in every stop of the kernel's step view), a long
    text's positions as int16, each decoding to the same places."""
    for shape, x0, dtype in (((16, 48), 0, "i1"), ((4, 300), 0, "i2"), ((3, 5), 40_000, "i4")):
        hover = raster.map_hover(np.ones(shape), axes=("x", "y"), x0=x0, hovertemplate="")
        sent = typed_arrays.value(hover["x"], "x")
        assert sent["dtype"] == dtype
        assert typed_arrays.array(sent).tolist() == (x0 + np.tile(np.arange(shape[1]), shape[0])).tolist()
        rows = typed_arrays.value(hover["y"], "y")
        assert rows["dtype"] == "i1" and typed_arrays.array(rows).tolist() == np.repeat(np.arange(shape[0]),
                                                                                         shape[1]).tolist()
        as_plotly = json.loads(pio.to_json(go.Figure([hover])))["data"][0]  # plotly's own writer: the same
        assert as_plotly["x"]["dtype"] == dtype and as_plotly["y"]["dtype"] == "i1"


def test_an_empty_map_has_no_picture():
    with pytest.raises(ValueError, match="at least one cell"):
        raster.palette_png(np.zeros((0, 4)), cell_px=4)


def test_the_hover_line_carries_every_finite_cells_value_at_its_position():
    values = np.arange(6.0).reshape(2, 3)
    values[0, 1] = -np.inf
    hover = raster.map_hover(values, axes=("x2", "y2"), x0=4, y0=1, hovertemplate="%{customdata}")
    assert hover["mode"] == "lines" and hover["line"]["width"] == 0
    assert list(zip(hover["x"], hover["y"], hover["customdata"])) == [  # not the masked one
        (4, 1, 0.0), (6, 1, 2.0), (4, 2, 3.0), (5, 2, 4.0), (6, 2, 5.0)]
    named = raster.map_hover(values.astype(np.float32), axes=("x", "y"), hovertemplate="", named_from=(10, None))
    assert named["customdata"].dtype == np.float32 and named["customdata"].tolist()[3] == [4.0, 11.0]
    bar = raster.colour_bar(axes=("x2", "y2"), colorscale="Viridis", vmin=0.0, vmax=1.0, colorbar={})
    assert bar["marker"]["showscale"] and (bar["marker"]["cmin"], bar["marker"]["cmax"]) == (0.0, 1.0)
