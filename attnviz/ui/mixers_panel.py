"""The Heads page's section for a model whose layers are not all softmax attention (Qwen3-Next, Qwen3.5, Mamba2,
Falcon-H1, Bamba, Nemotron-H, Granite 4, DeepSeek-V3.2, Kimi Linear, LFM2): every layer's kind, a linear mixer's
exact implicit map with its heads' statistics on |w|, and a gated softmax layer's output gate."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from attnviz import ui
from attnviz.capture.linear import (LINEAR_NOTE, gate_sink_table, gate_table, indexed_view, layer_stats,
                                    streams_stats)
from attnviz.figures import heads as head_figs
from attnviz.figures import mixer_maps as figs
from attnviz.mixers.gates import gated_weights

STATS_MAX_TOKENS = 2048  # a map read whole for its statistics (a capture read from a file): [head, n, n]
STREAMED_MAX_TOKENS = 16384  # statistics streamed over row blocks from the record: no N x N array, O(N² d) time
MAP_MAX_TOKENS = 1024  # a head's map drawn over its first tokens; longer texts get the rest in the statistics


@st.cache_data(show_spinner="Reading every head of the layer, a block of rows at a time…", max_entries=32)
def _stats(model: str, version: tuple, text: str, layers, layer: int, _capture) -> dict:
    """layer_stats, once per capture and layer: model, version, text and layers are the Heads page's key, which
    names the capture (ui.get_capture's, shared)."""
    return layer_stats(_capture, layer)


@ui.figure_cache(max_entries=64)
def _figure(model: str, version: tuple, text: str, layers, what: str, args: tuple, _build):
    """A figure of this section (or a tuple holding figures), built once for every session: `what` and `args`
    name it within the capture the page's key names (as for _stats); _build makes it. A rerun that leaves this part
    of the section as it was builds nothing again."""
    return _build()


def show(capture, key: tuple) -> None:
    """The section, when the capture knows its layers' kinds (a hybrid or linear model); nothing otherwise. key: the
    Heads page's (model, version of its files, text, layers), which names the capture; every cache here is keyed
    on it."""
    if not capture.layer_kinds:
        return
    st.subheader("Layers other than softmax attention")
    st.write("Each layer's token mixer. Where the mixer is linear (Gated DeltaNet, Mamba2), its output at query t "
             "is still a weighted sum of per-token values, o_t = Σ_s w_ts v_s, so it has an exact attention map "
             "of its own, built from what the layer's kernel received.")
    ui.plot(_figure(*key, "kinds", (), lambda: figs.kinds_strip(capture.layer_kinds)), key="mixers_kinds")
    st.caption("What to see: which layers mix tokens how."
               + (" The views above show the softmax layers; this section the others." if capture.layers else
                  " This model has no softmax attention: each layer below is a linear mixer's exact map."))
    message = capture.skipped_message()
    if message:
        st.info(message)
    if capture.linear_layers:
        _linear(capture, key)
    if capture.gates:
        _gates(capture, key)
    indexed = [i for i in capture.layers if capture.layer_kind(i) == "indexed"]
    if indexed and capture.inputs and capture.n_tokens <= STATS_MAX_TOKENS:
        _indexed(capture, key, indexed)


def _indexed(capture, key: tuple, indexed: list[int]) -> None:
    c1, c2 = st.columns(2)
    layer = c1.selectbox("Indexed layer", indexed, key="mixers_indexed_layer", persist_state="session")
    head = c2.selectbox("Its head", list(range(capture.n_heads)), key="mixers_indexed_head",
                        persist_state="session")
    def build():
        view = indexed_view(capture, layer, head)
        return (figs.selection_over_pattern(view.dense, view.kept, capture.tokens, title=f"Layer {layer}, head "
                                            f"{head}: the indexer's keys over the dense pattern"),
                figs.outside_mass(view.outside, capture.tokens, title=f"Layer {layer}, head {head}: mass the "
                                  "selection dropped"), float(view.outside.mean()))

    selection, outside, dropped = _figure(*key, "indexed", (layer, head), build)
    ui.plot(selection, key="mixers_selection")
    st.caption("What to see: the layer's indexer keeps a few keys per query (white squares) and the softmax runs "
               "over those only. The colours are what the same q and k would give over every causal key; weight "
               "outside the squares is what the selection dropped.")
    ui.plot(outside, key="mixers_outside")
    st.caption(f"Mean over queries: {dropped:.1%} of the dense attention fell outside the selection. "
               "While a query has no more earlier keys than the indexer keeps, it keeps them all and drops nothing.")


def _linear(capture, key: tuple) -> None:
    c1, c2 = st.columns(2)
    layer = c1.selectbox("Linear layer", capture.linear_layers, key="mixers_layer",
                         format_func=lambda i: f"{i} ({capture.layer_kind(i)})", persist_state="session")
    n_heads = capture.layer_heads(layer, "linear")
    head = c2.selectbox("Its head", list(range(n_heads)), key="mixers_head", persist_state="session")
    shown = min(capture.n_tokens, MAP_MAX_TOKENS)
    ui.plot(_figure(*key, "map", (layer, head), lambda: figs.implicit_map(
        capture.layer_rows(layer, 0, shown, heads=[head], mixer="linear")[0][:, :shown], capture.tokens[:shown],
        title=f"Layer {layer} ({capture.layer_kind(layer)}), head {head}: implicit attention map w")), key="mixers_map")
    st.caption(f"What to see: how much of each earlier token's value reaches each query. {LINEAR_NOTE} So the "
               "scale is diverging: white is 0, the two colours the two signs."
               + (f" Drawn over the first {shown:,} of {capture.n_tokens:,} tokens; the statistics below read every "
                  "row." if shown < capture.n_tokens else ""))
    limit = STREAMED_MAX_TOKENS if streams_stats(capture, layer) else STATS_MAX_TOKENS
    if capture.n_tokens > limit:
        st.caption(f"The heads' statistics of this layer are shown up to {limit:,} tokens.")
        return
    numbers = _stats(*key, layer, capture)
    table = pd.DataFrame({"head": range(n_heads), "prev_token": numbers["prev_token"],
                          "induction": numbers["induction"], "half_mass_distance": numbers["half_mass_distance"]})
    st.dataframe(table.round(4), hide_index=True)
    st.caption("On the shares |w_ts| / Σ_s |w_ts| (each row's absolute weight, summing to 1): prev_token and "
               "induction as the softmax heads' statistics define them; half_mass_distance, the fewest tokens back "
               "that hold half the mean row's share.")
    ui.plot(_figure(*key, "distance", (layer,), lambda: figs.distance_profiles(
        numbers["distance_profile"], title=f"Layer {layer}: share of |w| by distance")), key="mixers_distance")
    st.caption("What to see: a head whose share falls off within a few tokens forgets fast (strong decay); a flat "
               "one carries far-back tokens.")


def _gates(capture, key: tuple) -> None:
    gated = sorted(capture.gates)
    layer = st.selectbox("Gated softmax layer", gated, key="mixers_gate_layer", persist_state="session")
    gate = capture.gate(layer)
    ui.plot(_figure(*key, "gate", (layer,), lambda: figs.gate_heatmap(
        gate, capture.tokens, title=f"Layer {layer}: output gate per head and query")), key="mixers_gate")
    st.caption("What to see: each head's output is multiplied, channel by channel, by sigmoid(gate); shown is the "
               "mean over the head's channels. Near 0 the head's output at that query is all but shut: the gate, "
               "not a sink token, lets a head attend nowhere (Qiu et al. 2025).")
    mean, sparse = gate_table(capture, [layer])[layer]
    st.dataframe(pd.DataFrame({"head": range(len(mean)), "mean gate": mean, "share of gates under 0.1": sparse})
                 .round(4), hide_index=True)
    head = st.selectbox("Head for the gated contribution", list(range(gate.shape[0])), key="mixers_gate_head",
                        persist_state="session")
    def build():
        pattern = capture.head_pattern(layer, head)
        return (head_figs.head_detail(pattern, capture.tokens, title=f"Layer {layer}, head {head}: the pattern"),
                head_figs.head_detail(np.asarray(gated_weights(pattern[None], gate[head][None])[0]), capture.tokens,
                                      title=f"Layer {layer}, head {head}: weight × the query's mean gate"))

    plain, gated_map = _figure(*key, "gated", (layer, head), build)
    left, right = st.columns(2)
    ui.plot(plain, where=left, key="mixers_pattern")
    ui.plot(gated_map, where=right, key="mixers_gated")
    st.caption("What to see: left, the softmax weights (each row sums to 1); right, each weight times the gate on "
               "the query's output, so a row sums to the share of the head's output the gate lets through on "
               "average. A row that is bright on the left and dark on the right is a query whose head the gate shut.")


@ui.figure_cache(max_entries=16)
def _gate_sinks(model: str, version: tuple, text: str, layers, _capture, _alpha: np.ndarray) -> tuple:
    """(gate_sink_table, its figure), built once for every session: model, version, text and layers are the Sinks
    page's key, which names the capture and so its sink scores `_alpha`. Nothing may change the table once cached
    (the page draws a rounded copy)."""
    table = gate_sink_table(_capture, _alpha)
    labels = [f"L{layer} H{head}" for layer, head in zip(table["layer"], table["head"])]
    figure = figs.gate_sink_bars({"sink α₀": table["sink α₀"], "share of gates under 0.1":
                                  table["share of gates under 0.1"]}, labels,
                                 title="Gated softmax heads: sink score and gate sparsity")
    return table, figure


def gates_beside_sinks(capture, alpha: np.ndarray, key: tuple) -> None:
    """The Sinks page's view of a gated model: each gated head's sink score beside its gate sparsity. key: the
    page's (model, version of its files, text, layers), which names the capture; the table is cached on it."""
    if not capture.gates:
        return
    table, figure = _gate_sinks(*key, capture, alpha)
    st.subheader("The output gate beside the sink")
    ui.plot(figure, key="sinks_gates")
    st.caption("What to see: this model multiplies each head's output by a sigmoid gate (Qiu et al. 2025). A gate "
               "under 0.1 all but shuts the head at that query, which is what a sink does for an ungated head: "
               "gated heads need less sink. Both bars are fractions: α₀ the mean weight on token 0, the other the "
               "share of (query, channel) gates under 0.1.")
    st.dataframe(table.round(4), hide_index=True)
