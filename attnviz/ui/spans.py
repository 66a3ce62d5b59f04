"""The Heads page's span attention: a set of query tokens (a span, or tokens picked one by one) and the attention
they give every key in one head, summed or averaged over them (AttentionCapture.span_attention)."""

from __future__ import annotations

import streamlit as st

from attnviz import snippets, ui
from attnviz.figures import heads as figs
from attnviz.figures.experiments import BARS_AT_MOST
from attnviz.ui import snippets as snippet_ui

MAX_PICKED = 2048  # tokens offered one by one; a longer text is selected as a span
HOW = {"Sum over the queries": "sum", "Mean over the queries": "mean"}
RULES = ("The rules, as Clark et al. (2019) merge a word's tokens: attention TO a set of keys is the **sum** of their "
         "columns, attention FROM a set of queries is the **mean** of their rows. Here each key stays a token and the "
         "selected queries' rows are summed (key j gets the total weight the set gives it; the weights add up to the "
         "number of queries) or averaged (they add up to 1, as one token's row does).")


def selected_queries(n: int, tokens) -> list[int]:
    """The query positions the visitor selects: a span from a range slider, or tokens from a list (texts up to
    MAX_PICKED tokens). A value kept from a longer text is cut to this one."""
    modes = ["A span", "Tokens one by one"] if n <= MAX_PICKED else ["A span"]
    if st.session_state.get("heads_span_mode") not in modes:
        st.session_state["heads_span_mode"] = modes[0]
    mode = st.radio("Select", modes, horizontal=True, key="heads_span_mode", persist_state="session")
    if mode == "A span":
        kept = st.session_state.get("heads_span_range")
        if not kept or not 0 <= kept[0] <= kept[1] < n:
            st.session_state["heads_span_range"] = (max(0, n - 4), n - 1)
        if n == 1:
            return [0]
        first, last = st.slider("Query span (first, last token)", 0, n - 1, key="heads_span_range",
                                persist_state="session")
        return list(range(first, last + 1))
    kept = [i for i in st.session_state.get("heads_span_tokens", []) if i < n]
    st.session_state["heads_span_tokens"] = kept
    return sorted(st.multiselect("Query tokens", list(range(n)), key="heads_span_tokens", persist_state="session",
                                 format_func=lambda i: f"{i}: {tokens[i]}",
                                 placeholder="Pick the query tokens to combine"))


def span_panel(capture, layer: int, head: int, *, model: str, text: str, layers) -> None:
    """The selection, the chart of what it attends to in (layer, head), the rules, and its code; an empty selection
    draws nothing and says why."""
    st.markdown(f"**What a set of queries attends to, layer {layer}, head {head}**")
    left, right = st.columns([3, 2])
    with left:
        queries = selected_queries(capture.n_tokens, capture.tokens)
    with right:
        how = HOW[st.radio("Combine their rows", list(HOW), horizontal=True, key="heads_span_how",
                           persist_state="session")]
    st.caption(RULES)
    if not queries:
        st.info("No query token is selected, so there is nothing to combine: pick one or more tokens above (or "
                "select a span) to see the attention they give every key.")
        return
    weights = capture.span_attention(layer, head, queries, how=how)  # [key] float64
    code = snippets.span_attention(model, text, layer, head, queries, how=how, layers=layers)
    fig = figs.span_bars(weights, capture.tokens, layer, head, queries, how)
    ui.plot(fig, width="stretch")
    shape = "Each bar is a key token" if len(weights) <= BARS_AT_MOST else "Each step of the line is a key token"
    st.caption(f"{shape}: the weight the {len(queries)} selected quer"
               f"{'y gives' if len(queries) == 1 else 'ies give'} it, {'summed' if how == 'sum' else 'averaged'} "
               f"over them (the weights add up to {weights.sum():.3f}). The raw weights, with the sink shown"
               + ("; a causal query gives no weight to later keys." if capture.causal else "."))
    snippet_ui.show(code)
