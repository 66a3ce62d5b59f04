"""attnviz.figures.positional's instant charts: at every stop of their in-chart sliders, replayed as plotly.js applies
them (figures.instant.drawn), they draw what attnviz.positional computes for that value, and they stay small at
the page's largest settings."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz import positional as P
from attnviz.figures import instant
from attnviz.figures import positional as F
from tests.test_figures_raster import QUANTUM, cell_colours, expected_colours

BASES = [100.0, 1000.0, 10000.0, 100000.0, 1000000.0]
POSITIONS = list(range(201))
D_MODELS = [8, 16, 32, 64, 128, 256, 512]
SLOPES = [2.0 ** -e for e in range(1, 9)]
LIMIT = 2_000_000  # bytes of figure JSON


def _visible(state: dict) -> list[dict]:
    return [t for t in state["data"] if instant.shown(t)]


def test_the_dot_products_d_model_slider_draws_sinusoidal_dot_at_every_d_model():
    offsets = np.arange(512)  # the Positions slider's largest value
    fig = F.dot_by_offset_instant(offsets, {d: P.sinusoidal_dot(offsets, d, 1000.0) for d in D_MODELS}, 64)
    assert instant.json_bytes(fig) < LIMIT
    for i, d in enumerate(D_MODELS):
        state = instant.drawn(fig, [(0, i)])
        (curve,) = state["data"]
        np.testing.assert_array_equal(instant.array(curve["y"]), P.sinusoidal_dot(offsets, d, 1000.0))
        np.testing.assert_array_equal(instant.array(curve["x"]), offsets)
        assert [s["y0"] for s in state["layout"]["shapes"]] == [d / 2]  # the d/2 line moves with d
        assert state["layout"]["annotations"][0]["text"] == f"d/2 = {d / 2:g} at k = 0"


@pytest.mark.parametrize("pair", [0, 5])
def test_the_rope_pair_charts_position_and_base_sliders_draw_apply_rope_at_every_stop(pair):
    """Every (query position, base): the visible arrows are the pair of q rotated by apply_rope to m and of k to n,
    at that base, and the title names that base's theta."""
    rng = np.random.default_rng(7)
    q, k = rng.standard_normal((2, 16))
    n = 10
    plane = slice(2 * pair, 2 * pair + 2)
    titles = {b: f"θ = {P.rope_frequencies(16, b)[pair]:.3g}" for b in BASES}
    fig = F.rope_pair_rotation_instant(q[plane], k[plane], {b: P.rope_pair_at(q, pair, POSITIONS, b) for b in BASES},
                                       {b: P.rope_pair_at(k, pair, [n], b)[0] for b in BASES}, POSITIONS, 3, n,
                                       10000.0, titles)
    assert instant.json_bytes(fig) < LIMIT
    frames, bases = 0, 1  # the position slider was added first, the base slider on top of it
    assert [s.label for s in fig.layout.sliders[bases].steps] == [f"{b:,.0f}" for b in BASES]
    assert len(fig.layout.sliders[frames].steps) == len(POSITIONS)
    fig = instant.figure_dict(fig)  # converted once, replayed 1,005 times
    for j, base in enumerate(BASES):
        rotated_k = P.apply_rope(k[None], [n], base, interleaved=True)[0, plane]
        for i, m in enumerate(POSITIONS):
            state = instant.drawn(fig, [(frames, i), (bases, j)])
            arrows = {t["name"]: t for t in _visible(state) if t.get("mode") == "lines+markers"}
            assert set(arrows) == {"q", "k", f"R_m q (m = {m})", f"R_n k (n = {n})"}
            rotated_q = P.apply_rope(q[None], [m], base, interleaved=True)[0, plane]
            for name, tip in ((f"R_m q (m = {m})", rotated_q), (f"R_n k (n = {n})", rotated_k),
                              ("q", q[plane]), ("k", k[plane])):
                np.testing.assert_allclose(instant.array(arrows[name]["x"]), [0.0, tip[0]], rtol=1e-12, atol=1e-15)
                np.testing.assert_allclose(instant.array(arrows[name]["y"]), [0.0, tip[1]], rtol=1e-12, atol=1e-15)
            assert state["layout"]["title"]["text"] == titles[base]


def test_rope_pair_at_is_the_paper_layouts_rotation_of_one_pair():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(8)
    positions = [0, 1, 7, 200]
    for pair in range(4):
        theta = 10000.0 ** (-2 * pair / 8)
        z = (x[2 * pair] + 1j * x[2 * pair + 1]) * np.exp(1j * np.array(positions) * theta)
        got = P.rope_pair_at(x, pair, positions)
        np.testing.assert_allclose(got[:, 0], z.real, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(got[:, 1], z.imag, rtol=1e-12, atol=1e-14)


def test_the_rope_layouts_position_slider_draws_both_rotation_matrices_at_every_position():
    perm = P.interleaved_to_half_permutation(8)
    base = 1000.0
    paper = [P.rope_rotation_matrix(m, 8, base, interleaved=True) for m in POSITIONS]
    half = [P.rope_rotation_matrix(m, 8, base) for m in POSITIONS]
    fig = F.rope_layouts_instant(paper, half, np.eye(8)[perm], POSITIONS, 3)
    assert instant.json_bytes(fig) < LIMIT
    assert {s.method for s in fig.layout.sliders[0].steps} == {"animate"}  # drawn in place
    fig = instant.figure_dict(fig)
    for i, m in enumerate(POSITIONS):
        state = instant.drawn(fig, [(0, i)])
        hovers = [t for t in state["data"] if "customdata" in t]
        for hover, image, want in zip(hovers, state["layout"]["images"],
                                      (P.rope_rotation_matrix(m, 8, base, interleaved=True),
                                       P.rope_rotation_matrix(m, 8, base), np.eye(8)[perm])):
            np.testing.assert_array_equal(instant.array(hover["customdata"]), want.ravel())
            np.testing.assert_allclose(cell_colours(image, want.shape), expected_colours(want, "RdBu_r", -1, 1),
                                       atol=QUANTUM)
        assert len(hovers) == len(state["layout"]["images"]) == 3
        assert state["layout"]["sliders"][0]["steps"][i]["label"] == str(m)


def test_the_decay_bounds_base_slider_draws_rope_decay_bound_at_every_base():
    distances = np.linspace(0, 65536, 4001)  # the page's longest distance, sampled as it samples it
    curves = {b: {f"base {b:g}": P.rope_decay_bound(distances, 128, b),
                  "ntk × 4": P.rope_decay_bound(distances, 128, b, scaling="ntk", factor=4.0)} for b in BASES}
    fig = F.decay_bound_instant(distances, curves, 10000.0)
    assert instant.json_bytes(fig) < LIMIT
    for i, base in enumerate(BASES):
        state = instant.drawn(fig, [(0, i)])
        plain, scaled = state["data"]
        assert plain["name"] == f"base {base:g}"
        np.testing.assert_array_equal(instant.array(plain["y"]), P.rope_decay_bound(distances, 128, base))
        np.testing.assert_array_equal(instant.array(scaled["y"]),
                                      P.rope_decay_bound(distances, 128, base, scaling="ntk", factor=4.0))


def test_the_scheme_charts_slope_slider_draws_compare_schemes_at_every_slope():
    """Only ALiBi depends on the slope: its score and its attention weight change from stop to stop, and at every
    stop every line is what compare_schemes and softmax_over_distance give at that slope."""
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((2, 64))
    n = 1024  # the Sequence length slider's largest value
    scores = {s: P.compare_schemes(q, k, n, alibi_slope=s) for s in SLOPES}
    weights = {s: {name: P.softmax_over_distance(x) for name, x in by.items()} for s, by in scores.items()}
    fig = F.scheme_panels_instant(np.arange(n), scores, weights, 2.0 ** -4)
    assert instant.json_bytes(fig) < LIMIT
    alibi = [i for i, t in enumerate(fig.data) if t.name == "ALiBi"]
    assert all(f.traces == tuple(alibi) for f in fig.frames)  # the other schemes travel once, in the figure
    assert [s.label for s in fig.layout.sliders[0].steps] == [f"1/{2 ** e}" for e in range(1, 9)]
    for i, slope in enumerate(SLOPES):
        state = instant.drawn(fig, [(0, i)])
        want = P.compare_schemes(q, k, n, alibi_slope=slope)
        drawn_scores = {t["name"]: instant.array(t["y"]) for t in state["data"] if t["yaxis"] == "y"}
        drawn_weights = {t["name"]: instant.array(t["y"]) for t in state["data"] if t["yaxis"] == "y2"}
        assert drawn_scores.keys() == drawn_weights.keys() == want.keys()
        for name, y in want.items():
            np.testing.assert_array_equal(drawn_scores[name], y)
            np.testing.assert_array_equal(drawn_weights[name], P.softmax_over_distance(y))
