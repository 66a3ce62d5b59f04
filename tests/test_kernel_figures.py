"""attnviz.figures.kernel: tile states from tile_map codes, every figure titled with labelled axes, the timing dot
plot."""

from __future__ import annotations

import re

import numpy as np
import pytest

from attnviz.figures import kernel as figs
from attnviz.figures import kernel_steps
from attnviz.kernels import TILE_FULL, TILE_MASKED, TILE_SKIPPED, make_inputs, tile_map, tiled_steps


def test_figure_codes_match_the_kernel_module():
    assert (figs.SKIPPED, figs.FULL, figs.MASKED) == (TILE_SKIPPED, TILE_FULL, TILE_MASKED)


def test_tile_states_mark_done_current_skipped_and_partial():
    codes = tile_map(48, 48, block_m=16, block_n=16, causal=True)  # 3 x 3: lower triangle, diagonal masked
    states = figs.tile_states(codes, done=[(0, 0), (1, 0)], current=(1, 1))
    names = np.array(figs.TILE_STATES, dtype=object)[states]
    assert names.tolist() == [
        ["done, masked", "skipped (causal mask)", "skipped (causal mask)"],
        ["done", "current", "skipped (causal mask)"],
        ["to do", "to do", "to do, masked"],
    ]


def test_every_figure_has_a_title_and_axis_titles():
    built = [
        figs.peak_memory_figure([128, 256], {"naive": [2**20, 2**22], "tiled": [2**18, None]}),
        figs.timing_figure(["naive", "SDPA"], [1.0, 0.5]),
    ]
    for fig in built:
        assert fig.layout.title.text
        axes = [fig.layout[a] for a in fig.layout if a.startswith(("xaxis", "yaxis"))]
        assert axes and all(ax.title.text for ax in axes), fig.layout.title.text


def test_timing_figure_is_a_dot_plot_on_a_log_axis_with_every_dot_in_range():
    methods, ms = ["naive", "two-pass tiled", "torch SDPA"], [3.0, 250.0, 0.02]
    fig = figs.timing_figure(methods, ms)
    assert all(trace.type == "scatter" and "markers" in trace.mode for trace in fig.data)  # no bars on a log axis
    (dots,) = fig.data
    assert dict(zip(dots.y, dots.x)) == dict(zip(methods, ms))
    assert list(dots.text) == ["3 ms", "250 ms", "0.02 ms"]  # every dot labelled with its value and unit
    assert fig.layout.xaxis.type == "log" and "ms" in fig.layout.xaxis.title.text
    lo, hi = fig.layout.xaxis.range  # log10 units: the 0.02 ms dot is inside the axis, not at its edge
    assert lo < np.log10(min(ms)) - 0.1 and hi > np.log10(max(ms)) + 0.1


def test_the_tile_key_names_every_state_in_the_colour_the_step_view_fills_it_with():
    """The tile map's key (one annotation) names each state before a square of the colour the step view fills that
    state's tiles with (an outlined square for the near-white one), and the mask's edges it draws."""
    from attnviz.kernels.steps_view import step_view, stepper_run

    filled = set()
    for window in (None, 16):
        fig, _ = step_view(stepper_run(40, 16, block_m=8, block_n=8, causal=True, window=window), 3)
        fills = {t.name: t.fillcolor for t in fig.data if t.fill == "toself"}
        key = figs.tile_key(causal=True, window=window)
        assert key in {a.text for a in fig.layout.annotations}
        entries = re.findall(r"<span style='color:(#[0-9a-f]{6})'>([□■])</span> ([^<\u2003]+)", key)
        assert [name for *_, name in entries] == [s for s in figs.TILE_STATES if window or "window" not in s]
        assert set(fills) <= {name for *_, name in entries}  # the map fills no state the key leaves out
        filled |= set(fills)
        for colour, glyph, name in entries:
            state = figs.TILE_STATES.index(name)
            assert fills[name] == figs.TILE_COLOURS[state]
            assert colour == fills[name] or (glyph == "□" and state == 0)  # the near-white state: outlined
        assert ("window edge (16 keys)" in key) is bool(window) and "causal diagonal" in key
    assert filled == set(figs.TILE_STATES)  # every state drawn in one of the two
    assert "causal diagonal" not in figs.tile_key(causal=False, window=None)


def _boxes(trace: dict) -> set[tuple[float, float]]:
    """The (query, key) top left corners of the tiles a filled line outlines (x, y broken by NaN), each a closed
    rectangle."""
    from attnviz.figures import instant

    x, y = (instant.array(trace[a]).astype(float).reshape(-1, 6) for a in ("x", "y"))
    assert np.isnan(x[:, 5]).all() and np.isnan(y[:, 5]).all()
    assert (x[:, 0] == x[:, 3]).all() and (x[:, 1] == x[:, 2]).all() and (y[:, 0] == y[:, 1]).all()
    return {(float(b), float(a)) for a, b in zip(x[:, 0], y[:, 0])}


def test_the_step_views_slider_draws_the_steppers_state_at_every_step():
    """Each stop of the step view's in-chart slider, replayed as plotly.js applies its frame, draws that step of
    kernels.tiled_steps: the tiles done and the current one, the tile's scores (masked ones blank), m_i, l_i and
    alpha before and after, and the accumulator before and after, each map's picture in its scale's colours and
    its hover with the value and the positions."""
    from attnviz.figures import instant
    from tests.test_figures_raster import QUANTUM, cell_colours, expected_colours

    q, k, v = make_inputs(40, 16)
    steps = list(tiled_steps(q, k, v, causal=True, block_m=16, block_n=16))
    codes = tile_map(40, 40, block_m=16, block_n=16, causal=True)
    states = [figs.tile_states(codes, [(s.q_block, s.k_block) for s in steps[:i]], (step.q_block, step.k_block))
              for i, step in enumerate(steps)]
    edges = [0, 16, 32, 40]
    base = figs.tile_states(codes, [], None)
    fig = kernel_steps.step_view_figure(steps, states, [f"Step {s.index}" for s in steps], 2, base=base, q_edges=edges,
                                k_edges=edges, causal=True)
    assert fig.layout.sliders[0].active == 2
    assert {s.method for s in fig.layout.sliders[0].steps} == {"animate"}  # drawn in place
    figure = instant.figure_dict(fig)
    score_limit = max(np.abs(s.scores[np.isfinite(s.scores)]).max() for s in steps)
    acc_limit = max(max(np.abs(s.acc).max(), np.abs(s.acc_rescaled).max()) for s in steps)

    def finite(x):
        x = np.asarray(x, dtype=float)
        return np.where(np.isfinite(x), x, np.nan)

    for i, step in enumerate(steps):
        state = instant.drawn(figure, [(0, i)])
        assert not [t for t in state["data"] if t["type"] != "scatter"]  # lines only: plotly animates them in place
        boxes = {t["name"]: _boxes(t) for t in state["data"] if t.get("fill") == "toself"}
        for value in (0, 1, 2, 3, 4, 5):  # the map before any step, then the tiles done and the current one
            grid = base if value < 3 else states[i]
            assert boxes[figs.TILE_STATES[value]] == {(edges[a], edges[b]) for a, b in zip(*np.nonzero(grid == value))}
        tiles = {t["hovertemplate"].split("<br>")[1].removesuffix("<extra></extra>"):
                 instant.array(t["customdata"]).tolist()
                 for t in state["data"] if t.get("hovertemplate", "").startswith("queries")}
        assert tiles == {"computed without a mask": [[16, 31, 0, 15], [32, 39, 0, 15], [32, 39, 16, 31]],
                         "computed masked (the diagonal, a window's edge or the ragged last block)":
                             [[0, 15, 0, 15], [16, 31, 16, 31], [32, 39, 32, 39]],
                         "skipped: the causal mask hides it": [[0, 15, 16, 31], [0, 15, 32, 39], [16, 31, 32, 39]]}
        assert [t["text"][0] for t in state["data"] if t.get("mode") == "text"] == [
            figs.scores_title(step.scores, step.q_start, step.k_start), f"Step {step.index}"]
        hovers = [t for t in state["data"] if t.get("line", {}).get("width") == 0 and "customdata" in t
                  and not t["hovertemplate"].startswith("queries")]  # the maps' (not the tile map's)
        for hover, image, values, limit in zip(hovers, state["layout"]["images"],
                                               (step.scores, step.acc_rescaled, step.acc),
                                               (score_limit, acc_limit, acc_limit)):
            values = np.asarray(values, dtype=float)
            rows, cols = np.nonzero(np.isfinite(values))  # a masked score (-inf) has no hover
            custom = instant.array(hover["customdata"])
            np.testing.assert_array_equal(custom[:, 0], values[rows, cols])  # the kernel's own float32 numbers
            np.testing.assert_array_equal(custom[:, 1], step.q_start + rows)
            np.testing.assert_array_equal(instant.array(hover["x"]), cols)
            np.testing.assert_allclose(cell_colours(image, values.shape),  # a masked score blank (white)
                                       expected_colours(finite(values), "RdBu_r", -limit, limit), atol=QUANTUM)
        np.testing.assert_array_equal(instant.array(hovers[0]["customdata"])[:, 2],
                                      step.k_start + np.nonzero(np.isfinite(step.scores))[1])
        assert [instant.array(h["customdata"]).shape[1] for h in hovers] == [3, 2, 2]
        lines = {(t["name"], t["xaxis"]): t for t in state["data"] if t.get("legend") == "legend2"}
        for (name, axis), want in {("before", "x3"): step.m_prev, ("after", "x3"): step.m_i,
                                   ("before", "x4"): step.l_prev, ("after", "x4"): step.l_i,
                                   ("alpha", "x5"): step.alpha}.items():
            np.testing.assert_array_equal(instant.array(lines[(name, axis)]["y"]), finite(want))
            np.testing.assert_array_equal(instant.array(lines[(name, axis)]["x"]),
                                          np.arange(step.q_stop - step.q_start))
            np.testing.assert_array_equal(instant.array(lines[(name, axis)]["customdata"]),
                                          np.arange(step.q_start, step.q_stop))
    axes = [figure["layout"][a] for a in figure["layout"] if a.startswith(("xaxis", "yaxis"))]
    assert len(axes) == 14 and all(a["title"]["text"] for a in axes)
    # a frame restyles what a step changes, nothing else: not the tile map under the steps, not a colour bar (a
    # restyled one is drawn again, at every step), whatever stop the figure is drawn at
    for active in (0, 2, len(steps) - 1):
        moving = kernel_steps.step_view_figure(steps, states, [f"Step {s.index}" for s in steps], active, base=base,
                                               q_edges=edges, k_edges=edges, causal=True)
        restyled = {t for f in moving.frames for t in f.traces}
        fixed = len(kernel_steps.tile_map_lines(base, edges, edges, causal=True, window=None))
        bars = {i for i, t in enumerate(moving.data) if t.marker.showscale}
        assert len(bars) == 2 and not bars & restyled and not set(range(fixed)) & restyled, active
        assert {moving.data[t].name for t in restyled} >= {figs.TILE_STATES[v] for v in (3, 4, 5)}


@pytest.mark.parametrize("n, block, causal, window", [(40, 8, True, 16), (37, 16, False, None)])
def test_the_step_view_built_unchecked_is_the_figure_plotly_would_check(monkeypatch, n, block, causal, window):
    """The step view skips plotly.py's validation (laid_out(validate=False)): its JSON, frames and slider included,
    equals that of the same view built with validation (a ragged last block, a window, no mask)."""
    import json

    from attnviz.figures import common, kernel_steps
    from attnviz.kernels.steps_view import step_view, stepper_run

    run = stepper_run(n, 16, block_m=block, block_n=block, causal=causal, window=window)
    fast, _ = step_view(run, 3)
    assert fast._validate is False and len(fast.frames) > 1
    monkeypatch.setattr(kernel_steps, "laid_out", lambda *a, validate=False, **k: common.laid_out(*a, **k))
    checked, _ = step_view(run, 3)
    assert checked._validate is True
    assert json.loads(fast.to_json()) == json.loads(checked.to_json())
