"""The Tiled kernel page's caches: one stepper run per setting and, apart, its Triton kernel's checks (the page
draws the step view before it runs the interpreted kernel), its figures per step, the timing table and the
peak-memory measurements. Every cache is keyed on every setting its result depends on."""

from __future__ import annotations

import functools
from dataclasses import replace

import streamlit as st

from attnviz.errors import AttnvizError
from attnviz import kernels as kn  # sets TRITON_INTERPRET before Triton is imported when there is no GPU
from attnviz.kernels import steps_view as kview
from attnviz.kernels.steps_view import STEP_STOPS, KernelRun  # noqa: F401  (STEP_STOPS: the page's bound)
from attnviz.ui import build_in_background, moved_neighbours, neighbours

MEMORY_SIZES = (128, 256, 512, 1024, 2048)
BLOCKS_TOO_BIG = "Not run: {}. Pick a smaller BLOCK_N or BLOCK_M, a smaller head dim, or float16, and it will run."


# Every TileStep keeps its tiles (up to 4096 steps of 128 x 128 scores): large runs are held for the last two
# settings only; small ones (SMALL_RUN score elements at most) for eight, the settings one step either way of the
# control just moved among them (prefetch_neighbours); tiny ones (TINY_RUN at most: 7 MB a run at worst, 256 steps of
# 16 x 128 channels) for 24, the settings one step away on every control (the page's defaults are one).
SMALL_RUN, TINY_RUN = 2**20, 2**16


def _stepper(n, d, block_m, block_n, causal, dtype, seed, window=None) -> KernelRun:
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


def _cached(function, entries: tuple[int, int, int]) -> dict:
    """{size: st.cache_resource of function} for each size of run ("tiny", "small", "large": _size), holding
    `entries` results of each (a trace holds three [key block, query] arrays: kept as many as the runs). Each is a
    cache of its own: Streamlit names a cache after its function's module, qualified name and source, and one name
    asked for again with another max_entries would replace the cache, empty."""
    def tier(size: str):
        @functools.wraps(function)
        def of_size(*args):
            return function(*args)
        of_size.__qualname__ = f"{function.__qualname__}[{size}]"
        return of_size
    return {size: st.cache_resource(max_entries=most, show_spinner=False)(tier(size))
            for size, most in zip(("tiny", "small", "large"), entries)}


_runs, _kernel_checks_by_size = _cached(_stepper, (24, 8, 2)), _cached(_checks, (24, 8, 2))


def _size(n, block_m, block_n, causal, window=None) -> str:
    """"tiny", "small" or "large": by the score elements a run's tiles hold (its steps times BLOCK_M x BLOCK_N)
    against TINY_RUN and SMALL_RUN."""
    elements = kn.tile_steps(n, n, block_m=block_m, block_n=block_n, causal=causal, window=window) * block_m * block_n
    return "tiny" if elements <= TINY_RUN else "small" if elements <= SMALL_RUN else "large"


def is_small(n, block_m, block_n, causal, window=None) -> bool:
    """Whether a run's tiles hold at most SMALL_RUN score elements (its steps times BLOCK_M x BLOCK_N)."""
    return _size(n, block_m, block_n, causal, window) != "large"


def _by_size(caches: dict, n, d, block_m, block_n, causal, dtype, seed, window, *more):
    """The cached function of caches (_cached) for a run of these settings' size, called with them (and more)."""
    cached = caches[_size(n, block_m, block_n, causal, window)]
    return cached(n, d, block_m, block_n, causal, dtype, seed, window, *more)


def _kernel_checks(n, d, block_m, block_n, causal, dtype, seed, window=None) -> dict:
    return _by_size(_kernel_checks_by_size, n, d, block_m, block_n, causal, dtype, seed, window)


def _kernel_run(n, d, block_m, block_n, causal, dtype, seed, window=None) -> KernelRun:
    """The shared stepper run of these settings, from the cache its size belongs to."""
    return _by_size(_runs, n, d, block_m, block_n, causal, dtype, seed, window)


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


def _view(n, d, block_m, block_n, causal, dtype, seed, window, index) -> tuple:
    return kview.step_view(_kernel_run(n, d, block_m, block_n, causal, dtype, seed, window), index)


_views = _cached(_view, (32, 12, 4))  # a view's stops take FRAME_BUDGET (1.8 MB) at most; a tiny run's ~1.1 MB


def step_view(n, d, block_m, block_n, causal, dtype, seed, window, index) -> tuple:
    """(figure, steps) of the step view at step `index` (attnviz.kernels.steps_view.step_view: a window of
    consecutive steps around it, each a stop of its in-chart slider), from the cache its run's size belongs to.
    Kept as an object (plotly reads a figure only to draw it)."""
    return _by_size(_views, n, d, block_m, block_n, causal, dtype, seed, window, index)


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
DTYPES = ["float32", "float16", "bfloat16"]  # the dtype control's options
ELSEWHERE_WAIT_S = 1.0  # after a run, how long before the settings a step away on other controls are built


def prefetch_neighbours(setting: dict, previous: dict | None, index: int) -> None:
    """Builds, in the background, the step view and kernel checks one step either way of the control just moved
    (setting, previous: {"n", "d", "block_m", "block_n", "causal", "window", "dtype", "seed"} of this run and the
    last, previous None on the page's first run; index: the step shown), for small runs that can run here: a
    control moved again by a step then finds them ready. Where this run is tiny (TINY_RUN), the settings one step
    away on every other control too, in the page's order, ELSEWHERE_WAIT_S later unless a control moved again
    meanwhile (moves in a row would otherwise share the cores with them): the first move of any control then finds
    its view ready. Nothing is built when nothing moved."""
    if previous == setting:
        return
    steps = {"n": N_RANGE, "d": HEAD_DIMS, "block_m": BLOCKS, "block_n": BLOCKS, "causal": [False, True],
             **({"window": [None, *WINDOWS]} if setting["causal"] else {}),  # a window only with the causal mask
             "dtype": DTYPES, "seed": SEED_RANGE}
    moved = moved_neighbours(setting, previous, steps) if previous is not None else []
    build_in_background(_ahead, _prefetchable_calls(moved, index), "attnviz-kernel-neighbours")
    tiny = _size(setting["n"], setting["block_m"], setting["block_n"], setting["causal"], setting["window"]) == "tiny"
    others = [s for s in ({**setting, name: value} for name, options in steps.items()
                          for value in neighbours(options, setting[name])) if s not in moved] if tiny else []
    build_in_background(_ahead, _prefetchable_calls(others, index), "attnviz-kernel-elsewhere",
                        wait_s=ELSEWHERE_WAIT_S)


def _prefetchable_calls(settings: list[dict], index: int) -> list[tuple]:
    """_ahead's arguments for each of settings that can run here and is small (_prefetchable); a setting without
    the causal mask has no window."""
    calls = [_prefetchable(s if s["causal"] else {**s, "window": None}, index) for s in settings]
    return [call for call in calls if call is not None]


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
