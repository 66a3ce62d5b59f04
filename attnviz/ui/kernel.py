"""The Tiled kernel page's caches: one stepper run per setting and, apart, its Triton kernel's checks (the page
draws the step view before it runs the interpreted kernel), its figures per step, the timing table and the
peak-memory measurements. Every cache is keyed on every setting its result depends on."""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

from attnviz.errors import AttnvizError
from attnviz import kernels as kn  # sets TRITON_INTERPRET before Triton is imported when there is no GPU
from attnviz.kernels import steps_view as kview
from attnviz.kernels.steps_view import STEP_STOPS, KernelRun  # noqa: F401  (STEP_STOPS: the page's bound)
from attnviz.ui import build_in_background, moved_neighbours

MEMORY_SIZES = (128, 256, 512, 1024, 2048)
BLOCKS_TOO_BIG = "Not run: {}. Pick a smaller BLOCK_N or BLOCK_M, a smaller head dim, or float16, and it will run."


# Every TileStep keeps its tiles (up to 4096 steps of 128 x 128 scores): large runs are held for the last two
# settings only; small ones (SMALL_RUN score elements at most) for eight, the settings one step either way of the
# control just moved among them (prefetch_neighbours).
SMALL_RUN = 2**20


@st.cache_resource(max_entries=2, show_spinner=False)
def _large_run(n, d, block_m, block_n, causal, dtype, seed, window=None) -> KernelRun:
    return kview.stepper_run(n, d, block_m=block_m, block_n=block_n, causal=causal, dtype=dtype, seed=seed,
                             window=window)


@st.cache_resource(max_entries=8, show_spinner=False)
def _small_run(n, d, block_m, block_n, causal, dtype, seed, window=None) -> KernelRun:
    return kview.stepper_run(n, d, block_m=block_m, block_n=block_n, causal=causal, dtype=dtype, seed=seed,
                             window=window)


def _checks(n, d, block_m, block_n, causal, dtype, seed, window=None) -> dict:
    """The kernel's trace, error and timed call (kview.kernel_checks), or {"refused": why} when the kernel refuses
    these blocks (kept too: a Step move does not launch a refused kernel again)."""
    try:
        return kview.kernel_checks(n, d, block_m=block_m, block_n=block_n, causal=causal, dtype=dtype, seed=seed,
                                   window=window)
    except AttnvizError as exc:
        return {"refused": str(exc)}


# a trace holds three [key block, query] arrays: kept for as many settings as the runs of its size
_large_checks = st.cache_resource(max_entries=2, show_spinner=False)(_checks)
_small_checks = st.cache_resource(max_entries=8, show_spinner=False)(_checks)


def _kernel_checks(n, d, block_m, block_n, causal, dtype, seed, window=None) -> dict:
    return _by_size(_small_checks, _large_checks, n, d, block_m, block_n, causal, dtype, seed, window)


def is_small(n, block_m, block_n, causal, window=None) -> bool:
    """Whether a run's tiles hold at most SMALL_RUN score elements (its steps times BLOCK_M x BLOCK_N)."""
    return kn.tile_steps(n, n, block_m=block_m, block_n=block_n, causal=causal, window=window) * block_m * block_n \
        <= SMALL_RUN


def _kernel_run(n, d, block_m, block_n, causal, dtype, seed, window=None) -> KernelRun:
    """The shared stepper run of these settings, from the cache its size belongs to."""
    return _by_size(_small_run, _large_run, n, d, block_m, block_n, causal, dtype, seed, window)


def _by_size(small, large, n, d, block_m, block_n, causal, dtype, seed, window):
    """small(...) or large(...) of these settings: the cache a run of their size (is_small) is kept in."""
    cached = small if is_small(n, block_m, block_n, causal, window) else large
    return cached(n, d, block_m, block_n, causal, dtype, seed, window)


def kernel_run(n, d, block_m, block_n, causal, dtype, seed, window=None) -> KernelRun | None:
    """The stepper's run for these settings (window: a sliding window, with causal; no kernel checks: checked_run),
    or None after an st.error saying why it cannot run (a size over the limits, or blocks that need more shared
    memory than the GPU has: kn.refusal)."""
    reason = kn.refusal(n, d, block_m=block_m, block_n=block_n, causal=causal, dtype=dtype, window=window)
    if reason:
        st.error(f"Not run: {reason}")
        return None
    with st.spinner("Running the stepper…"):
        return _kernel_run(n, d, block_m, block_n, causal, dtype, seed, window)


def checked_run(run: KernelRun, n, d, block_m, block_n, causal, dtype, seed, window=None) -> KernelRun | None:
    """run (these settings' kernel_run) with the Triton kernel's trace, error and timed call, or None after an
    st.error saying why the kernel refuses (blocks that need more shared memory than the GPU has)."""
    with st.spinner("Running the Triton kernel…"):
        checks = _kernel_checks(n, d, block_m, block_n, causal, dtype, seed, window)
    if "refused" in checks:
        st.error(BLOCKS_TOO_BIG.format(checks["refused"]))
        return None
    return replace(run, **checks)


@st.cache_resource(max_entries=16, show_spinner=False)
def step_view(n, d, block_m, block_n, causal, dtype, seed, window, index) -> tuple:
    """(figure, steps) of the step view at step `index` (attnviz.kernels.steps_view.step_view: a window of
    consecutive steps around it, each a stop of its in-chart slider). Kept as an object (plotly reads a figure
    only to draw it)."""
    return kview.step_view(_kernel_run(n, d, block_m, block_n, causal, dtype, seed, window), index)


def prefetch_step(n, d, block_m, block_n, causal, dtype, seed, window, index) -> None:
    """Builds the step view at step `index` in the background (into step_view's cache) while the browser draws the
    current one: the Step slider is mostly moved one step on, and then its figure is ready. Any session's prefetch
    fills the shared cache; a step already cached costs nothing."""
    run = _kernel_run(n, d, block_m, block_n, causal, dtype, seed, window)
    if 0 <= index < len(run.steps):
        build_in_background(step_view, [(n, d, block_m, block_n, causal, dtype, seed, window, index)],
                            "attnviz-kernel-prefetch")


N_RANGE, SEED_RANGE = (1, 4096), (0, 10_000)  # the page's N slider and seed bounds
HEAD_DIMS = [8, 16, 32, 48, 64, 80, 96, 128]  # the head dim control's options
BLOCKS = [16, 32, 64, 128]  # BLOCK_M's and BLOCK_N's
WINDOWS = [8, 16, 32, 64, 128, 256, 512, 1024]  # the sliding window's, in keys, after "off"


def prefetch_neighbours(setting: dict, previous: dict | None, index: int) -> None:
    """Builds, in the background, the step view one step either way of the control just moved (setting, previous:
    {"n", "d", "block_m", "block_n", "causal", "dtype", "seed", "window"} of this run and the last; index: the
    step shown), for small runs that can run here: a control moved again by a step then finds its run, figure and
    kernel checks ready. Nothing is built when nothing moved."""
    if previous is None:
        return
    steps = {"n": N_RANGE, "d": HEAD_DIMS, "block_m": BLOCKS, "block_n": BLOCKS, "seed": SEED_RANGE,
             **({"window": [None, *WINDOWS]} if setting["causal"] else {})}  # a window only with the causal mask
    calls = [_prefetchable(s, index) for s in moved_neighbours(setting, previous, steps)]
    build_in_background(_ahead, [call for call in calls if call is not None], "attnviz-kernel-neighbours")


def _ahead(n, d, block_m, block_n, causal, dtype, seed, window, index) -> None:
    """The step view at `index` and the kernel's checks of these settings, into their caches."""
    step_view(n, d, block_m, block_n, causal, dtype, seed, window, index)
    _kernel_checks(n, d, block_m, block_n, causal, dtype, seed, window)


def _prefetchable(s: dict, index: int) -> tuple | None:
    """step_view's arguments for the setting s at the step shown (within its steps), or None when s cannot run here
    or is not a small run."""
    tiles = dict(block_m=s["block_m"], block_n=s["block_n"], causal=s["causal"], window=s["window"])
    if kn.refusal(s["n"], s["d"], dtype=s["dtype"], **tiles) is not None or not is_small(s["n"], **tiles):
        return None
    n_steps = kn.tile_steps(s["n"], s["n"], **tiles)
    return (s["n"], s["d"], s["block_m"], s["block_n"], s["causal"], s["dtype"], s["seed"], s["window"],
            min(index, n_steps - 1))


def fragment_alone() -> bool:
    """Whether this is a rerun of a fragment alone (the kernel page's step view after a Step move) rather than a
    full run of the page, which goes on to time the five methods: Streamlit names the fragments it reruns alone."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    return bool(getattr(get_script_run_ctx(), "fragment_ids_this_run", None))


@st.cache_data(max_entries=8, show_spinner=False)
def _comparison(n, d, block_m, block_n, causal, dtype, seed, _interpreted_call) -> list[dict]:
    results = kn.compare_methods(n, d, block_m=block_m, block_n=block_n, causal=causal, dtype=dtype, seed=seed,
                                 interpreted_call=_interpreted_call)
    return [r.__dict__ for r in results]


def comparison(n, d, block_m, block_n, causal, dtype, seed, run: KernelRun | None = None) -> list[dict] | None:
    """kernels.compare_methods as dicts (one per method), or None after an st.error when the kernel refuses. run:
    the step view's run of these settings with its kernel checks (checked_run); without a sliding window its
    interpreted kernel call is the one the table reports (under the interpreter a call is a functional simulation:
    the same call need not be made twice)."""
    call = run.kernel_call if kn.INTERPRETED and run is not None and run.window is None else None
    try:
        with st.spinner("Running and timing the five methods…"):
            return _comparison(n, d, block_m, block_n, causal, dtype, seed, call)
    except AttnvizError as exc:
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
