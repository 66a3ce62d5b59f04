"""Attention sinks: where the attention mass goes, and what breaks when the first tokens are evicted."""

import numpy as np
import pandas as pd
import streamlit as st

from attnviz import sinks, snippets, streaming, ui, views
from attnviz.figures import compare as compare_figs
from attnviz.figures import sinks as figs
from attnviz.pooling import MIN_REMAINING
from attnviz.ui import links
from attnviz.ui import mixers_panel
from attnviz.ui.massive_panel import massive_panel
from attnviz.ui import sinks as sink_ui
from attnviz.ui import snippets as snippet_ui

DEFAULT_TEXT = ("Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived "
                "in Liberty, and dedicated to the proposition that all men are created equal.")
MAX_CHARS = ui.MAX_TEXT_CHARS  # long texts keep q and k only and are read a block of rows at a time
MAX_MAP_TOKENS = 160  # one head's map is drawn for at most this many tokens (the sinks are at the start)
EXPERIMENT_MODEL = "smollm2-135m"
WINDOWS = [16, 32, 64, 128, 256, 512, 1024]
POSITIONS = {"inside the cache (StreamingLLM)": "cache", "as in the text": "original"}


def pick_model_and_text() -> tuple[str | None, str | None]:
    """The model and the text every section reads, the text checked once against the page's one limit (the
    model's context, and ui.MAX_TEXT_CHARS characters): (model, None) after a message when the text cannot be read,
    so the sections that need it say nothing more and start no work."""
    links.read(sink_ui.LINK)
    left, right = st.columns([1, 2])
    with left:
        model = ui.model_picker("sinks_model", default=EXPERIMENT_MODEL)
    with right:
        text = ui.text_input("sinks_text", DEFAULT_TEXT, height=80)
    if model is not None and not links.model_confirmed(sink_ui.LINK, model):  # a link's folder loads once confirmed
        return None, None
    loaded = ui.get_model(model) if model is not None else None
    if loaded is None:
        links.forget_model(sink_ui.LINK)
        return None, None
    limit = loaded.shape.max_positions
    st.caption(f"This page reads texts of up to {MAX_CHARS:,} characters"
               + (f" and {limit:,} tokens, {model}'s context" if limit else "") + "; long texts keep only each "
               "layer's q and k and are read a block of rows at a time. (The eviction experiment at the bottom runs "
               "on its own text.)")
    readable = ui.text_ready(text, MAX_CHARS, empty="The text is empty: type a text above to measure its sinks.",
                             too_long="The text is {n:,} characters, over the {limit:,} this page reads: shorten it.")
    return model, text if readable and ui.fits_context(loaded, text, model) else None


def show_sink_scores(model: str, text: str) -> None:
    capture = ui.get_capture(model, text, store="auto")  # a long text keeps q and k only: read a block at a time
    if capture is None:
        return
    if not capture.layers:
        st.info(f"{model} has no softmax attention, so no sink score: its layers' exact maps are on the Heads page.")
        return
    if capture.n_tokens < 2:
        st.warning("The text is a single token: a sink needs at least two. Type a longer text.")
        return
    learned = capture.learned_sink  # [layer, head, query] or None
    if learned is not None:
        by_layer = learned.mean(axis=(1, 2))
        st.info(f"{model} also has a learned sink: one logit per head that joins every row's softmax and belongs to "
                f"no token (gpt-oss). It takes {learned.mean():.1%} of all attention here (layer means from "
                f"{by_layer.min():.1%} to {by_layer.max():.1%}). The α_k below count the weights on tokens only, "
                "so a head whose learned sink takes most of its attention has small α_k everywhere.")
    alpha = sink_ui.sink_scores(model, text, capture)  # [layer, head, key]
    share = sinks.sink_head_share(alpha)
    n_sink_heads = int(sinks.sink_heads(alpha).sum())
    n_heads = alpha.shape[0] * alpha.shape[1]
    found = [int(k) for k in sinks.sink_keys(alpha, causal=capture.causal)]
    unjudged = np.flatnonzero(~sinks.judged_keys(capture.n_tokens, causal=capture.causal))
    hidden = found or [0]
    st.caption(f"{model}: {capture.n_tokens} tokens, {n_sink_heads} of {n_heads} heads are sink heads "
               f"(α₀ > {sinks.SINK_THRESHOLD:g}). "
               + ("Causal model: α_k averages over the queries t ≥ k that can see key k." if capture.causal else
                  "Bidirectional model: every query sees every key, so α_k averages over all queries."))
    if capture.n_tokens < 8:
        st.info("With only a few tokens every key gets a large share by default (1/n for uniform attention): "
                "use a longer text for a meaningful α₀.")

    n = capture.n_tokens
    relation = (f" α₀ counts query 0, which can only attend to token 0, while the Heads page's sink_mass leaves it "
                f"out: α₀ = (1 + (n − 1) · sink_mass) / n, here n = {n}." if capture.causal else
                f" α₀ averages all n queries, while the Heads page's sink_mass leaves query 0 out: "
                f"α₀ = (A₀₀ + (n − 1) · sink_mass) / n, A₀₀ being query 0's attention on itself, here n = {n}.")
    ui.chart(figs.sink_score_grid(alpha[..., 0], capture.layers, threshold=sinks.SINK_THRESHOLD),
          "Each cell is one head: the mean attention its queries give token 0. Bright rows are layers where almost "
          "every head parks its attention on the first token, whatever that token says." + relation)
    snippet_ui.show(snippets.sinks_grid(model, text))
    ui.chart(figs.sink_share_bars(share, capture.layers, threshold=sinks.SINK_THRESHOLD),
          "In a trained decoder such as SmolLM2 the first layers read content and from some depth on most heads "
          "are sink heads; the toy models, with random weights, have none to speak of.")
    _sink_keys(alpha, capture, found, unjudged, n_heads)
    # a gated model (Qwen3-Next): the gate beside the sink, cached on the capture's key
    mixers_panel.gates_beside_sinks(capture, alpha, (model, ui.model_version(model), text, None))
    one_head_view(model, capture, alpha, hidden)

def _sink_keys(alpha, capture, found: list[int], unjudged, n_heads: int) -> None:
    """Which tokens are sinks: each key's mean alpha, the sinks marked, and the table of the top keys."""
    n = capture.n_tokens
    top = sinks.top_sink_keys(alpha, capture.tokens, causal=capture.causal)
    quarter = " and at least a quarter of the queries see it" if capture.causal else ""
    rule = (f"α_k > {sinks.SINK_THRESHOLD:g} in at least {sinks.SINK_HEAD_SHARE:.0%} of the heads (here "
            f"{sinks.min_sink_heads(n_heads)} of {n_heads}){quarter}")
    late = (f" Grey: the last keys, seen by fewer than a quarter of the {n} queries (key k by {n} − k of them); "
            "their α_k averages a few rows, for the last key only the newest token's attention to itself, so it "
            "is inflated and they are neither called sinks nor ranked." if len(unjudged) else "")
    ui.chart(figs.key_score_bars(alpha.mean(axis=(0, 1)), capture.tokens, highlight=found, unjudged=unjudged),
          f"Which tokens are sinks: a key is a sink (orange) when {rule}"
          + (f": here key{'s' if len(found) > 1 else ''} {', '.join(map(str, found))}." if found
             else "; none is here.") + late)
    st.dataframe(pd.DataFrame([dict(position=k.position, token=k.token, mean_alpha=round(k.mean_score, 4),
                                    sink_heads=k.sink_heads, heads_where_largest=k.top_heads) for k in top]),
                 hide_index=True)
    st.caption(f"The {len(top)} keys with the largest mean α"
               + (" among those at least a quarter of the queries see (grey bars left out)" if len(unjudged) else "")
               + f". sink_heads counts the heads with α_k > {sinks.SINK_THRESHOLD:g} (a sink needs "
               f"{sinks.min_sink_heads(n_heads)}); heads_where_largest counts the heads for which this key gets more "
               "than any other ranked key.")


@st.fragment
def one_head_view(model: str, capture, alpha: np.ndarray, hidden) -> None:
    """One head with and without its sinks: its layer, head and toggle rerun this part of the page only."""
    st.subheader("One head, with and without its sink")
    li_default, head_default = (int(i) for i in np.unravel_index(np.argmax(alpha[..., 0]), alpha.shape[:2]))
    c1, c2, c3 = st.columns(3)
    with c1:
        st.session_state.setdefault("sinks_layer", capture.layers[li_default])  # first visit: the strongest sink
        st.session_state.setdefault("sinks_head", head_default)
        layer = links.choice_box(sink_ui.LINK, "Layer", list(capture.layers), "sinks_layer", capture.layers[li_default])
    with c2:
        head = links.choice_box(sink_ui.LINK, "Head", list(range(alpha.shape[1])), "sinks_head", head_default)
    with c3:
        hide = st.toggle("Hide the sinks", key="sinks_hide", persist_state="session",
                         help=f"Zero the attention on the sink keys (positions {', '.join(map(str, hidden))}) and "
                              "renormalise each row (attnviz.views.sink_hidden), so the rest of the pattern "
                              f"shows; a row left with under {MIN_REMAINING:.0%} of its weight is left blank.")
    sink_ui.write_link(model)  # a rerun of this part alone keeps the link up to date
    li = capture.layers.index(layer)
    shown = min(capture.n_tokens, MAX_MAP_TOKENS)
    p = np.array(capture.head_pattern(layer, head, rows=(0, shown)), dtype=float)  # [shown, n]: whole rows
    blank = 0
    if hide:
        p = views.sink_hidden(p, hidden)  # a row left with too little weight is NaN, drawn blank
        blank = int(np.isnan(p[:shown]).all(-1).sum())
    if blank == shown:
        st.info(f"Every row of layer {layer}, head {head} gives all but under {MIN_REMAINING:.0%} of its weight to "
                "the sink keys: with them hidden nothing is left to draw. Pick another head, or turn Hide the sinks "
                "off.")
        return
    ui.chart(figs.head_map(p[:shown, :shown], capture.tokens[:shown],
                        title=f"Layer {layer}, head {head}: α₀ = {alpha[li, head, 0]:.2f}"
                        + (f" (keys {', '.join(map(str, hidden))} hidden, rows renormalised)" if hide else "")),
          "Rows are queries, columns keys. A bright first column is the sink; hide it and the map's colour scale "
          "spreads over what the head reads besides the sink."
          + (f" {blank} of {shown} rows keep under {MIN_REMAINING:.0%} of their weight off the sink keys and are "
             "left blank." if blank else "")
          + (f" Only the first {shown} of {capture.n_tokens} tokens are drawn." if shown < capture.n_tokens else ""))


def show_metric_over_texts(model: str, text: str | None) -> None:
    st.markdown(
        "One text says little about a model. Gu et al. measure over many: **Sink₀^ε** is the share of all "
        "(text, layer, head) triples whose α₀ exceeds ε (0.3 in the paper, on 64-token texts). Here the texts "
        "are evenly spaced windows of the public-domain text shipped with attnviz, in the model's own tokens, "
        "plus your text above.")
    c1, c2, c3, c4 = st.columns(4)
    n_windows = c1.slider("Windows of the shipped text", 1, 32, 8, key="sinks_metric_windows",
                          persist_state="session")
    n_tokens = c2.select_slider("Tokens per window", [16, 32, 64, 128], value=64, key="sinks_metric_tokens",
                                persist_state="session")
    eps = c3.slider("Threshold ε", 0.05, 0.95, sinks.SINK_THRESHOLD, step=0.05, key="sinks_metric_eps",
                    persist_state="session")
    own = c4.checkbox("Add my text", value=True, key="sinks_metric_own", persist_state="session")
    model_b = None
    if st.toggle("Compare with a second model", key="sinks_metric_compare", persist_state="session"):
        model_b = ui.model_picker("sinks_metric_model_b", label="Model B",
                                  default="gemma3-270m" if model == "smollm2-135m" else "smollm2-135m")
    if not ui.started_by_button("Measure over the texts", "sinks_metric_run",
                                "Press the button to capture every text: about a second per text on a quiet CPU for "
                                "SmolLM2 (30 layers), a moment for the toy models. Results are kept: moving ε is "
                                "instant."):
        return
    if own and not text:
        st.caption("Your text is left out: the top of the page says why.")
    measured = {name: _alpha_over_texts(name, n_windows, n_tokens, text if own else None)
                for name in (model, model_b) if name is not None}
    if any(alpha is None for alpha, _ in measured.values()):
        return
    for name, (alpha, loaded) in measured.items():
        _sink_rate_of(name, alpha, loaded.shape, eps)
    if model_b is not None:
        _sink_rates_compared(measured, eps)


def _alpha_over_texts(name: str, n_windows: int, n_tokens: int, text: str | None):
    """(alpha_0 [text, layer, head], the loaded model) over the shipped windows in the model's own tokens, plus
    the text; (None, None) after a message."""
    loaded = ui.get_model(name)
    if loaded is None:
        return None, None
    texts = sinks.text_windows(streaming.shipped_text(), loaded.tokenizer, n_tokens=n_tokens, n_windows=n_windows)
    alpha = sink_ui.alpha_over_texts(name, tuple(texts + ([text] if text else [])))
    return (alpha, loaded) if alpha is not None else (None, None)


def _sink_rate_of(model: str, alpha: np.ndarray, shape, eps: float) -> None:
    """One model's Sink₀^ε: the metric (and per layer kind, where it has two), by layer, and against ε."""
    whole = sinks.sink_rate(alpha, eps)
    kinds = [shape.layer_kind(x) for x in range(alpha.shape[1])]
    by_kind = sinks.sink_rate_by_kind(alpha, kinds, eps) if shape.kinds_summary() else {}
    cols = st.columns(1 + len(by_kind))
    cols[0].metric(f"Sink₀^{eps:g} of {model}", f"{whole:.1%}",
                   help=f"{alpha.shape[0]} texts × {alpha.shape[1]} layers × {alpha.shape[2]} heads = "
                        f"{alpha.size:,} triples")
    for col, (kind, rate) in zip(cols[1:], by_kind.items()):
        col.metric(f"on its {kind} layers ({kinds.count(kind)})", f"{rate:.1%}")
    if by_kind:
        st.caption(f"{model}'s layers attend two ways. {shape.kinds_summary()}.")
    ui.chart(figs.sink_rate_bars(sinks.sink_rate_by_layer(alpha, eps), list(range(alpha.shape[1])), eps=eps,
                                 whole=whole, n_texts=alpha.shape[0], model=model, kinds=kinds if by_kind else None),
             f"Each bar is one layer: the share of its (text, head) pairs with α₀ > {eps:g}. In SmolLM2 the first "
             "layers read content and from some depth on nearly every head is a sink on nearly every text: the "
             "sink is a habit of the model, not of one text. Random toy models have none.")
    grid = np.round(np.linspace(0.05, 0.95, 19), 2)
    ui.chart(figs.sink_rate_curve(grid, sinks.sink_rate_curve(alpha, grid), eps=eps, model=model),
             "The same metric for every threshold: a model with real sinks keeps a high share far above 0.3, "
             "because its sink heads give the first token most of their attention, not just a third of it.")


def _sink_rates_compared(measured: dict, eps: float) -> None:
    """Two models of any shape: α₀ over every (text, layer, head) side by side, and Sink₀^ε by relative depth."""
    st.subheader("The two models side by side")
    ui.chart(compare_figs.distributions({name: alpha.ravel() for name, (alpha, _) in measured.items()},
                                        title="α₀ of every (text, layer, head)", y_title="α₀ (share of attention)"),
             "Each point is one head on one text: the mean attention its queries give the first token. A model "
             "whose heads sit near 1 parks most attention there; the box spans the middle half.")
    curves = {name: compare_figs.depth_curve(loaded.shape, range(alpha.shape[1]),
                                             100 * sinks.sink_rate_by_layer(alpha, eps))
              for name, (alpha, loaded) in measured.items()}
    ui.chart(compare_figs.depth_curves(curves, title=f"Sink₀^{eps:g} by layer, against relative depth",
                                       y_title="Sink₀^ε (% of the layer's (text, head) pairs)"),
             "Each point is one layer at its place in the stack (0 the first, 1 the last), so a 30-layer and an "
             "18-layer model line up. Triangles mark local (sliding-window) layers, circles global ones.")


def show_experiment() -> None:
    st.markdown(
        "StreamingLLM (Xiao et al., ICLR 2024) keeps a fixed-size KV cache for endless text. The obvious cache, "
        "a **sliding window** of the most recent tokens, breaks as soon as the first tokens leave it, because the "
        "heads above have nowhere left to park their attention. Keeping just the **first 4 tokens** as sinks "
        "repairs it. Here SmolLM2-135M reads the Declaration of Independence and two speeches of Lincoln "
        "(public domain, shipped with attnviz) three ways: (a) full attention, (b) a window of the last W "
        "tokens, (c) the same window plus the first tokens.")
    window, n_sinks, positions, smoothing = _experiment_controls()
    if not ui.started_by_button("Run the eviction experiment", "sinks_run",
                                f"Press the button to run it: three forward passes of {EXPERIMENT_MODEL} (this "
                                "section's model, whatever model is chosen above) over the "
                                f"{sink_ui.shipped_tokens(EXPERIMENT_MODEL):,} tokens it makes of the shipped text, "
                                "from under a minute to several on a 2-core CPU, depending on how busy it is; each "
                                "shows its progress. Every result is kept for every visitor: full attention is "
                                "computed once for all windows, and a setting already run is instant.",
                                type="primary"):
        return
    loaded = ui.get_model(EXPERIMENT_MODEL)
    if loaded is None:
        return
    text = streaming.shipped_text()
    ids = loaded.tokenizer(text)["input_ids"]

    def cached(i, name, w, s, compute):
        label = f"({'abc'[i]}) {name}"
        bar = st.progress(0.0, text=label)
        losses = sink_ui.cached_losses(text, w, s, positions, compute, bar, label)
        bar.progress(1.0, text=f"{label}: done")
        return losses

    with st.status("Running the eviction experiment…", expanded=True) as status:
        result = streaming.streaming_experiment(loaded.model, ids, window=window, n_sinks=n_sinks,
                                                positions=positions, cached=cached)
        status.update(label="Eviction experiment: done", state="complete", expanded=False)

    cols = st.columns(3)
    full = result.perplexity[streaming.SETTINGS[0]]
    for i, (col, (name, ppl)) in enumerate(zip(cols, result.perplexity.items())):
        col.metric(f"({'abc'[i]}) {name}: perplexity", f"{ppl:.2f}",
                   delta=None if name == streaming.SETTINGS[0] else f"{ppl / full - 1:+.1%} vs full",
                   delta_color="inverse")
    st.markdown("**What SmolLM2 shows:** " + streaming.describe_experiment(result, "SmolLM2-135M"))
    smoothed = {name: streaming.rolling_mean(v, smoothing) for name, v in result.losses.items()}
    ui.chart(figs.loss_curves(result.positions, smoothed, window=window, smoothing=smoothing),
          "Before the dotted line the window still holds token 0, so the three curves coincide. After it, the gap "
          "between (b) and (a) is the price of losing the sink, and (c) shows how much keeping the first tokens "
          "wins back.")
    _how_eviction_is_computed()

def _experiment_controls() -> tuple[int, int, str, int]:
    """(window W, sink tokens kept, where the sinks sit: "cache" or "original", smoothing) as the visitor sets them."""
    c1, c2, c3, c4 = st.columns(4)
    window = c1.select_slider("Window W (recent tokens kept)", WINDOWS, value=streaming.DEFAULT_WINDOW,
                              key="sinks_window", persist_state="session")
    n_sinks = c2.slider("Sink tokens kept in (c)", 0, 16, streaming.DEFAULT_SINKS, key="sinks_n_sinks",
                        persist_state="session")
    positions = POSITIONS[c3.radio("Positions of the sinks", list(POSITIONS), key="sinks_positions",
                                   persist_state="session",
                                   help="StreamingLLM numbers the cached tokens by their slot in the cache; the "
                                        "other choice keeps their place in the text.")]
    smoothing = c4.select_slider("Smoothing (tokens)", [1, 8, 32, 128], value=32, key="sinks_smoothing",
                                 persist_state="session")
    return window, n_sinks, positions, smoothing


def _how_eviction_is_computed() -> None:
    """Why one forward pass per setting gives the rolling cache's numbers."""
    with st.expander("How the eviction is computed, and why not token by token"):
        st.markdown(
            "StreamingLLM decodes one token at a time against a rolling KV cache and numbers the cached tokens by "
            "their slot in the cache. Doing that literally costs one forward call per token, about 2,900 calls "
            "per setting here, each paying for all the weights; `benchmarks/sinks.py` times it against the "
            "single pass. "
            "attnviz gets the same numbers from **one forward pass per setting**:\n"
            "- each query t may read only the sinks and keys t−W+1…t (a custom mask), so every token's keys and "
            "values are exactly what they were when that token was the newest one in the cache;\n"
            "- RoPE scores depend only on query–key distance: the window keys keep their distances, and the sink "
            "columns are scored with the query rotated to its slot in the cache, min(t, sinks + W − 1).\n\n"
            "The tests check this single pass against a literal token-by-token rolling cache, loss by loss, and "
            "full attention against the model's own loss. *As in the text* keeps text positions for the sinks "
            "(their distance to the query grows along the text), which is what a plain masked forward pass gives.")


st.title("Attention sinks")
st.markdown(
    "Trained decoders pour a large share of their attention onto the **first token**, whatever it says. It is not "
    "a bug of the heatmap: softmax makes every row sum to 1, so a head that has nothing useful to read must still "
    "put its attention somewhere, and models learn to park it on a token every query can see. Gu et al. "
    "(ICLR 2025, *When Attention Sink Emerges in Language Models*) measure it per head:")
st.latex(r"\alpha_k = \frac{1}{T-k}\sum_{t=k}^{T-1} A_{t,k}\qquad\text{a sink head has } \alpha_0 > 0.3")
picked, typed = pick_model_and_text()  # typed is None when the text cannot be read: the top said why
if typed is not None:
    show_sink_scores(picked, typed)
st.header("The sink metric over many texts")
if picked is not None:
    show_metric_over_texts(picked, typed)
st.header("Massive activations: what the sink is built on")
if typed is not None:
    massive_panel(picked, typed)
elif picked is not None:
    st.caption("It reads your text: the top of the page says why it cannot.")
st.header("Evict the first tokens: the StreamingLLM experiment")
show_experiment()
if picked is not None:
    sink_ui.write_link(picked)
