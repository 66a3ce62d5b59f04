"""attnviz.figures.kernel: tile states from tile_map codes, every figure titled with labelled axes, the timing dot
plot, and the Kernel page's rule for when tiling moves less memory than naive attention."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.figures import kernel as figs
from attnviz.kernels import (TILE_FULL, TILE_PARTIAL, TILE_SKIPPED, make_inputs, naive_traffic, tile_map,
                             tiled_steps)


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


def _keys_read(n, block_m, block_n, causal):
    """L, the keys all query blocks read together, from the definition: a query block reads whole key tiles of
    block_n up to the last key its last query may see (every key without the mask), the last tile cut at n."""
    total = 0
    for start in range(0, n, block_m):
        last_seen = min(start + block_m, n) - 1 if causal else n - 1
        total += min(-(-(last_seen + 1) // block_n) * block_n, n)
    return total


@pytest.mark.parametrize("causal", [True, False])
def test_tiling_moves_less_than_naive_exactly_below_the_stated_head_dim(causal):
    """The Kernel page's rule: tiled moves (2N + 2L)·d values (Q, O once; K, V per query block), naive
    4N·d + 4N² (Q, K, V, O and the N x N matrix written and read twice), so tiled < naive iff d < 2N²/(L − N).
    Checked against the stepper's own byte counters and attnviz.kernels.naive_traffic."""
    outcomes = set()
    for n, block_m, block_n in [(1, 16, 16), (16, 16, 16), (40, 16, 32), (100, 16, 16), (130, 32, 16), (97, 64, 128)]:
        keys = _keys_read(n, block_m, block_n, causal)
        for d in (8, 32, 48, 64, 80, 128):
            q, k, v = make_inputs(n, d, dtype="float32", seed=0)
            steps = list(tiled_steps(q, k, v, causal=causal, block_m=block_m, block_n=block_n))
            assert sum(s.k_stop - s.k_start for s in steps) == keys
            tiled = sum(s.bytes_loaded + s.bytes_stored for s in steps)
            assert tiled == (2 * n + 2 * keys) * d * 4
            naive = naive_traffic(n, n, d, 4)
            assert naive["read"] + naive["written"] == (4 * n * d + 4 * n * n) * 4
            saves = keys <= n or d < 2 * n * n / (keys - n)
            assert (tiled < naive["read"] + naive["written"]) == saves, (n, d, block_m, block_n)
            outcomes.add(saves)
    assert outcomes == {True, False}  # the grid holds settings on both sides of the rule


def test_kernel_page_says_when_tiling_does_not_save_traffic():
    """N = 100, d = 80, 16 x 16 tiles, causal (the page's default mask and tiles): tiled moves more than naive."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app_pages" / "kernel.py"),
                           default_timeout=300)
    at.run()
    assert not at.exception, at.exception
    assert (at.select_slider(key="kernel_block_m").value, at.select_slider(key="kernel_block_n").value,
            at.checkbox(key="kernel_causal").value, at.selectbox(key="kernel_dtype").value) == (16, 16, True, "float32")

    def counters_caption():
        return next(c.value for c in at.caption if c.value.startswith("Counters for one head"))

    n, d = at.slider(key="kernel_n").value, at.select_slider(key="kernel_d").value
    keys = _keys_read(n, 16, 16, True)
    tiled, naive = (2 * n + 2 * keys) * d * 4 / 1024, (4 * n * d + 4 * n * n) * 4 / 1024
    assert tiled < naive
    assert f"here tiling moves {tiled:,.1f} KiB against naive's {naive:,.1f} KiB, {naive / tiled:.2g}× less." \
        in counters_caption()
    at.slider(key="kernel_n").set_value(100)
    at.select_slider(key="kernel_d").set_value(80).run()
    assert not at.exception, at.exception
    keys = _keys_read(100, 16, 16, True)  # 16 + 32 + ... + 96 + 100 = 436
    tiled, naive = (200 + 2 * keys) * 80 * 4 / 1024, (4 * 100 * 80 + 4 * 100 * 100) * 4 / 1024
    said = counters_caption()
    assert "saves traffic only while d < 2N²/(L − N)" in said
    assert f"here L = {keys}, so d < {2 * 100 * 100 / (keys - 100):.1f}" in said
    assert f"here tiling moves {tiled:.1f} KiB against naive's {naive:.1f} KiB, {tiled / naive:.2g}× more." in said
