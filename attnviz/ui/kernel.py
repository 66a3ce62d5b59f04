"""The Tiled kernel page's caches: one stepper-and-kernel run per setting, its figures per step, the timing table
and the peak-memory measurements. Every cache is keyed on every setting its result depends on."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import streamlit as st

from attnviz import kernels as kn  # sets TRITON_INTERPRET before Triton is imported when there is no GPU
from attnviz.figures import instant
from attnviz.figures import kernel as figs
from attnviz.ui import build_in_background

MEMORY_SIZES = (128, 256, 512, 1024, 2048)
BLOCKS_TOO_BIG = "Not run: {}. Pick a smaller BLOCK_N or BLOCK_M, a smaller head dim, or float16, and it will run."


@dataclass(frozen=True)
class KernelRun:
    """The stepper's steps, the Triton kernel's trace, the tile map with its edges (positions), and the errors
    against the float64 reference: of the kernel's whole output (kernel_error) and of the stepper's O at the last
    step of each query block (out_error, by step index). One setting; shared by every session: read only."""

    steps: list
    trace: kn.KernelTrace
    codes: np.ndarray
    q_edges: list[int]
    k_edges: list[int]
    kernel_error: float
    out_error: dict[int, float]


# every TileStep keeps its tiles (up to 4096 steps of 128 x 128 scores): hold only the last two settings
@st.cache_resource(max_entries=2, show_spinner=False)
def _kernel_run(n, d, block_m, block_n, causal, dtype, seed, window=None) -> KernelRun:
    q, k, v = kn.make_inputs(n, d, dtype=dtype, seed=seed)
    steps = list(kn.tiled_steps(q, k, v, causal=causal, block_m=block_m, block_n=block_n, window=window))
    out, trace = kn.flash_attention(q, k, v, causal=causal, block_m=block_m, block_n=block_n, trace=True,
                                    window=window)
    reference = kn.reference_attention(q, k, v, causal=causal, window=window)[0, 0].numpy()
    codes = kn.tile_map(n, n, block_m=block_m, block_n=block_n, causal=causal, window=window)
    return KernelRun(steps, trace, codes, [min(i * block_m, n) for i in range(codes.shape[0] + 1)],
                     [min(j * block_n, n) for j in range(codes.shape[1] + 1)],
                     kernel_error=float(np.abs(out[0, 0].double().numpy() - reference).max()),
                     out_error={s.index: float(np.abs(s.out - reference[s.q_start:s.q_stop]).max())
                                for s in steps if s.last})


def kernel_run(n, d, block_m, block_n, causal, dtype, seed, window=None) -> KernelRun | None:
    """The run for these settings (window: a sliding window, with causal), or None after an st.error saying why it
    cannot run (a size over the limits, or blocks that need more shared memory than the GPU has)."""
    reason = kn.refusal(n, d, block_m=block_m, block_n=block_n, causal=causal, dtype=dtype, window=window)
    if reason:
        st.error(f"Not run: {reason}")
        return None
    try:
        with st.spinner("Running the stepper and the Triton kernel…"):
            return _kernel_run(n, d, block_m, block_n, causal, dtype, seed, window)
    except ValueError as exc:  # the kernel's refusals, e.g. blocks that need more shared memory than the GPU has
        st.error(BLOCKS_TOO_BIG.format(exc))
        return None


STEP_STOPS = 64  # the most steps the step view's in-chart slider carries


def step_title(run: KernelRun, index: int) -> str:
    """The step view's title at step `index`: the tile it computes, and on a query block's last key tile, the error
    of its output."""
    step = run.steps[index]
    title = f"Step {index} of {len(run.steps) - 1}: query block {step.q_block}, key block {step.k_block}"
    if step.last:
        title += f"; the block's last, O = acc / l_i: max |O − float64| = {run.out_error[index]:.1e}"
    return title


@st.cache_resource(max_entries=16, show_spinner=False)
def step_view(n, d, block_m, block_n, causal, dtype, seed, window, index) -> tuple:
    """(figure, steps) of the step view at step `index`: figures.kernel.step_view_figure over a window of
    consecutive steps around it (`steps`, a range: at most STEP_STOPS, and as many as fit the frame budget), each a
    frame of its in-chart slider. Kept as an object (plotly reads a figure only to draw it)."""
    run = _kernel_run(n, d, block_m, block_n, causal, dtype, seed, window)

    def states(i: int):
        step = run.steps[i]
        return figs.tile_states(run.codes, [(s.q_block, s.k_block) for s in run.steps[:i]],
                                (step.q_block, step.k_block))

    def view(indices, active):
        return figs.step_view_figure([run.steps[i] for i in indices], [states(i) for i in indices],
                                     [step_title(run, i) for i in indices], active, q_edges=run.q_edges,
                                     k_edges=run.k_edges, causal=causal, window=window)

    stop_bytes = instant.json_bytes({"data": view([index], 0).to_plotly_json()["data"]})
    shown = instant.window(len(run.steps), index, stop_bytes, most=STEP_STOPS)
    return view(shown, index - shown.start), shown


def prefetch_step(n, d, block_m, block_n, causal, dtype, seed, window, index) -> None:
    """Builds the step view at step `index` in the background (into step_view's cache) while the browser draws the
    current one: the Step slider is mostly moved one step on, and then its figure is ready. Any session's prefetch
    fills the shared cache; a step already cached costs nothing."""
    run = _kernel_run(n, d, block_m, block_n, causal, dtype, seed, window)
    if 0 <= index < len(run.steps):
        build_in_background(step_view, [(n, d, block_m, block_n, causal, dtype, seed, window, index)],
                            "attnviz-kernel-prefetch")


@st.cache_data(max_entries=8, show_spinner=False)
def _comparison(n, d, block_m, block_n, causal, dtype, seed) -> list[dict]:
    results = kn.compare_methods(n, d, block_m=block_m, block_n=block_n, causal=causal, dtype=dtype, seed=seed)
    return [r.__dict__ for r in results]


def comparison(n, d, block_m, block_n, causal, dtype, seed) -> list[dict] | None:
    """kernels.compare_methods as dicts (one per method), or None after an st.error when the kernel refuses."""
    try:
        with st.spinner("Running and timing the five methods…"):
            return _comparison(n, d, block_m, block_n, causal, dtype, seed)
    except ValueError as exc:
        st.error(BLOCKS_TOO_BIG.format(exc))
        return None


@st.cache_data(max_entries=16, show_spinner=False)
def memory_at(n, d, block_m, block_n, causal, dtype, seed) -> dict:
    """kernels.peak_memory_at: each torch method's measured peak at this size."""
    return kn.peak_memory_at(n, d, block_m=block_m, block_n=block_n, causal=causal, dtype=dtype, seed=seed)


@st.cache_data(max_entries=16, show_spinner=False)
def memory_scan(d, causal) -> dict:
    """kernels.peak_memory_scan over MEMORY_SIZES with 64 x 64 tiles: it depends on nothing else, so moving N or
    the blocks reuses it."""
    return kn.peak_memory_scan(MEMORY_SIZES, d, block_m=64, block_n=64, causal=causal)
