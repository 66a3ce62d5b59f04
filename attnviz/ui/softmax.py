"""The Softmax page's caches: random-q·k samples and sweeps on their slider values, and a real head's sweeps on
(model, version, text, layers, layer, head)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from attnviz import softmax as sm
from attnviz import softmax_charts as charts
from attnviz.figures import instant
from attnviz.figures import softmax as figs
from attnviz.ui import build_in_background, moved_neighbours

N_QUERIES, DIMS = charts.N_QUERIES, charts.DIMS
TEMPERATURES = [0.1, 0.2, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 10.0]  # the temperature sliders


@st.cache_data(show_spinner=False, max_entries=64)
def sample(d_k: int, n_keys: int, seed: int, temperature: float):
    out = {variant: (scores, pattern, sm.row_stats(pattern))
           for variant, (scores, pattern) in charts.variant_logits(d_k, n_keys, seed, temperature).items()}
    return out, sm.gradient_demo(d_k, n_keys, n_queries=N_QUERIES, seed=seed, temperature=temperature)


@st.cache_resource(show_spinner=False, max_entries=16)
def _sweeps(n_keys: int, seed: int) -> dict:
    """{T: saturation_sweep at T} for every T of TEMPERATURES, each d_k's draws made once (saturation_sweeps);
    shared, read only."""
    return dict(zip(TEMPERATURES, sm.saturation_sweeps(DIMS, TEMPERATURES, n_queries=N_QUERIES, n_keys=n_keys,
                                                       seed=seed)))


def sweep(n_keys: int, seed: int, temperature: float) -> pd.DataFrame:
    """saturation_sweep over DIMS at this temperature (one of TEMPERATURES: from _sweeps; else computed)."""
    if temperature in TEMPERATURES:
        return _sweeps(n_keys, seed)[temperature]
    return sm.saturation_sweep(DIMS, n_queries=N_QUERIES, n_keys=n_keys, seed=seed, temperature=temperature)


# one d_k's variants figure as plain dicts (a stop of the chart's d_k slider): binned logits and the shown rows only
@st.cache_resource(show_spinner=False, max_entries=128)
def _variants_stop(d_k: int, n_keys: int, seed: int, temperature: float, rows_shown: int) -> dict:
    return charts.variants_stop(d_k, n_keys, seed, temperature, rows_shown)


def _sweep_spec(n_keys: int, temperature: float) -> tuple[list[dict], dict]:
    """(panels, reference curves) of the curves against d_k (figs.sweep_panels)."""
    log_n = float(np.log(n_keys))
    return [
        {"column": "logit_var", "title": "Variance of the logits", "y_title": "variance (nats², log scale)",
         "log_y": True, "reference": True},
        {"column": "max_weight", "title": "Mean max weight", "y_title": "mean largest weight (0 to 1)"},
        {"column": "entropy", "title": f"Mean entropy (max {log_n:.2f})", "y_title": "mean entropy (nats)"},
        {"column": "saturated_share", "title": "Saturated rows (max weight > 0.99)",
         "y_title": "share of rows (0 to 1)"},
        {"column": "jac_p50", "title": "Jacobian norm, median and 10–90 %",
         "y_title": "‖J‖_F per row (log scale)", "log_y": True, "band": ("jac_p10", "jac_p90")},
        {"column": "grad_q_p50", "title": "Gradient reaching q, median", "y_title": "‖∂L/∂q‖ (log scale)",
         "log_y": True},
    ], {"theory: d_k / T²": (DIMS, np.array(DIMS) / temperature**2),
        "theory: 1 / T²": (DIMS, np.full(len(DIMS), 1 / temperature**2))}


def sweep_figure(n_keys: int, seed: int, temperature: float):
    """The curves against d_k at this temperature."""
    panels, reference = _sweep_spec(n_keys, temperature)
    return figs.sweep_panels(sweep(n_keys, seed, temperature), panels, reference=reference)


def _sweep_stop(n_keys: int, seed: int, temperature: float) -> dict:
    """The curves at one temperature as plain dicts: a stop of the chart's T slider (its traces only)."""
    panels, reference = _sweep_spec(n_keys, temperature)
    return {"data": figs.sweep_traces(sweep(n_keys, seed, temperature), panels, reference=reference)}


def variants_chart(d_k: int, n_keys: int, seed: int, temperature: float, rows_shown: int) -> tuple:
    """(figure, d_ks): attnviz.softmax_charts.variants_chart, each d_k's stop from this page's cache."""
    return charts.variants_chart(d_k, n_keys, seed, temperature, rows_shown, stop=_variants_stop)


@st.cache_resource(show_spinner=False, max_entries=32)
def sweeps_chart(n_keys: int, seed: int, temperature: float):
    """The curves against d_k at this temperature, with an in-chart slider over every one of TEMPERATURES (a frame
    each: the curves at that temperature). The d_k control's value is not marked on it: the chart stays the same
    object when only d_k changes, and the browser then keeps it as drawn (redrawing its six panels and twelve
    frames took a quarter of a second of a d_k change on a 2-core machine)."""
    chart = sweep_figure(n_keys, seed, temperature)
    return instant.add_frame_slider(chart, [_sweep_stop(n_keys, seed, t) for t in TEMPERATURES],
                                    [instant.stop_label(t) for t in TEMPERATURES], TEMPERATURES.index(temperature),
                                    parameter="T")


# the figures are kept as objects (plotly reads a figure only to draw it), so a slider moved back to a value it had
# draws them again without building them
@st.cache_resource(show_spinner=False, max_entries=64)
def tab_figure(tab: str, d_k: int, n_keys: int, seed: int, temperature: float, rows_shown: int):
    """The figure of one tab of the random-logits section (TABS) for one setting of its sliders, built when that
    tab is open (the others are not: the sweeps alone take 0.3 s on 2 cores): "logits", (figure, d_ks) of
    variants_chart, the logits and first rows of both variants with an in-chart slider over d_ks; "rows", every
    row's statistics; "sweeps", sweeps_chart, against d_k with an in-chart slider over TEMPERATURES; "gradients",
    ‖∂L/∂q‖ per row."""
    if tab == "logits":
        return variants_chart(d_k, n_keys, seed, temperature, rows_shown)
    if tab == "sweeps":
        return sweeps_chart(n_keys, seed, temperature)
    variants, grads = sample(d_k, n_keys, seed, temperature)
    if tab == "gradients":
        return figs.row_distribution(grads, title=f"‖∂L/∂q‖ per query row at d_k = {d_k}", log_y=True,
                                     y_title="gradient norm reaching q (log scale)")
    stats = {variant: variants[variant][2] for variant in (sm.SCALED, sm.UNSCALED)}

    def per_variant(field: str) -> dict:
        return {variant: getattr(s, field) for variant, s in stats.items()}

    return figs.row_distributions([
        {"values": per_variant("max_weight"), "title": "Max weight per row",
         "y_title": "largest weight in the row (0 to 1)"},
        {"values": per_variant("entropy"), "title": f"Entropy per row (max {float(np.log(n_keys)):.2f})",
         "y_title": "entropy (nats)"},
        {"values": per_variant("jacobian_norm"), "title": "Jacobian norm per row",
         "y_title": "‖diag(p) − pp^T‖_F (log scale)", "log_y": True},
    ])


TABS = ("logits", "rows", "sweeps", "gradients")  # tab_figure's tabs, in the page's order


N_KEYS_RANGE = (2, 512)  # the "keys per query" slider's bounds
SEED_RANGE = (0, 2**31 - 1)  # the seed's


def prefetch_next(setting: dict, previous: dict | None, temperatures: list[float], rows_shown: int, tab: str) -> None:
    """Builds, in a background thread, the open tab's tab_figure one step either way of the control just moved
    (setting and previous: {"d_k", "n_keys", "seed", "temperature"} of this run and the last), while the browser
    draws this one: a control moved again by a step then finds its figure ready. Nothing is built when nothing
    moved."""
    if previous is None:
        return
    steps = {"n_keys": N_KEYS_RANGE, "d_k": list(DIMS), "temperature": list(temperatures), "seed": SEED_RANGE}
    wanted = moved_neighbours(setting, previous, steps)
    build_in_background(tab_figure, [(tab, s["d_k"], s["n_keys"], s["seed"], s["temperature"], rows_shown)
                                     for s in wanted], "attnviz-softmax-prefetch")


# The real-model sweeps are keyed on what determines them (model and the version of its files, text, captured layers,
# layer, head, T); the q.k, bias and layer inputs themselves (underscored: not hashed) follow from those.
@st.cache_data(show_spinner=False, max_entries=32)
def real_scale_sweep(model_name: str, version: tuple, text: str, layers: tuple, layer_pos: int, head: int,
                     scaling: float, softcap, _raw, _bias):
    factors = np.geomspace(scaling / 8, 8.0, 61)
    return sm.scale_sweep(_raw, factors, bias=_bias, softcap=softcap)


@st.cache_data(show_spinner=False, max_entries=16)
def real_head_saturation(model_name: str, version: tuple, text: str, layers: tuple, scaling: float, softcap,
                         _inputs):
    # the grids show the "own scale" and "unscaled" shares only, which do not depend on T: not keyed on it, so
    # moving the temperature slider does not redo every head (T = 1 makes the unused third variant the first).
    # Layer by layer (generators): one layer's float64 q.k in memory at a time.
    raw = (sm.raw_qk(_inputs[layer]) for layer in layers)
    bias = (None if _inputs[layer].key_bias is None else _inputs[layer].key_bias.double().numpy() for layer in layers)
    return sm.head_saturation(raw, scaling, 1.0, bias=bias, softcap=softcap)
