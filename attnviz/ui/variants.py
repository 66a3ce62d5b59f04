"""The MHA, GQA, MQA page's caches (the preset architectures, the toy layers' run, its figures) and its
registry-model lookup. Every cache is keyed on every setting its result depends on: a rerun that moves one control
builds only the figures that read it (each took 25-30 ms to build, every rerun)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from attnviz import cost
from attnviz import variants as var
from attnviz.attention import kv_head_of
from attnviz.figures import cost as figs
from attnviz.ui import build_in_background, figure_cache, get_model, neighbours


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


def divisors(n_heads: int) -> list[int]:
    """The key/value head counts n_heads query heads can share: its divisors, from 1 (MQA) to n_heads (MHA)."""
    return [g for g in range(1, n_heads + 1) if n_heads % g == 0]


def kv_heads_for(n_heads: int, asked: int | None) -> int:
    """The key/value heads the page uses with n_heads query heads: the one asked for where it divides n_heads, else
    the middle divisor (the smallest, 1, where there are only two)."""
    options = divisors(n_heads)
    if asked in options:
        return asked
    return options[len(options) // 2] if len(options) > 2 else options[0]


def max_toy_head_dim(n_heads: int, max_width: int) -> int:
    """The toy layer's largest head size with n_heads query heads: 64, or less so that heads x size <= max_width."""
    return min(64, max_width // n_heads)


def toy_head_dim(asked: int, n_heads: int, max_width: int) -> int:
    """The toy layer's head size: the one asked for, at most max_toy_head_dim."""
    return min(asked, max_toy_head_dim(n_heads, max_width))


def prefetch_heads(n_heads: int, previous: int | None, n_kv: int, toy: dict, max_heads: int, max_width: int) -> None:
    """Builds in the background (ui.build_in_background) what a Query heads move of one step asks for: the sharing
    figure, and the toy layer's maps (their heads sorted, as the page asks for them) with its settings (toy:
    {"n_tokens", "d_head", "causal", "seed", "heads"} as this run has them), at n_heads one either way; each with
    kv_heads_for's key/value heads. Nothing on a first run or when the query heads did not move."""
    if previous is None or previous == n_heads:
        return
    calls = [(n, kv_heads_for(n, n_kv), toy["n_tokens"], toy_head_dim(toy["d_head"], n, max_width), toy["causal"],
              toy["seed"], tuple(sorted(h for h in toy["heads"] if h < n)))  # sorted, as the page asks
             for n in neighbours((1, max_heads), n_heads, previous)]
    build_in_background(_heads_ahead, calls, "attnviz-variants-next")


def _heads_ahead(n_heads: int, n_kv: int, n_tokens: int, d_head: int, causal: bool, seed: int, heads: tuple) -> None:
    sharing_figure(n_heads, n_kv)
    if heads:
        variant_maps_chart(n_tokens, d_head, n_heads, n_kv, causal, seed, heads)


@figure_cache(max_entries=64)
def sharing_figure(n_heads: int, n_kv: int):
    """figures.cost.head_sharing_figure: which KV head each of n_heads query heads reads, per variant."""
    return figs.head_sharing_figure(n_heads, {name: kv_head_of(n_heads, k)
                                              for name, k in var.variant_kv_heads(n_heads, n_kv).items()})


@figure_cache(max_entries=32)
def kv_chart(archs: tuple, contexts: tuple, batch: int, bytes_per_value: float, budget_gib: float | None):
    """figures.cost.kv_cache_figure of the models archs ((name, cost.Architecture) pairs, in order; a frozen
    dataclass, hashed by its fields, so a custom or registry model is keyed on its own values)."""
    curves = {name: cost.kv_cache_curve(a, np.asarray(contexts), batch=batch, bytes_per_value=bytes_per_value)
              for name, a in archs}
    return figs.kv_cache_figure(np.asarray(contexts), curves, batch=batch, bytes_per_value=bytes_per_value,
                                budget_gib=budget_gib)


@figure_cache(max_entries=32)
def flops_chart(seq: tuple, d_model: int, causal: bool, kv_dim: int | None):
    """figures.cost.flops_figure: one layer's projection and attention FLOPs at each of seq, the crossover marked."""
    flops = [cost.attention_flops(seq_len=int(n), d_model=d_model, causal=causal, kv_dim=kv_dim) for n in seq]
    return figs.flops_figure(np.asarray(seq), [f["projections"] for f in flops], [f["attention"] for f in flops],
                             crossover=cost.crossover_seq_len(d_model=d_model, causal=causal, kv_dim=kv_dim),
                             d_model=d_model, causal=causal)


@figure_cache(max_entries=8)
def param_share_chart(archs: tuple):
    """figures.cost.param_share_figure of the models archs ((name, cost.Architecture) pairs, as kv_chart's)."""
    return figs.param_share_figure({name: cost.param_counts(a) for name, a in archs})


@figure_cache(max_entries=32)
def variant_maps_chart(n_tokens: int, d_head: int, n_heads: int, n_kv: int, causal: bool, seed: int, heads: tuple):
    """figures.cost.variant_maps_figure of the toy layer (toy_run) for the chosen heads."""
    results, kv_counts = toy_run(n_tokens, d_head, n_heads, n_kv, causal, seed)
    return figs.variant_maps_figure({n: r[1] for n, r in results.items()}, list(heads),
                                    {n: kv_head_of(n_heads, k) for n, k in kv_counts.items()})
