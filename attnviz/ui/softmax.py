"""The Softmax page's caches: random-q·k samples and sweeps on their slider values, and a real head's sweeps on
(model, version, text, layers, layer, head)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from attnviz import softmax as sm

N_QUERIES = 256  # rows sampled per setting: enough to see each statistic's spread, fast on a CPU
DIMS = sm.log_spaced_dims(1, 1024, per_octave=2)


@st.cache_data(show_spinner=False, max_entries=64)
def sample(d_k: int, n_keys: int, seed: int, temperature: float):
    q, k = sm.random_qk(N_QUERIES, n_keys, d_k, seed)
    out = {}
    for variant, scaled in ((sm.SCALED, True), (sm.UNSCALED, False)):
        scores, pattern = sm.scores_and_pattern(q, k, scaled=scaled, temperature=temperature)
        out[variant] = (scores, pattern, sm.row_stats(pattern))
    return out, sm.gradient_demo(d_k, n_keys, n_queries=N_QUERIES, seed=seed, temperature=temperature)


@st.cache_data(show_spinner=False, max_entries=32)
def sweep(n_keys: int, seed: int, temperature: float) -> pd.DataFrame:
    return sm.saturation_sweep(DIMS, n_queries=N_QUERIES, n_keys=n_keys, seed=seed, temperature=temperature)


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
