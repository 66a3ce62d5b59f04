"""The Sinks page's Massive activations section (Sun et al. 2024): each layer's largest hidden-state values on the
visitor's text, and the edit that zeroes them, or sets them to their mean over other texts, at the sink token.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from attnviz import lm, massive, ui
from attnviz.figures import sinks as figs
from attnviz.ui import sinks as sink_ui

TOKEN_CHOICES = 256  # the massive-activation edit is offered at the first tokens and where the top values sit


def massive_panel(model: str, text: str) -> None:
    """The Sinks page's Massive activations section: each layer's largest values on the text, and the edit that
    removes them at the sink token, with what it does to perplexity and sink mass."""
    st.markdown(
        "Sun et al. (2024, *Massive Activations in Large Language Models*) found the mechanism under the sink: "
        "from an early layer on, a few dimensions of the first token's hidden state (and of some delimiters) take "
        "values thousands of times the median, and stay there. They act as a fixed bias that makes the first "
        "token's key easy to find. Here: each layer's top 3 values on your text, and what happens when those "
        "dimensions are set to zero at the sink token, or to their mean at the same position over other texts "
        f"({sink_ui.REFERENCE_WINDOWS} windows of the shipped text).")
    loaded = ui.get_model(model)
    if loaded is None:
        return
    if not lm.is_language_model(loaded.model) or not loaded.shape.causal:
        st.warning(f"{model} is not a decoder with a language-model head, so it has no perplexity to measure. "
                   "Choose smollm2-135m (or a toy decoder) above.")
        return
    got = sink_ui.layer_outputs(model, text)
    if got is None:
        return
    ids, hidden = got
    if len(ids) < 2:
        st.warning("The text is a single token: type a longer text.")
        return
    tokens = loaded.tokenizer.convert_ids_to_tokens(ids)
    top = massive.top_activations(hidden, k=3)
    first = massive.first_massive_layer(hidden)
    peaks = [abs(t[0].value) for t in top]
    ui.chart(figs.massive_values(peaks, massive.median_magnitude(hidden)),
             (f"From layer {first} on, the largest value is over {massive.MASSIVE_VALUE:g} and over "
              f"{massive.MASSIVE_RATIO:,.0f}× the layer's median: a massive activation (Sun et al.'s definition)."
              if first is not None else "No layer has a value over 100 and 1,000× its median: this model has no "
              "massive activations in Sun et al.'s sense (random toy models have none)."))
    with st.expander("The top 3 values of every layer, and where they sit"):
        st.dataframe(pd.DataFrame([dict(layer=a.layer, rank=r + 1, token=a.token, text=tokens[a.token], dim=a.dim,
                                        value=round(a.value, 2)) for layer in top for r, a in enumerate(layer)]),
                     hide_index=True)
    if len(hidden) < 2:
        st.info(f"{model} has one layer: an edit of its output reaches no attention layer after it.")
        return
    layer, token, dims, mode = _edit_controls(hidden, top, first, peaks, ids, tokens)
    if not ui.started_by_button("Run the intervention", "sinks_massive_run",
                                "Press the button: the model runs twice (with and without the edit), each time with "
                                "a capture of every head; on a long text that takes minutes."):
        return
    means = _reference_means(model, layer, token, dims) if mode == "mean" else None
    if mode == "mean" and means is None:
        return
    edit = massive.edit_for(hidden, layer, token, dims, mode, means)
    result = sink_ui.intervention(model, text, edit)
    if result is None:
        return
    _intervention_result(result, layer, len(hidden), mode)


def _edit_controls(hidden, top, first, peaks, ids, tokens) -> tuple[int, int, list[int], str]:
    """(layer, token, the dimensions edited, mode) as the visitor sets them; by default where the values appear."""
    # the last layer's output feeds no attention layer, so it is not offered
    default_layer = min(first if first is not None else int(np.argmax(peaks[:-1])), len(hidden) - 2)
    c1, c2, c3, c4 = st.columns(4)
    with c1:
        st.session_state.setdefault("sinks_massive_layer", default_layer)  # first visit: where they appear
        layer = ui.choice_box("Edit after layer", list(range(len(hidden) - 1)), "sinks_massive_layer", default_layer)
    with c2:
        st.session_state.setdefault("sinks_massive_token", top[layer][0].token)
        # the first tokens, and wherever a layer's largest values sit: a list of every token of a long text is no
        # choice a person can make
        choices = sorted(set(range(min(len(ids), TOKEN_CHOICES))) | {a.token for t in top for a in t})
        token = ui.choice_box("At token", choices, "sinks_massive_token", top[layer][0].token)
    k = c3.slider("Largest dimensions edited", 1, 8, 3, key="sinks_massive_dims", persist_state="session")
    mode = c4.radio("Set them to", massive.MODES, key="sinks_massive_mode", persist_state="session",
                    format_func=lambda m: "zero" if m == "zero" else "their mean over other texts")
    dims = np.argsort(-np.abs(hidden[layer, token]), kind="stable")[:k].tolist()
    st.caption(f"Dimensions {', '.join(map(str, dims))} of token {token} ({tokens[token]!r}) after layer {layer}.")
    return layer, token, dims, mode


def _intervention_result(result, layer: int, n_layers: int, mode: str) -> None:
    """Perplexity and the later layers' sink mass with and without the edit."""
    after = slice(layer + 1, None)
    mass, edited = result.sink_mass[after].mean(), result.edited_sink_mass[after].mean()
    c1, c2 = st.columns(2)
    ratio = result.edited_perplexity / result.perplexity
    times = f"{ratio:,.0f}×" if ratio >= 100 else f"{ratio:.2f}×"
    c1.metric("Perplexity on your text", f"{result.edited_perplexity:,.2f}",
              delta=f"{times} the unedited {result.perplexity:.2f}", delta_color="inverse",
              delta_arrow="up" if ratio >= 1 else "down")  # a ratio takes no sign: the arrow says which way
    c2.metric(f"Sink mass of layers {layer + 1}–{n_layers - 1}", f"{edited:.1%}",
              delta=f"{100 * (edited - mass):+.1f} points vs {mass:.1%} unedited", delta_color="off")
    label = "dimensions zeroed" if mode == "zero" else "dimensions set to their mean"
    ui.chart(figs.sink_mass_change(result.sink_mass, result.edited_sink_mass, label=label),
             "Sink mass: the share of each layer's attention that queries 1..n−1 put on token 0; layers up to the "
             "edit are unchanged. Sun et al. report that zeroing the first token's massive activations wrecks the "
             "model and its sinks, while their mean (nearly the same value in every text) keeps both: the sink "
             "rests on that fixed value. On SmolLM2 zeroing them sends the perplexity up by orders of magnitude.")


def _reference_means(model: str, layer: int, token: int, dims: list[int]):
    """The dimensions' mean at this position over windows of the shipped text, or None with a message why not."""
    reference = sink_ui.reference_outputs(model)
    if reference is None:
        return None
    try:
        return massive.mean_at(reference, layer, token, dims)
    except massive.MassiveError:
        st.warning(f"The mean is taken at the same position in {sink_ui.REFERENCE_WINDOWS} windows of "
                   f"{sink_ui.REFERENCE_TOKENS} tokens of the shipped text; token {token} is past their end. "
                   "Choose an earlier token, or set the dimensions to zero.")
        return None
