"""The Positional page's caches: theory curves on their slider values, measured profiles on (model, version, text)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from attnviz import positional as P
from attnviz import ui
from attnviz.figures import instant
from attnviz.figures import positional as F
from attnviz.once import ComputeOnce

ROPE_SEED_MAX = 10_000  # the RoPE section's seed for q and k: its largest value
# The RoPE charts' in-chart query position sliders: the query position m and ROPE_REACH positions either side of it
# (fewer at the ends of the page's range). A plotly slider draws and measures a label for every stop, and Streamlit
# draws a new figure twice: 201 stops took ~0.2 s a draw in the browser, most of a first move's wait.
ROPE_REACH = 20
_PROFILES = ComputeOnce(max_items=8)  # shared by every session; a long text's profile takes a pass over its capture


@st.cache_data(max_entries=40, show_spinner=False)
def decay_curves(max_distance: int, d_head: int, base: float, scaling: str, factor: float):
    """RoFormer's decay bound at up to 4,001 distances, with and without context scaling."""
    distances = np.arange(max_distance + 1, dtype=float) if max_distance <= 4000 else \
        np.linspace(0, max_distance, 4001)
    curves = {f"d = {d_head}, base = {base:g}": P.rope_decay_bound(distances, d_head, base)}
    if scaling != "none":
        curves[f"{scaling} scaling × {factor:g}"] = P.rope_decay_bound(distances, d_head, base, scaling=scaling,
                                                                      factor=factor)
    return distances, curves


# The Sinusoidal section's charts, built once for every session on what they depend on: moving the offset or the
# positions below them reruns the page without rebuilding them (the similarity chart holds one figure per d_model).
@ui.figure_cache(max_entries=16)
def sinusoid_charts(n_pos: int, d_model: int, base: float, d_models: tuple):
    """(the encoding's heatmap, the similarity by offset with its in-chart d_model slider over d_models)."""
    offsets = np.arange(n_pos)
    return (F.encoding_heatmap(P.sinusoidal_encoding(n_pos, d_model, base)),
            F.dot_by_offset_instant(offsets, {d: P.sinusoidal_dot(offsets, d, base) for d in d_models}, d_model))


def prefetch_sinusoid(setting: dict, previous: dict | None, steps: dict, d_models: tuple) -> None:
    """Builds, in a background thread, sinusoid_charts one step either way of the control just moved (setting,
    previous: {"n_pos", "d_model", "base"} of this run and the last; steps: each control's options) while the
    browser draws this one. Nothing when nothing moved."""
    ui.build_moved_neighbours(sinusoid_charts, setting, previous, steps, "attnviz-sin-prefetch", d_models)


@ui.figure_cache(max_entries=16)
def compare_chart(d: int, n: int, base: float, slope: float, seed: int, same: bool, slopes: tuple):
    """The Compare section's chart: a seeded random q (and k = q when `same`, else its own) at every distance up to
    n under each scheme, scores and weights, with an in-chart ALiBi slope slider over `slopes`, drawn at `slope`."""
    rng = np.random.default_rng(int(seed))
    q = rng.standard_normal(d)
    k = q.copy() if same else rng.standard_normal(d)
    scores_by = {s: P.compare_schemes(q, k, n, base=base, alibi_slope=s) for s in slopes}
    weights_by = {s: {name: P.softmax_over_distance(x) for name, x in scores.items()}
                  for s, scores in scores_by.items()}
    return F.scheme_panels_instant(np.arange(n), scores_by, weights_by, slope)


def prefetch_compare(setting: dict, previous: dict | None, steps: dict, slopes: tuple) -> None:
    """compare_chart one step either way of the control just moved (setting, previous: {"d", "n", "base", "slope",
    "seed", "same"}), built in a background thread as prefetch_sinusoid's."""
    ui.build_moved_neighbours(compare_chart, setting, previous, steps, "attnviz-cmp-prefetch", slopes)


@ui.figure_cache(max_entries=16)
def shift_matrix_chart(k_shift: int, d_model: int, base: float):
    """M_k's first 16 dimensions as a heatmap."""
    m_k = P.sinusoidal_shift_matrix(k_shift, d_model, base)
    return F.matrix_heatmap(m_k[:16, :16], title=f"M_k for k = {k_shift} (first 16 dimensions)")


# The RoPE section's charts, each built once for every session on what it depends on: a rerun that moves one
# control rebuilds only the charts that read it (their in-chart sliders carry up to 201 x 5 stops each).
def rope_qk(d_head: int, seed: int) -> np.ndarray:
    """The RoPE section's seeded random q and k ([2, d_head]: the chart and the identity table read the same)."""
    return np.random.default_rng(int(seed)).standard_normal((2, d_head))


@ui.figure_cache(max_entries=32)
def rope_rotation_chart(d_head: int, base: float, pair: int, seed: int, m: int, n: int, positions: tuple,
                        bases: tuple):
    """Feature pair `pair` of seeded random q and k (d_head features) rotated to positions m and n: the chart
    with its in-chart query position and base sliders (figures.positional.rope_pair_rotation_instant)."""
    q, k = rope_qk(d_head, seed)
    plane = slice(2 * pair, 2 * pair + 2)
    positions = rope_window(positions, m)
    return F.rope_pair_rotation_instant(
        q[plane], k[plane], {b: P.rope_pair_at(q, pair, list(positions), b) for b in bases},
        {b: P.rope_pair_at(k, pair, [n], b)[0] for b in bases}, list(positions), m, n, base,
        {b: f"Pair {pair} turns by θ_{pair} = {P.rope_frequencies(d_head, b)[pair]:.3g} rad per position"
         for b in bases})


def rope_window(positions: tuple, m: int) -> list:
    """The stops of a RoPE chart's in-chart query position slider: `positions` from ROPE_REACH before m to ROPE_REACH
    after it, as many of them as the page has (2 ROPE_REACH + 1), shifted inwards at either end."""
    positions = list(positions)
    return [positions[i] for i in instant.window(len(positions), positions.index(m), 0, most=2 * ROPE_REACH + 1)]


def prefetch_rotation(setting: dict, previous: dict | None, head_dims: list, bases: tuple, positions: tuple) -> None:
    """Builds, in a background thread, rope_rotation_chart one step either way of the control just moved (setting
    and previous: {"d_head", "base", "pair", "seed", "m", "n"} of this run and the last), while the browser draws
    this one. A new d_head keeps the pair where it fits, as the page clamps it. Nothing when nothing moved."""
    if previous is None:
        return
    span = (positions[0], positions[-1])
    steps = {"d_head": head_dims, "base": list(bases), "pair": (0, setting["d_head"] // 2 - 1),
             "seed": (0, ROPE_SEED_MAX), "m": span, "n": span}
    wanted = ui.moved_neighbours(setting, previous, steps)
    ui.build_in_background(rope_rotation_chart, [
        (s["d_head"], s["base"], min(s["pair"], s["d_head"] // 2 - 1), s["seed"], s["m"], s["n"], positions, bases)
        for s in wanted], "attnviz-rope-prefetch")


@ui.figure_cache(max_entries=32)
def rope_layouts_chart(d_small: int, base: float, m: int, positions: tuple):
    """The paper's and transformers' rotation matrices at the positions of rope_window, the query position's drawn."""
    positions = rope_window(positions, m)
    perm = P.interleaved_to_half_permutation(d_small)
    paper = [P.rope_rotation_matrix(p, d_small, base, interleaved=True) for p in positions]
    half = [P.rope_rotation_matrix(p, d_small, base) for p in positions]
    return F.rope_layouts_instant(paper, half, np.eye(d_small)[perm], list(positions), m)


@ui.figure_cache(max_entries=32)
def decay_bound_chart(max_distance: int, d_head: int, base: float, scaling: str, factor: float, log_x: bool,
                      bases: tuple):
    """RoFormer's decay bound against distance at this base, with an in-chart slider over the bases."""
    bounds = {b: decay_curves(max_distance, d_head, b, scaling, factor) for b in bases}
    distances = bounds[base][0]
    return F.decay_bound_instant(distances if not log_x else np.maximum(distances, 0.5),
                                 {b: curves for b, (_, curves) in bounds.items()}, base, log_x=log_x)


def profile(name: str, text: str, skip: int, capture):
    """attnviz.distance.measured_profile of this capture, computed once per (model, version, text, skip) for every
    session, with a progress bar while it runs."""
    from attnviz import ui
    from attnviz.distance import measured_profile

    shape = ui.get_model(name).shape
    key = (name, ui.model_version(name), text, int(skip), capture.store, tuple(capture.layers))
    return ui.computed_once(_PROFILES, key, "Averaging attention over distance, layer by layer",
                            lambda progress: measured_profile(capture, shape, exclude_keys=skip, progress=progress))
