"""The Positional page's caches: theory curves on their slider values, measured profiles on (model, version, text)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from attnviz import positional as P
from attnviz.once import ComputeOnce

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


def profile(name: str, text: str, skip: int, capture):
    """attnviz.distance.measured_profile of this capture, computed once per (model, version, text, skip) for every
    session, with a progress bar while it runs."""
    from attnviz import ui
    from attnviz.distance import measured_profile

    shape = ui.get_model(name).shape
    key = (name, ui.model_version(name), text, int(skip), capture.store, tuple(capture.layers))
    return ui.computed_once(_PROFILES, key, "Averaging attention over distance, layer by layer",
                            lambda progress: measured_profile(capture, shape, exclude_keys=skip, progress=progress))
