"""The MHA, GQA, MQA page's caches (the preset architectures, the toy layers' run) and its registry-model lookup.
Every cache is keyed on every setting its result depends on."""

from __future__ import annotations

import streamlit as st

from attnviz import cost
from attnviz import variants as var
from attnviz.ui import get_model


@st.cache_data(show_spinner=False)
def preset_archs() -> dict[str, cost.Architecture]:
    """Every preset of attnviz.cost, read off its config values."""
    return {name: cost.preset_arch(name) for name in cost.PRESETS}


@st.cache_data(show_spinner=False, max_entries=32)
def toy_run(n_tokens: int, d_head: int, n_heads: int, n_kv: int, causal: bool, seed: int):
    """(compare_variants' results, {variant: KV heads}) for the toy layer of n_heads x d_head on n_tokens seeded
    tokens: MHA, GQA with n_kv KV heads (when it is neither), MQA."""
    weights = var.toy_weights(d_head * n_heads, n_heads, seed=seed)
    x = var.toy_input(n_tokens, d_head * n_heads, seed=seed)
    kv = var.variant_kv_heads(n_heads, n_kv)
    return var.compare_variants(x, weights, n_heads=n_heads, kv_heads=kv, causal=causal), kv


def loaded_arch(name: str):
    """(Architecture from the model's config, parameters counted on its loaded weights) of a registry model, or
    None after a message saying why (it cannot be loaded, or its family is not one attnviz.cost counts). Not
    cached: the model is (get_model), and counting its parameters takes microseconds."""
    loaded = get_model(name)
    if loaded is None:
        return None
    try:
        arch = cost.arch_from_config(loaded.model.config, name=name)
    except cost.CostError as exc:
        st.warning(f"{exc}: it is left out of the tables and charts.")
        return None
    return arch, sum(p.numel() for p in loaded.model.parameters())
