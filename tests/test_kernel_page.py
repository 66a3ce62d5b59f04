"""The Tiled kernel page (app_pages/kernel.py through attnviz.ui.kernel): refusals shown as errors, the memory scan
measured once per head dim, the traffic verdict, and on a GPU the timings with the device's name."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tests.kernel_cases import keys_read_by_definition, needs_gpu


@pytest.fixture(autouse=True)
def no_build_left_behind():
    """After each test, the kernel page's builds ahead are stopped or waited for: a build a page run here asked for
    a second later would otherwise run into the next test, under its patches."""
    yield
    from attnviz.ui import kernel as uk
    from attnviz.ui.background import running_builds

    uk.build_in_background(uk._ahead, [], "attnviz-kernel-elsewhere", wait_s=1.0)  # supersedes a waiting one
    for thread in running_builds():
        thread.join(60)
        assert not thread.is_alive(), f"a build ran over a minute: {thread.name}"


def test_each_size_of_run_has_a_cache_of_its_own(monkeypatch):
    """A tiny run stays cached after a small one was run: the three sizes' caches are three (one name asked for
    again with another max_entries would replace Streamlit's cache, empty)."""
    import streamlit as st

    from attnviz.kernels import steps_view
    from attnviz.ui import kernel as uk

    st.cache_resource.clear()
    calls, real = [], steps_view.stepper_run
    monkeypatch.setattr(steps_view, "stepper_run", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert uk._size(64, 16, 16, True) == "tiny" and uk._size(400, 32, 32, True) == "small"
    tiny = uk._kernel_run(64, 16, 16, 16, True, "float32", 0)
    uk._kernel_run(400, 16, 32, 32, True, "float32", 0)
    uk._kernel_checks(64, 16, 16, 16, True, "float32", 0)
    uk._kernel_checks(400, 16, 32, 32, True, "float32", 0)
    assert uk._kernel_run(64, 16, 16, 16, True, "float32", 0) is tiny and len(calls) == 2
    st.cache_resource.clear()


def kernel_page(timeout: int):
    """The Tiled kernel page under AppTest, not run yet."""
    from streamlit.testing.v1 import AppTest

    from attnviz.ui import PAGES

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return AppTest.from_file(os.path.join(root, next(p.script for p in PAGES if p.url_path == "kernel")),
                             default_timeout=timeout)


def recorded(monkeypatch, name: str) -> list:
    """Every call's positional arguments to attnviz.kernels.<name>, which still runs."""
    import attnviz.kernels as kn

    calls, real = [], getattr(kn, name)
    monkeypatch.setattr(kn, name, lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


def test_kernel_page_shows_an_error_when_the_kernel_refuses(monkeypatch):
    import streamlit as st

    from attnviz.kernels import KernelError, steps_view

    def refuse(*args, **kwargs):  # the kernel's own refusal class; a plain ValueError would be a bug and surface
        raise KernelError("BLOCK_M = 128, BLOCK_N = 128 with head dim 128 need more shared memory than this GPU has")

    monkeypatch.setattr(steps_view, "flash_attention", refuse)  # the step view's run (attnviz.kernels.steps_view)
    st.cache_resource.clear()
    st.cache_data.clear()

    at = kernel_page(120)
    at.run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error if "shared memory" in e.value and "smaller BLOCK_N" in e.value] != []
    assert len(at.error) == 1 and at.get("plotly_chart"), "the step view is drawn from the stepper, the error once"
    at.session_state["kernel_tab"] = "2. From naive to fused"
    at.run()
    st.cache_resource.clear()
    assert not at.exception, at.exception
    assert len(at.error) == 1 and "shared memory" in at.error[0].value  # said once, not again by the timing


def test_kernel_page_measures_memory_once_per_head_dim_not_per_n(monkeypatch):
    import streamlit as st

    scans = recorded(monkeypatch, "peak_memory_scan")
    st.cache_data.clear()
    at = kernel_page(180)
    at.session_state["kernel_tab"] = "3. Peak memory, naive vs tiled"  # its tab, opened as a click would
    at.run()
    at.toggle(key="kernel_memory").set_value(True).run()
    assert not at.exception, at.exception
    n = at.slider(key="kernel_n").value
    naive = next(m for m in at.metric if m.label.startswith("naive"))
    # naive holds at least the float32 [N, N] score matrix
    assert float(naive.value.split()[0].replace(",", "")) * 2**20 >= n * n * 4 * 0.99
    at.slider(key="kernel_n").set_value(n + 1).run()
    assert not at.exception, at.exception
    assert f"N = {n + 1}" in " ".join(m.label for m in at.metric)
    assert len(scans) == 1, "the scan over N was measured again when only N moved"
    st.cache_data.clear()


@needs_gpu
def test_gpu_kernel_page_shows_gpu_timings_with_the_device_name():
    import streamlit as st

    st.cache_data.clear()
    st.cache_resource.clear()
    at = kernel_page(300)
    at.session_state["kernel_tab"] = "2. From naive to fused"  # the timing table's tab
    at.run()
    at.slider(key="kernel_n").set_value(1024)
    at.select_slider(key="kernel_d").set_value(64)
    at.select_slider(key="kernel_block_m").set_value(128)
    at.select_slider(key="kernel_block_n").set_value(64)
    at.selectbox(key="kernel_dtype").set_value("bfloat16")
    at.run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    table = at.dataframe[0].value
    kernel = table[table["method"] == "fused Triton kernel"].iloc[0]
    assert float(kernel["max |O − O_float64|"]) < 3e-2
    assert "TFLOPS on " + torch.cuda.get_device_name() in kernel["how to read the time"]
    assert not any("interpreter" in i.value for i in at.info)
    st.cache_data.clear()
    st.cache_resource.clear()


def test_kernel_page_says_when_tiling_does_not_save_traffic():
    """N = 100, d = 80, 16 x 16 tiles, causal (the page's default mask and tiles): tiled moves more than naive."""
    at = kernel_page(300)
    at.run()
    assert not at.exception, at.exception
    assert (at.select_slider(key="kernel_block_m").value, at.select_slider(key="kernel_block_n").value,
            at.checkbox(key="kernel_causal").value, at.selectbox(key="kernel_dtype").value) == (16, 16, True, "float32")

    def counters_caption():
        return next(c.value for c in at.caption if c.value.startswith("Counters for one head"))

    n, d = at.slider(key="kernel_n").value, at.select_slider(key="kernel_d").value
    keys = keys_read_by_definition(n, 16, 16, True)
    tiled, naive = (2 * n + 2 * keys) * d * 4 / 1024, (4 * n * d + 4 * n * n) * 4 / 1024
    assert tiled < naive
    assert f"here tiling moves {tiled:,.1f} KiB against naive's {naive:,.1f} KiB, {naive / tiled:.2g}× less." \
        in counters_caption()
    at.slider(key="kernel_n").set_value(100)
    at.select_slider(key="kernel_d").set_value(80).run()
    assert not at.exception, at.exception
    keys = keys_read_by_definition(100, 16, 16, True)  # 16 + 32 + ... + 96 + 100 = 436
    tiled, naive = (200 + 2 * keys) * 80 * 4 / 1024, (4 * 100 * 80 + 4 * 100 * 100) * 4 / 1024
    said = counters_caption()
    assert "saves traffic only while d < 2N²/(L − N)" in said
    assert f"here L = {keys}, so d < {2 * 100 * 100 / (keys - 100):.1f}" in said
    assert f"here tiling moves {tiled:.1f} KiB against naive's {naive:.1f} KiB, {tiled / naive:.2g}× more." in said


def test_only_the_open_tab_runs_its_work(monkeypatch):
    """The five methods are timed when their tab is open, not on every setting moved with the stepper's tab open."""
    import streamlit as st

    timed = recorded(monkeypatch, "compare_methods")
    st.cache_data.clear()
    at = kernel_page(180)
    at.run()
    at.slider(key="kernel_n").set_value(48).run()
    assert not at.exception, at.exception
    assert timed == [] and not at.dataframe
    assert len(at.get("plotly_chart")) == 1  # the step view
    at.session_state["kernel_tab"] = "2. From naive to fused"
    at.run()
    assert not at.exception, at.exception
    assert [a[0] for a in timed] == [48] and len(at.dataframe) == 1
    st.cache_data.clear()


def test_a_refused_size_says_why_and_every_other_section_is_still_drawn():
    """N = 4,096 with 16 x 16 tiles is refused here (over the interpreter's time, or over the stepper's steps on a
    GPU): the reason is shown above the page's tabs, and each tab still draws what needs no run: the traffic counters,
    the timing tab's note and the memory scan."""
    import streamlit as st

    import attnviz.kernels as kn

    st.cache_data.clear()
    at = kernel_page(180)
    at.run()
    at.slider(key="kernel_n").set_value(4096).run()
    assert not at.exception, at.exception
    d = at.select_slider(key="kernel_d").value
    reason = kn.refusal(4096, d, block_m=16, block_n=16, causal=True, dtype="float32")
    assert reason is not None
    assert [e.value for e in at.error] == [f"Not run: {reason}"]
    # the counters, by the definitions: 256 query blocks of 16, block i reads 16 (i + 1) keys when causal
    keys = keys_read_by_definition(4096, 16, 16, True)
    assert keys == sum(16 * (i + 1) for i in range(256))
    tiled, naive = (2 * 4096 + 2 * keys) * d * 4 / 1024, (4 * 4096 * d + 4 * 4096 * 4096) * 4 / 1024
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Tile steps it would run"] == f"{256 * 257 // 2:,}"
    assert metrics["Keys read by all query blocks (L)"] == f"{keys:,}"
    assert metrics["Tiled, all steps: bytes moved"] == f"{tiled:,.1f} KiB"
    assert metrics["Naive: bytes moved"] == f"{naive:,.1f} KiB"
    said = next(c.value for c in at.caption if c.value.startswith("Counters for one head"))
    assert f"here tiling moves {tiled:,.1f} KiB against naive's {naive:,.1f} KiB, {naive / tiled:.2g}× less." in said
    at.session_state["kernel_tab"] = "2. From naive to fused"  # each tab, opened as a click would
    at.run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error] == [f"Not run: {reason}"]
    assert any(i.value.startswith("Not timed at these settings") for i in at.info)
    assert not at.dataframe  # no timing table: nothing was run
    at.session_state["kernel_tab"] = "3. Peak memory, naive vs tiled"
    at.run()
    at.toggle(key="kernel_memory").set_value(True).run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error] == [f"Not run: {reason}"]
    assert any(i.value.startswith("Not measured at N = 4,096") for i in at.info)
    assert len(at.get("plotly_chart")) == 1  # the scan over N, which does not depend on this N
    st.cache_data.clear()


def test_a_sliding_window_on_the_kernel_page():
    """N = 96 with a window of 16 keys and 16 x 16 tiles: the step slider walks exactly the tiles the window and the
    causal mask leave (kernels.tile_steps, against the mask block by block), the tile map shows the skipped ones in
    their own state, and the kernel's output matches float64 under the window."""
    import json


    from attnviz.attention import MaskRule
    from attnviz.figures import instant

    at = kernel_page(300)
    at.session_state["kernel_n"] = 96
    at.session_state["kernel_window"] = 16
    at.run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    visible = MaskRule(96, 96, causal=True, window=16).rows(0, 96)
    tiles = sum(visible[i:i + 16, j:j + 16].any() for i in range(0, 96, 16) for j in range(0, 96, 16))
    assert at.slider(key="kernel_step").max + 1 == tiles == 11  # 6 diagonal tiles and the 5 the edge cuts
    step = json.loads(at.get("plotly_chart")[0].proto.spec)
    names = {trace.get("name") for trace in step["data"]}
    key = "".join(note["text"] for note in step["layout"]["annotations"])  # the tile map's key
    assert "window edge (16 keys)" in names and "skipped (sliding window)" in key and "window edge (16 keys)" in key
    window_tiles = next(t for t in step["data"] if t.get("name") == "skipped (sliding window)")
    x = instant.array(window_tiles["x"])  # a typed array or, as ui.plot sends a small figure, lists: 6 points a tile
    assert len(x) == 6 * (36 - 6 - 5 - 15)  # 36 tiles: 15 right of the diagonal, 10 left of the window
    at.slider(key="kernel_step").set_value(tiles - 1).run()
    assert any("Done." in s.value for s in at.success)


def test_the_step_view_carries_a_window_of_steps_that_fits_its_budget():
    """Every step at the page's defaults (10 steps); at N = 256 (136 steps) a window of consecutive steps around the
    chosen one, at most STEP_STOPS, the figure under 2 MB, its slider labelled by step index and starting there."""
    import streamlit as st

    from attnviz.figures import instant
    from attnviz.ui import kernel as uk

    fig, shown = uk.step_view(64, 32, 16, 16, True, "float32", 0, None, 3)
    assert shown == range(10) and fig.layout.sliders[0].active == 3
    fig, shown = uk.step_view(256, 32, 16, 16, True, "float32", 0, None, 100)
    assert 100 in shown and 1 < len(shown) <= uk.STEP_STOPS
    assert instant.json_bytes(fig) < 2_000_000
    slider = fig.layout.sliders[0]
    assert [s.label for s in slider.steps] == [str(i) for i in shown] and slider.steps[slider.active].label == "100"
    assert [t.text[0] for t in fig.data if t.type == "scatter" and t.mode == "text"][-1].startswith("Step 100 of 135:")
    st.cache_resource.clear()


def test_the_step_views_library_run_refuses_what_cannot_run_here_with_the_reason():
    """attnviz.kernels.steps_view, which the page and its Reproduce in Python code call: a size over the limits is
    refused with kernels.refusal's reason, a step the run does not have with its range; both AttnvizErrors."""
    import re

    import pytest

    import attnviz.kernels as kn
    from attnviz.errors import AttnvizError
    from attnviz.kernels import steps_view

    big = dict(block_m=16, block_n=16, causal=False, dtype="float32")
    reason = kn.refusal(4096, 128, **big)
    if reason:  # no GPU: the interpreter's step limit
        with pytest.raises(steps_view.KernelRefused, match=re.escape(reason)):
            steps_view.kernel_run(4096, 128, **big)
    run = steps_view.kernel_run(32, 8, block_m=16, block_n=16, causal=True)
    assert len(run.steps) == 3  # 2 x 2 tiles, the one right of the diagonal skipped
    with pytest.raises(AttnvizError, match="not one of this run's steps 0–2"):
        steps_view.step_view(run, 3)


def test_the_stepper_run_and_the_kernels_checks_make_the_whole_run():
    """stepper_run (all the step view needs) has no kernel part; kernel_checks' output is softmax(q kᵀ/√d) v in
    float64, written out here with its causal sliding window, its error is that distance, and its trace is the
    stepper's running max and sum at every step; kernel_run is the two together."""
    import math

    from attnviz.kernels import make_inputs, steps_view, trace_difference

    tiles = dict(block_m=16, block_n=32, causal=True, dtype="float32", seed=4, window=24)
    stepped = steps_view.stepper_run(70, 16, **tiles)
    assert (stepped.trace, stepped.kernel_error, stepped.kernel_call) == (None, None, None)
    checks = steps_view.kernel_checks(70, 16, **tiles)
    q, k, v = (x[0, 0].double() for x in make_inputs(70, 16, dtype="float32", seed=4))
    i, j = torch.arange(70)[:, None], torch.arange(70)[None, :]
    scores = (q @ k.T / math.sqrt(16)).masked_fill((j > i) | (j <= i - 24), float("-inf"))
    out = checks["kernel_call"][1][0, 0].double()
    distance = float((out - torch.softmax(scores, -1) @ v).abs().max())
    assert distance < 1e-5 and checks["kernel_error"] == pytest.approx(distance, abs=1e-12)
    for step in stepped.steps:
        assert max(trace_difference(checks["trace"], step)) < 1e-4, step.index
    whole = steps_view.kernel_run(70, 16, **tiles)
    assert whole.kernel_error == checks["kernel_error"] and whole.out_error == stepped.out_error
    np.testing.assert_array_equal(whole.trace.m_i, checks["trace"].m_i)
    assert len(whole.steps) == len(stepped.steps)


def test_a_control_moved_prefetches_the_small_runs_one_step_either_way(monkeypatch):
    """After N moved to 521 (a small run, not a tiny one), the step views of N = 520 and 522 are built in the
    background at the step shown (clamped to their own steps); after BLOCK_M moved to 128, its one neighbour (64);
    after the window moved to 8 keys, 16 keys and no window first; nothing when nothing moved, no window without the
    causal mask, and never a size this machine refuses or a run over SMALL_RUN."""
    from attnviz import kernels as kn
    from attnviz.ui import kernel as uk

    asked, elsewhere = [], []

    def build(cached, calls, name, **kw):
        (asked if name == "attnviz-kernel-neighbours" else elsewhere).append((cached, calls))

    monkeypatch.setattr(uk, "build_in_background", build)
    base = dict(n=521, d=32, block_m=16, block_n=16, causal=True, dtype="float32", seed=3, window=None)
    assert uk._size(521, 16, 16, True) == "small"
    uk.prefetch_neighbours(base, {**base, "n": 520}, 20)
    assert asked[-1][0] is uk._ahead  # the step view and the kernel's checks
    steps = {n: kn.tile_steps(n, n, block_m=16, block_n=16, causal=True) for n in (520, 522)}
    # N went up: the next N up first (a control is mostly moved on the same way)
    assert asked[-1][1] == [(n, 32, 16, 16, True, "float32", 3, None, min(20, steps[n] - 1)) for n in (522, 520)]
    uk.prefetch_neighbours(base, {**base, "n": 522}, 20)
    assert [call[0] for call in asked[-1][1]] == [520, 522]
    uk.prefetch_neighbours({**base, "block_m": 128}, {**base, "block_m": 64}, 0)
    assert [call[2] for call in asked[-1][1]] == [64]
    before = len(asked)
    uk.prefetch_neighbours(base, base, 0)
    assert len(asked) == before  # nothing moved: nothing built
    uk.prefetch_neighbours({**base, "window": 8}, base, 0)  # the window moved on from "off": 16 first, then off
    assert [call[7] for call in asked[-1][1]] == [16, None]
    uncausal = {**base, "causal": False}  # the causal mask taken off: no window to move to
    uk.prefetch_neighbours(uncausal, {**uncausal, "window": 8}, 0)
    assert [call[7] for call in asked[-1][1]] == []
    big = {**base, "n": 1100, "block_m": 128, "block_n": 128, "causal": False}  # 81 steps of 128 x 128
    assert kn.refusal(1100, 32, block_m=128, block_n=128, causal=False, dtype="float32") is None
    assert not uk.is_small(1100, 128, 128, False) and uk.is_small(1024, 128, 128, False)  # 64 steps: 2**20
    uk.prefetch_neighbours(big, {**big, "seed": 2}, 0)
    assert asked[-1][1] == []
    assert all(calls == [] for _, calls in elsewhere[:3])  # N and BLOCK_M moved: small runs, not tiny ones


def test_a_tiny_run_prefetches_a_step_away_on_every_control(monkeypatch):
    """At a tiny run (the page's defaults), the first run builds the setting one step either way of every control,
    in the page's order; after a move, the moved control's first (the way it moved first), then every other
    control's, none twice. A causal mask taken off takes the window with it."""
    from attnviz.ui import kernel as uk

    asked = []
    monkeypatch.setattr(uk, "build_in_background", lambda cached, calls, name, **kw: asked.append((name, kw, calls)))
    base = dict(n=64, d=32, block_m=16, block_n=16, causal=True, dtype="float32", seed=3, window=16)
    assert uk._size(64, 16, 16, True, 16) == "tiny" and uk._size(64, 16, 16, True) == "tiny"

    def moved(**change):
        return {**base, **change}

    def calls(settings):
        return [(*(s[k] for k in ("n", "d", "block_m", "block_n", "causal", "dtype", "seed", "window")), 2)
                for s in settings]

    every = [moved(n=63), moved(n=65), moved(d=16), moved(d=48), moved(block_m=32), moved(block_n=32),
             moved(causal=False, window=None), moved(window=8), moved(window=32), moved(dtype="float16"),
             moved(seed=2), moved(seed=4)]
    later = ("attnviz-kernel-elsewhere", {"wait_s": uk.ELSEWHERE_WAIT_S})
    uk.prefetch_neighbours(base, None, 2)  # the first run: nothing moved yet, every control's a second later
    assert asked[-2:] == [("attnviz-kernel-neighbours", {}, []), (*later, calls(every))]
    uk.prefetch_neighbours(base, moved(seed=2), 2)
    first = [moved(seed=4), moved(seed=2)]
    assert asked[-2:] == [("attnviz-kernel-neighbours", {}, calls(first)),
                          (*later, calls([s for s in every if s not in first]))]
    before = len(asked)
    uk.prefetch_neighbours(base, base, 2)
    assert len(asked) == before


def test_neighbours_one_step_either_way():
    from attnviz.ui import neighbours

    assert neighbours([8, 16, 32], 16) == [8, 32]
    assert neighbours([8, 16, 32], 8) == [16]
    assert neighbours([8, 16, 32], 12) == []
    assert neighbours((1, 4096), 1) == [2]
    assert neighbours((1, 4096), 4096) == [4095]
    assert neighbours((0, 10), 5) == [4, 6]
    # the one further in the direction of the move first
    assert neighbours([8, 16, 32], 16, 8) == [32, 8] and neighbours([8, 16, 32], 16, 32) == [8, 32]
    assert neighbours((0, 10), 5, 4) == [6, 4] and neighbours((0, 10), 5, 6) == [4, 6]
    assert neighbours((0, 10), 10, 9) == [9] and neighbours([8, 16, 32], 16, 12) == [8, 32]
    # None an option (the window's "off"): moved on from it is a move, no move at all is none
    assert neighbours([None, 8, 16], 8, None) == [16, None] and neighbours([None, 8, 16], 8) == [None, 16]
