"""attnviz.figures.heads: what the Heads page sends the browser (palette PNGs under a byte per cell, grey for masked
and blank cells, max-pooling that keeps thin stripes), and the sink hiding of attnviz.views as drawn."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest

from attnviz.figures import heads as figs
from attnviz.figures.heads import DETAIL_MAX_TOKENS, head_detail, head_grid, max_pool, palette_png


def test_big_map_is_a_png_under_one_byte_per_cell():
    rng = np.random.default_rng(0)
    n = 1024
    logits = rng.normal(scale=3.0, size=(n, n))
    logits[np.triu_indices(n, 1)] = -np.inf
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)  # a noisy causal map: harder to compress than a real head
    fig = head_detail(p, [str(i) for i in range(n)], title="t")
    assert isinstance(fig.data[0], go.Image) and fig.data[0].source.startswith("data:image/png;base64,")
    assert len(fig.to_json()) / p.size < 1.0
    small = head_detail(p[:DETAIL_MAX_TOKENS, :DETAIL_MAX_TOKENS], [str(i) for i in range(DETAIL_MAX_TOKENS)],
                        title="t")
    assert isinstance(small.data[0], go.Heatmap)

def test_palette_png_decodes_to_the_colour_of_each_weight():
    import base64
    import io

    from PIL import Image

    values = np.array([[0.0, 1.0], [0.5, np.nan]])
    uri = palette_png(values)
    image = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))
    assert image.mode == "P" and np.asarray(image).tolist() == [[0, 254], [127, 255]]

def test_max_pool_keeps_thin_stripes():
    n = 1000
    p = np.eye(n)
    pooled = max_pool(p, 50)
    assert pooled.shape == (50, 50)
    assert np.array_equal(np.diag(pooled), np.ones(50))  # a mean pool would give 1/20
    grid = head_grid(np.stack([np.stack([p, p])]), layers=[0])
    assert isinstance(grid.data[0], go.Image)

@pytest.mark.parametrize("n", [3, 48])
def test_max_pool_is_identity_when_small(n):
    p = np.random.default_rng(1).random((2, n, n))
    assert np.array_equal(max_pool(p, 48), p)

def _off_token_0(p):
    """Column 0 zeroed and every row divided by what is left, written out: the sink hiding the pages draw, before
    its blank rows."""
    out = np.array(p, dtype=np.float64)
    out[..., 0] = 0.0
    with np.errstate(invalid="ignore"):  # a row that kept nothing: 0 / 0, NaN (blank_rows blanks it anyway)
        return out / out.sum(-1, keepdims=True)

def test_grid_with_a_layer_map_equals_the_grid_of_the_mapped_pattern():
    rng = np.random.default_rng(2)
    p = rng.random((3, 2, 70, 70)).astype(np.float32)
    p /= p.sum(-1, keepdims=True)
    layer_by_layer = head_grid(p, [0, 1, 2], tile=16, layer_map=_off_token_0)
    whole = head_grid(_off_token_0(p), [0, 1, 2], tile=16)
    assert layer_by_layer.data[0].source == whole.data[0].source
    assert layer_by_layer.data[0].source != head_grid(p, [0, 1, 2], tile=16).data[0].source

def _grey_share(fig) -> float:
    """The share of a palette image's cells drawn in the masked grey."""
    import base64
    import io

    from PIL import Image

    from attnviz.figures.heads import MASKED_GREY

    image = Image.open(io.BytesIO(base64.b64decode(fig.data[0].source.split(",", 1)[1])))
    rgb = np.asarray(image.convert("RGB")).reshape(-1, 3)
    return float((rgb == np.array(MASKED_GREY)).all(-1).mean())

def _causal_softmax(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, n))
    logits[np.triu_indices(n, 1)] = -np.inf
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)

@pytest.mark.parametrize("n", [12, 300])  # a heatmap with hover, and an image
def test_masked_cells_are_grey_and_not_the_colour_of_weight_0(n):
    p = _causal_softmax(n)
    fig = head_detail(p, [str(i) for i in range(n)], title="t", causal=True)
    above = n * (n - 1) / 2 / n**2  # the strict upper triangle
    if n <= DETAIL_MAX_TOKENS:
        z = np.asarray(fig.data[0].z, dtype=float)
        assert np.array_equal(np.isnan(z), np.triu(np.ones((n, n), dtype=bool), 1))  # NaN: not drawn
        assert "170, 170, 170" in fig.layout.plot_bgcolor  # ... so the grey background shows there
    else:
        assert _grey_share(fig) == pytest.approx(above)
    bidirectional = head_detail(p, [str(i) for i in range(n)], title="t")
    if n > DETAIL_MAX_TOKENS:
        assert _grey_share(bidirectional) == 0.0

def test_palette_png_masked_cells_take_the_grey_entry():
    import base64
    import io

    from PIL import Image

    from attnviz.figures.heads import MASKED_GREY

    values = np.array([[0.0, 1.0], [0.5, np.nan]])
    uri = palette_png(values, masked=np.array([[False, False], [True, False]]))
    image = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))
    assert np.asarray(image).tolist() == [[0, 253], [254, 255]]
    rgb = np.asarray(image.convert("RGB"))
    assert tuple(rgb[1, 0]) == MASKED_GREY and tuple(rgb[1, 1]) == (255, 255, 255)

def test_grid_greys_blocks_above_the_diagonal_only_for_causal_models():
    n, tile = 100, 10
    p = np.stack([np.stack([_causal_softmax(n, s) for s in range(2)])])  # 1 layer x 2 heads
    grey = _grey_share(head_grid(p, [0], tile=tile, causal=True))
    mosaic_cells = tile * (2 * tile + 2)
    assert grey * mosaic_cells == pytest.approx(2 * tile * (tile - 1) / 2)  # 45 blocks per head
    assert _grey_share(head_grid(p, [0], tile=tile)) == 0.0

def test_grid_with_the_sink_hidden_greys_a_near_pure_sink_head():
    from attnviz.views import MIN_REMAINING, blank_rows, mass_off_sink

    n, tile = 100, 10
    sinky = _causal_softmax(n) * 1e-6
    sinky[:, 0] += 1.0 - sinky.sum(-1)
    p = np.stack([np.stack([sinky, _causal_softmax(n, 1)])])  # head 0: a pure sink, head 1: an ordinary head
    layer_map = lambda x: blank_rows(_off_token_0(x), mass_off_sink(x) >= MIN_REMAINING)  # noqa: E731
    grid = head_grid(p, [0], tile=tile, layer_map=layer_map, causal=True)
    from attnviz.views import sink_hidden  # the one function the page uses: the same grid

    assert head_grid(p, [0], tile=tile, layer_map=sink_hidden, causal=True).data[0].source == grid.data[0].source
    # head 0: all 100 blocks grey; head 1: the 45 above the diagonal, and row block 0 (query 0 sees only the sink,
    # the rest of its block still has weight: fmax skips the blank row)
    assert _grey_share(grid) * tile * (2 * tile + 2) == pytest.approx(100 + 45)

def test_hiding_the_sink_blanks_the_rows_with_almost_nothing_left():
    """A near-pure sink head: every row keeps ~1e-6 off token 0, which rescaled would be drawn at full brightness."""
    from attnviz.views import MIN_REMAINING, blank_rows, mass_off_sink

    n = 200
    p = _causal_softmax(n) * 1e-6
    p[:, 0] += 1.0 - p.sum(-1)
    p[150:] = _causal_softmax(n, seed=1)[150:]  # the last 50 rows are ordinary
    kept = mass_off_sink(p)
    np.testing.assert_allclose(kept, 1.0 - p[:, 0], atol=1e-12)  # rows sum to 1
    shown = blank_rows(_off_token_0(p), kept >= MIN_REMAINING)
    from attnviz.views import sink_hidden

    np.testing.assert_allclose(sink_hidden(p), shown, atol=1e-12)  # NaN where shown is NaN
    blank = np.isnan(shown).all(-1)
    assert blank[:150].all() and not blank[150:].any()
    np.testing.assert_allclose(np.nansum(shown[150:], -1), 1.0, atol=1e-12)
    fig = head_detail(shown, [str(i) for i in range(n)], title="t", causal=True)
    grey_expected = (150 * n + sum(n - 1 - q for q in range(150, n))) / n**2  # blank rows + masked cells after
    assert _grey_share(fig) == pytest.approx(grey_expected)

def test_where_a_token_looks_image_is_not_a_strip_of_square_pixels():
    """9 heads x 1,000 keys as an image kept square pixels: a band 9 pixels tall across the chart."""
    from attnviz.figures.heads import token_looks

    n = 1_000
    fig = token_looks(np.full((9, n), 1.0 / n), [str(i) for i in range(n)], [f"L0 H{h}" for h in range(9)], n - 1)
    assert isinstance(fig.data[0], go.Image)
    assert fig.layout.yaxis.scaleanchor is False and fig.layout.height >= 340

def test_difference_draws_rows_blank_in_either_map_grey():
    from attnviz.figures.heads import difference

    n = 300
    a, b = _causal_softmax(n, 0), _causal_softmax(n, 1)
    b[:10] = np.nan  # ten rows blank in B (sink hidden)
    fig = difference(a, b, [str(i) for i in range(n)], title="t")
    assert _grey_share(fig) == pytest.approx(10 / n)


def test_max_abs_pool_keeps_the_largest_difference_of_each_block_with_its_sign():
    """Checked block by block with a loop: the entry of largest magnitude, sign kept; NaN skipped."""
    from attnviz.pooling import pool_edges

    rng = np.random.default_rng(0)
    d = rng.normal(size=(37, 37))
    d[3, :] = np.nan  # a blank row
    d[10:13, 20:23] = np.nan  # a blank block
    m = figs.max_abs_pool(d, 8)
    edges = pool_edges(37, 8)
    assert m.shape == (8, 8)
    for i in range(8):
        for j in range(8):
            block = d[edges[i]:edges[i + 1], edges[j]:edges[j + 1]]
            if np.isnan(block).all():
                assert np.isnan(m[i, j])
            else:
                assert m[i, j] == block.flat[np.nanargmax(np.abs(block))]
    assert (m < 0).any() and (m > 0).any()
    np.testing.assert_array_equal(figs.max_abs_pool(d[:5, :5], 8), d[:5, :5])  # small maps unchanged


def test_span_bars_draw_a_bar_per_key_and_past_the_limit_one_stepped_area_with_the_same_values():
    """A bar per key while they are few; past BARS_AT_MOST keys one stepped line filled to zero (one element for
    the browser to draw, not one per key), flat over each key at exactly the key's weight."""
    from attnviz.figures import experiments as exp_figs
    from attnviz.figures import heads as heads_figs

    rng = np.random.default_rng(5)
    for n, kind in ((12, "bar"), (exp_figs.BARS_AT_MOST + 1, "scatter")):
        weights = rng.dirichlet(np.ones(n))
        tokens = [f"t{i}" for i in range(n)]
        fig = heads_figs.span_bars(weights, tokens, 1, 2, [n - 2, n - 1], "sum")
        (trace,) = fig.data
        assert trace.type == kind
        np.testing.assert_array_equal(np.asarray(trace.y), weights)
        assert list(trace.x) == [f"{i}: t{i}" for i in range(n)]
    assert trace.line.shape == "hvh" and trace.fill == "tozeroy" and trace.mode == "lines"
    two = exp_figs.bars_by_token({"a": np.ones(200), "b": np.zeros(200)}, [str(i) for i in range(200)],
                                 title="t", y_title="y")
    assert [t.type for t in two.data] == ["scatter", "scatter"] and {t.fill for t in two.data} == {None}
