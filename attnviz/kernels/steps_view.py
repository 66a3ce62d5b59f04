"""The Tiled kernel page's step view, as a notebook draws it: one run of the online-softmax stepper and the Triton
kernel on seeded inputs (kernel_run), and the view of its steps with an in-chart slider (step_view).

    run = kernel_run(64, 32, block_m=16, block_n=16, causal=True)
    fig, shown = step_view(run, 3)   # step 3, the slider over the steps in `shown`

A step view needs the stepper alone (stepper_run); the Triton kernel's part (kernel_checks: its trace, its error,
its timed call), interpreted on a CPU, is most of a small run's time, and the page computes it after the view.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from attnviz.cores import one_core
from attnviz.errors import AttnvizError
from attnviz.figures import instant
from attnviz.figures import kernel as figs
from attnviz.figures import kernel_steps

from .limits import refusal
from .naive import reference_attention
from .stages import tile_map
from .stepper import tiled_steps
from .timing import timed_once, make_inputs
from .triton_attention import KernelTrace, flash_attention

STEP_STOPS = 64  # the most steps the step view's in-chart slider carries


class KernelRefused(AttnvizError, ValueError):
    """The settings cannot run here (a size over the limits, blocks too big for the GPU); the message says why."""


@dataclass(frozen=True)
class KernelRun:
    """The stepper's steps, the tile map with its edges (positions), the error of the stepper's O at the last step of
    each query block against the float64 reference (out_error, by step index), causal and window as run; and the
    Triton kernel's part (kernel_checks): its trace, the error of its whole output (kernel_error) and its timed call,
    None in a stepper_run. Read only."""

    steps: list
    codes: np.ndarray
    q_edges: list[int]
    k_edges: list[int]
    out_error: dict[int, float]
    causal: bool
    window: int | None
    trace: KernelTrace | None = None
    kernel_error: float | None = None
    kernel_call: tuple | None = None  # (seconds, output [1, 1, n, d]) of the kernel's traced call, as timing.measure


def stepper_run(n: int, d: int, *, block_m: int, block_n: int, causal: bool, dtype: str = "float32", seed: int = 0,
                window: int | None = None) -> KernelRun:
    """Runs the torch stepper (attnviz.kernels.tiled_steps) on seeded N(0, 1) Q, K, V of [n, d] (one head) and
    compares each query block's O with the float64 reference; no Triton kernel (its fields None). window: a sliding
    window of keys, with causal. Raises KernelRefused when these settings cannot run here."""
    reason = refusal(n, d, block_m=block_m, block_n=block_n, causal=causal, dtype=dtype, window=window)
    if reason:
        raise KernelRefused(reason)
    q, k, v = make_inputs(n, d, dtype=dtype, seed=seed)
    with one_core():  # tile-sized products: a second core only waits on a loaded machine
        steps = list(tiled_steps(q, k, v, causal=causal, block_m=block_m, block_n=block_n, window=window))
    reference = reference_attention(q, k, v, causal=causal, window=window)[0, 0].numpy()
    codes = tile_map(n, n, block_m=block_m, block_n=block_n, causal=causal, window=window)
    return KernelRun(steps, codes, [min(i * block_m, n) for i in range(codes.shape[0] + 1)],
                     [min(j * block_n, n) for j in range(codes.shape[1] + 1)],
                     out_error={s.index: float(np.abs(s.out - reference[s.q_start:s.q_stop]).max())
                                for s in steps if s.last},
                     causal=causal, window=window)


def kernel_checks(n: int, d: int, *, block_m: int, block_n: int, causal: bool, dtype: str = "float32",
                  seed: int = 0, window: int | None = None) -> dict:
    """The Triton kernel's part of kernel_run, on the same seeded inputs: {"trace", "kernel_error" (its whole
    output against the float64 reference), "kernel_call" ((seconds, output) of its one traced call)}."""
    q, k, v = make_inputs(n, d, dtype=dtype, seed=seed)
    seconds, (out, trace) = timed_once(lambda: flash_attention(q, k, v, causal=causal, block_m=block_m, block_n=block_n,
                                                           trace=True, window=window))
    reference = reference_attention(q, k, v, causal=causal, window=window)[0, 0].numpy()
    return dict(trace=trace, kernel_error=float(np.abs(out[0, 0].double().numpy() - reference).max()),
                kernel_call=(seconds, out))


def kernel_run(n: int, d: int, *, block_m: int, block_n: int, causal: bool, dtype: str = "float32", seed: int = 0,
               window: int | None = None) -> KernelRun:
    """Runs the torch stepper and the Triton kernel with its trace on seeded N(0, 1) Q, K, V of [n, d] (one head),
    and compares both with the float64 reference (stepper_run with kernel_checks). window: a sliding window of
    keys, with causal. Raises KernelRefused when these settings cannot run here."""
    tiles = dict(block_m=block_m, block_n=block_n, causal=causal, dtype=dtype, seed=seed, window=window)
    return replace(stepper_run(n, d, **tiles), **kernel_checks(n, d, **tiles))


def step_title(run: KernelRun, index: int) -> str:
    """The step view's line at step `index`: the tile it computes, and on a query block's last key tile, a second
    line with the error of its output."""
    step = run.steps[index]
    title = f"Step {index} of {len(run.steps) - 1}: query block {step.q_block}, key block {step.k_block}"
    if step.last:
        title += f"<br>block done, O = acc / l_i: max |O − float64| = {run.out_error[index]:.1e}"
    return title


def step_view(run: KernelRun, index: int, *, most: int = STEP_STOPS) -> tuple:
    """(figure, steps) of the step view at step `index`: figures.kernel_steps.step_view_figure over a window of
    consecutive steps around it (`steps`, a range: at most `most`, and as many as fit the frame budget), each a
    stop of its in-chart slider."""
    if not 0 <= index < len(run.steps):
        raise KernelRefused(f"step {index} is not one of this run's steps 0–{len(run.steps) - 1}")

    def states(i: int):
        step = run.steps[i]
        return figs.tile_states(run.codes, [(s.q_block, s.k_block) for s in run.steps[:i]],
                                (step.q_block, step.k_block))

    base = figs.tile_states(run.codes, [], None)

    def view(indices, active):
        return kernel_steps.step_view_figure([run.steps[i] for i in indices], [states(i) for i in indices],
                                             [step_title(run, i) for i in indices], active, base=base,
                                             q_edges=run.q_edges, k_edges=run.k_edges, causal=run.causal,
                                             window=run.window)

    step = run.steps[index]
    lines = kernel_steps.tile_map_lines(base, run.q_edges, run.k_edges, causal=run.causal, window=run.window)
    traces, images = kernel_steps.step_view_parts(
        step, states(index), lines, step_title(run, index), run.q_edges, run.k_edges,
        limits=kernel_steps.step_view_limits([step]), block=np.shape(step.scores))
    stop_bytes = instant.json_bytes({"data": traces, "layout": {"images": images}})
    shown = instant.window(len(run.steps), index, stop_bytes, most=most)
    return view(shown, index - shown.start), shown
