"""attnviz.figures.kernel: tile states from tile_map codes, and every figure titled with labelled axes."""

from __future__ import annotations

import numpy as np

from attnviz.figures import kernel as figs
from attnviz.kernels import TILE_FULL, TILE_PARTIAL, TILE_SKIPPED, make_inputs, tile_map, tiled_steps


def test_figure_codes_match_the_kernel_module():
    assert (figs.SKIPPED, figs.FULL, figs.PARTIAL) == (TILE_SKIPPED, TILE_FULL, TILE_PARTIAL)


def test_tile_states_mark_done_current_skipped_and_partial():
    codes = tile_map(48, 48, block_m=16, block_n=16, causal=True)  # 3 x 3: lower triangle, diagonal partial
    states = figs.tile_states(codes, done=[(0, 0), (1, 0)], current=(1, 1))
    names = np.array(figs.TILE_STATES, dtype=object)[states]
    assert names.tolist() == [
        ["done, partly masked", "skipped (causal mask)", "skipped (causal mask)"],
        ["done", "current", "skipped (causal mask)"],
        ["to do", "to do", "to do, partly masked"],
    ]


def test_every_figure_has_a_title_and_axis_titles():
    q, k, v = make_inputs(40, 16)
    step = list(tiled_steps(q, k, v, causal=True, block_m=16, block_n=16))[3]
    codes = tile_map(40, 40, block_m=16, block_n=16, causal=True)
    rows = np.arange(step.q_start, step.q_stop)
    built = [
        figs.tile_map_figure(figs.tile_states(codes, [], (1, 1)), [0, 16, 32, 40], [0, 16, 32, 40], causal=True),
        figs.tile_scores_figure(step.scores, step.q_start, step.k_start, title="S"),
        figs.accumulator_figure(step.acc, step.q_start, title="acc"),
        figs.state_figure(rows, step.m_prev, step.m_i, step.l_prev, step.l_i, step.alpha),
        figs.peak_memory_figure([128, 256], {"naive": [2**20, 2**22], "tiled": [2**18, None]}),
        figs.timing_figure(["naive", "SDPA"], [1.0, 0.5]),
    ]
    for fig in built:
        assert fig.layout.title.text
        axes = [fig.layout[a] for a in fig.layout if a.startswith(("xaxis", "yaxis"))]
        assert axes and all(ax.title.text for ax in axes), fig.layout.title.text
