"""The Positional page's caches: theory curves on their slider values, measured profiles on (model, version, text)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from attnviz import positional as P
from attnviz import ui
from attnviz.figures import positional as F
from attnviz.once import ComputeOnce

ROPE_SEED_MAX = 10_000  # the RoPE section's seed for q and k: its largest value
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
    return F.rope_pair_rotation_instant(
        q[plane], k[plane], {b: P.rope_pair_at(q, pair, list(positions), b) for b in bases},
        {b: P.rope_pair_at(k, pair, [n], b)[0] for b in bases}, list(positions), m, n, base,
        {b: f"Pair {pair} turns by θ_{pair} = {P.rope_frequencies(d_head, b)[pair]:.3g} rad per position"
         for b in bases})


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
    """The paper's and transformers' rotation matrices at every position, the query position's drawn."""
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
