"""The Heads page's caches: statistics, figures and research views of a capture, each computed once per input.

Every function is keyed on (model name, ui.model_version(name), text, captured layers, ...): model_version changes
when a toy-lab model is saved again under its name; the capture is passed underscored (not hashed: the key names it).
A table or an array comes as each session's copy (st.cache_data), a figure as the one kept for every session
(ui.figure_cache). A rerun that changes only the layer, the head or a toggle finds every figure it does not change
here: no map is renormalised, pooled or encoded as a PNG again (benchmarks/browser_latency.py).
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from attnviz import views
from attnviz.figures import heads as figs
from attnviz.figures import text as text_figs
from attnviz.once import ComputeOnce
from attnviz.stats import head_stats
from attnviz import ui
from attnviz.ui import links
from attnviz.views import FULL_MAP_MAX_TOKENS, OVERVIEW  # noqa: F401 (the page reads FULL_MAP_MAX_TOKENS here)


@st.cache_data(show_spinner=False, max_entries=16)
def stats_of(model: str, version: tuple, text: str, layers: tuple[int, ...] | None, _capture):
    """head_stats of the capture, and for a long capture (qk store) every head pooled to the grid's tile in the
    same pass (else None)."""
    if _capture.pattern is not None:  # layer by layer, so a narrowed or widened range computes no layer again
        import pandas as pd

        return pd.concat([layer_stats_of(model, version, text, layer, _capture.select([layer]))
                          for layer in _capture.layers], ignore_index=True), None
    pooled, pooled_nosink = [], []
    bar = st.progress(0.0, text="Computing every head's statistics and the grid, a block of rows at a time…")
    stats = head_stats(_capture, pool=figs.GRID_TILE, pooled_out=pooled, pooled_nosink_out=pooled_nosink,
                       progress=lambda done, total: bar.progress(done / total, text=f"Statistics: layer {done} of "
                                                                 f"{total}"))
    bar.empty()
    return stats, {False: np.stack(pooled), True: np.stack(pooled_nosink)}


@st.cache_data(show_spinner=False, max_entries=256)
def layer_stats_of(model: str, version: tuple, text: str, layer: int, _capture):
    """head_stats of one layer of a dense capture (_capture: the capture of that layer alone), the same whichever
    capture of the text it came from: the layer's weights do not depend on which others were captured."""
    return head_stats(_capture)


@ui.figure_cache(max_entries=16)  # a figure is one PNG of at most 30 x 9 maps of 48 px: < 1 MB
def grid_of(model: str, version: tuple, text: str, layers: tuple[int, ...] | None, hide_sink: bool, gamma: float,
            tile: int, _capture, _pooled=None, marks: tuple[str, ...] | None = None):
    """The grid of all heads, with the sink hidden layer by layer when asked. _pooled: the long capture's heads
    already pooled by stats_of, {hide_sink: [layer, head, m, m]}; marks: a letter beside each layer's number
    (L local, G global), or None."""
    names = [f"{x} {m}" for x, m in zip(_capture.layers, marks)] if marks else _capture.layers
    if _capture.pattern is None:  # long-text store: each layer pooled a block of rows at a time from q and k
        pooled = _pooled[hide_sink] if (_pooled is not None and tile == figs.GRID_TILE) else np.stack(
            [views.pooled_heads(_capture.inputs[layer], tile, hide_sink=hide_sink) for layer in _capture.layers])
        fig = figs.head_grid(pooled, names, gamma=gamma, tile=tile, causal=_capture.causal, n_tokens=_capture.n_tokens)
    else:  # each layer pooled once, so a narrowed or widened range pools no layer again
        pooled = np.stack([layer_tiles_of(model, version, text, layer, hide_sink, tile, _capture.pattern[i])
                           for i, layer in enumerate(_capture.layers)])
        fig = figs.head_grid(pooled, names, gamma=gamma, tile=tile, causal=_capture.causal,
                             n_tokens=_capture.n_tokens)
    return ui.same_axes(fig, "grid", model, version, text, layers, tile, marks)


@st.cache_resource(show_spinner=False, max_entries=256)  # [head, tile, tile] float32: 83 KB for 9 heads
def layer_tiles_of(model: str, version: tuple, text: str, layer: int, hide_sink: bool, tile: int, _maps):
    """One layer's heads of a dense capture (_maps [head, query, key]) max-pooled to the grid's tile, the sink hidden
    when asked (read-only, shared by every session)."""
    return ui.frozen(figs.max_pool(np.asarray(views.sink_hidden(_maps) if hide_sink else _maps, np.float32), tile))


@st.cache_data(show_spinner=False, max_entries=32)
def overview_of(model: str, version: tuple, text: str, layers, layer: int, head: int, hide_sink: bool, _capture):
    """One head of a long capture max-pooled to OVERVIEW pixels, and its weight off the sink per row: from the dense
    map when the capture has it; else read from what the capture's statistics pass pooled (float16, for texts of
    views.OVERVIEW_IN_PASS_FROM tokens or more); else a block of rows at a time from q and k (the same pooling)."""
    if _capture.pattern is not None:
        p = _capture.pattern[_capture.index_of(layer), head]
        return (figs.max_pool(views.sink_hidden(p) if hide_sink else p, OVERVIEW),
                views.mass_off_sink(p) if hide_sink else None)
    pooled = ((getattr(_capture, "summary", None) or {}).get(layer) or {}).get("_overview_nosink" if hide_sink
                                                                               else "_overview")
    if pooled is not None and pooled.shape[-1] == min(OVERVIEW, _capture.n_tokens):
        # pooled in the capture's own statistics pass (attnviz.stats.streaming_attend): a lookup
        kept = _capture.summary[layer]["_kept"][head].astype(np.float64) if hide_sink else None
        return pooled[head].astype(np.float32), kept
    x = _capture.inputs[layer]
    return (views.pooled_heads(x, OVERVIEW, hide_sink=hide_sink, heads=[head])[0],
            views.mass_off_sink(x, head) if hide_sink else None)


def head_window(capture, layer: int, head: int, rows: tuple[int, int], keys: tuple[int, int],
                hide_sink: bool) -> np.ndarray:
    """One head's exact weights [rows, keys] for the zoom window: a slice of the dense map (the sink hidden over
    each whole row first, as on the full map), or computed from the layer's q and k for these rows only."""
    if capture.pattern is not None:
        p = capture.pattern[capture.index_of(layer), head, rows[0]:rows[1]]
        return (views.sink_hidden(p) if hide_sink else p)[:, keys[0]:keys[1]]
    return views.head_window(capture.inputs[layer], head, rows, keys, hide_sink=hide_sink)


@ui.figure_cache(max_entries=64)
def head_figure(model: str, version: tuple, text: str, layers, layer: int, head: int, gamma: float,
                hide_sink: bool, _capture):
    """(the One head map, the weight each row keeps off the sink or None): a dense capture's head as drawn."""
    p = _capture.pattern[_capture.index_of(layer), head]
    fig = figs.head_detail(views.sink_hidden(p) if hide_sink else p, _capture.tokens, gamma=gamma,
                           causal=_capture.causal,
                           title=f"Layer {layer}, head {head}: attention weights (reads KV head "
                                 f"{_capture.kv_head_of[head]})")
    axes = ("map", model, version, text, layers)  # the tokens: the same for every layer and head, boost or sink
    return ui.same_axes(fig, *axes), (ui.frozen(views.mass_off_sink(p)) if hide_sink else None)


@ui.figure_cache(max_entries=64)
def remaining_figure(model: str, version: tuple, text: str, layers, layer: int, head: int, _kept):
    """What is left off the sink row by row (figs.remaining_mass), for the head named in the key."""
    return ui.same_axes(figs.remaining_mass(_kept, title=f"Layer {layer}, head {head}: what is left off the sink, "
                                                      "row by row"), "remaining", model, version, text, layers)


@ui.figure_cache(max_entries=32)
def overview_figure(model: str, version: tuple, text: str, layers, layer: int, head: int, gamma: float,
                    hide_sink: bool, _capture):
    """A long capture's head: its max-pooled overview figure and the weight each row keeps off the sink."""
    pooled, kept = overview_of(model, version, text, layers, layer, head, hide_sink, _capture)
    n = _capture.n_tokens
    fig = figs.pooled_overview(pooled, n, gamma=gamma, causal=_capture.causal,
                               title=f"Layer {layer}, head {head}: every {n:,} x {n:,} weight, max-pooled to "
                                     f"{pooled.shape[-1]} px")
    return ui.same_axes(fig, "overview", model, version, text, layers), ui.frozen(kept), pooled.shape[-1]


def query_rows(capture, layer_ids: list[int], query: int, hide_sink: bool) -> np.ndarray:
    """[layer x head, key]: every head of the captured layers layer_ids (positions among capture.layers) from one
    query, in both stores, with the sink hidden when asked."""
    n = capture.n_tokens
    if capture.pattern is None:
        rows = np.concatenate([capture.layer_rows(capture.layers[i], query, query + 1) for i in layer_ids])
    else:
        rows = capture.pattern[layer_ids, :, query, :]
    rows = rows.reshape(-1, n)
    return views.sink_hidden(rows) if hide_sink else rows


@ui.figure_cache(max_entries=64)
def token_figure(model: str, version: tuple, text: str, layers, layer_ids: tuple[int, ...], query: int,
                 gamma: float, hide_sink: bool, _capture):
    """Where one query looks, head by head (figs.token_looks), over the captured layers at positions layer_ids."""
    rows = query_rows(_capture, list(layer_ids), query, hide_sink)
    keys = query + 1 if _capture.causal else _capture.n_tokens
    labels = [f"L{_capture.layers[i]} H{h}" for i in layer_ids for h in range(_capture.n_heads)]
    fig = figs.token_looks(rows[:, :keys], _capture.tokens, labels, query, gamma=gamma)
    return ui.same_axes(fig, "token", model, version, text, layers, layer_ids, query)


@st.cache_data(show_spinner=False, max_entries=64)
def text_view(model: str, version: tuple, text: str, layers, layer: int, head: int, query: int, hide_sink: bool,
              _capture) -> str:
    """The text-centred view's HTML: every token shaded by the weight query `query` of (layer, head) gives it."""
    weights = query_rows(_capture, [_capture.index_of(layer)], query, hide_sink)[head]
    return text_figs.shaded_text(_capture.tokens, weights, selected=query,
                                 visible=query + 1 if _capture.causal else None,
                                 label=f"weight from token {query}")


# -- the link: a shared URL reproduces the view ------------------------------------------------------------------

LINK = links.Link("heads_", {
    "model": links.Param("heads_model", "model"),
    "text": links.Param("heads_text", "text", "text"),
    "layer": links.Param("heads_layer", "int", "layer"),
    "head": links.Param("heads_head", "int", "head"),
    "layers": links.Param("heads_layer_range", "range", "layer"),
    "boost": links.Param("heads_link_boost", "choice", choices={"0": False, "1": True}),  # over the long-text default
    "sink": links.Param("heads_hide_sink", "choice", choices={"0": False, "1": True}),
    "query": links.Param("heads_link_query", "int", "token", within="text"),  # applied once the tokens are known
    "tab": links.Param("heads_tab", "choice", also=("heads_tab_open",)),  # its choices: the page's tabs
})


def choice_box(label: str, options: list[int], key: str) -> int:
    """ui.choice_box, warning when a link asked for a layer or head this model does not have."""
    return links.choice_box(LINK, label, options, key)


def export_file(capture, fmt: str, export: dict, dtype):
    """The file a download button hands the browser, made when the button is pressed: the capture (the layers and
    heads in `export`) streamed into a temporary file a block of rows at a time (files.write_capture), returned open
    for reading, its bytes admitted by the memory budget while it is written; the pattern is never built in memory."""
    from attnviz import budget
    from attnviz.capture.files import export_bytes, export_to_temporary_file

    with budget.BUDGET.admit(export_bytes(capture, **export, dtype=dtype), what="This export"):
        return export_to_temporary_file(capture, fmt, **export, dtype=dtype)


# -- research views: predictions, statistics over many texts (the induction test: ui/induction.py) ---------------------

_PREDICTIONS = ComputeOnce(max_items=4)  # shared by every session: one forward pass per (model, text)


def predicts_next_token(loaded) -> bool:
    """Whether the model has a language-model head (an encoder has none: no loss, no top-k)."""
    from attnviz import lm

    return lm.is_language_model(loaded.model)


def predictions_of(model: str, version: tuple, text: str, k: int, loaded, capture):
    """(losses [n - 1] in nats, a table of every position's top-k next tokens) of a language model on the
    capture's tokens (attnviz.lm.predictions: fused attention, the head applied a block of positions at a time), at
    any length the capture took; computed once for every session. The work is admitted under the memory budget
    with lm.prediction_bytes first: a text that could never fit is refused with the numbers before anything runs.
    None after a message."""
    from attnviz import budget, lm, ui
    from attnviz.capture import attention_modules, uses_interface

    n = capture.n_tokens
    key = (model, version, text, int(k))
    found, value = _PREDICTIONS.peek(key)
    if found:
        return value
    need = lm.prediction_bytes(loaded.model.config, n, k=k,
                               uses_sdpa=uses_interface(attention_modules(loaded.model)[0]))
    waiting = st.empty()

    def on_poll(held=None, position=None):  # also touches the page while waiting, so Streamlit can stop the run
        waiting.info(f"Waiting for memory: other visitors' work holds {budget.BUDGET.held / 2**30:.1f} GiB of the "
                     f"{budget.BUDGET.limit / 2**30:.1f} GiB budget, and these predictions need {need / 2**30:.2f} "
                     "GiB. They start by themselves as soon as it is free.")

    def compute(progress):
        result = lm.predictions(loaded.model, capture.token_ids, k=k, progress=progress)
        return result.losses, prediction_table(loaded.tokenizer, capture.tokens, result)

    try:
        with budget.BUDGET.admit(need, on_wait=on_poll, on_poll=on_poll,
                                 what=f"Predicting every next token of {n:,} tokens"):
            waiting.empty()
            return ui.computed_once(_PREDICTIONS, key, f"Predicting the next token at {n:,} positions (every "
                                    "layer, then the head a block of positions at a time)", compute,
                                    errors=(lm.PredictionError,))
    except budget.OverBudget as exc:
        st.error(str(exc))
        return None


def prediction_table(tokenizer, tokens: list[str], result):
    """The Predictions table: each position, the token after it, its loss, rank and probability, and the model's
    top-k next tokens with their probabilities (each distinct id decoded once)."""
    import pandas as pd

    from attnviz.tokenizer import readable_tokens

    top = result.top
    distinct = np.unique(top.ids)
    names = dict(zip(distinct.tolist(), readable_tokens(tokenizer, distinct.tolist())))
    n = len(tokens)
    table = pd.DataFrame({
        "position": np.arange(n), "token": tokens,
        "next token": [*tokens[1:], ""],
        "loss (nats)": [*result.losses, np.nan],
        "rank of next": [*top.actual_rank.astype(float), np.nan],
        "p(next)": [*top.actual_prob, np.nan]})
    for j in range(top.ids.shape[1]):
        table[f"top {j + 1}"] = [f"{names[i]} ({p:.2f})" for i, p in zip(top.ids[:, j].tolist(), top.probs[:, j])]
    return table


@st.cache_data(show_spinner=False, max_entries=16)
def corpus_of(model: str, version: tuple, source: str, window: int, max_windows: int):
    """attnviz.corpus.corpus_stats over the windows of `source` (a text, or an uploaded file's text), with a
    progress bar; and the windows' summary."""
    from attnviz import ui
    from attnviz.corpus import corpus_stats, token_windows, window_summary

    loaded = ui.cached_model(model, version)
    windows = token_windows(loaded, source, window, max_windows=max_windows)
    bar = st.progress(0.0, text=f"{model}: statistics of {len(windows)} windows…")
    table = corpus_stats(loaded, windows, progress=lambda done, total: bar.progress(
        done / total, text=f"{model}: window {done} of {total}"))
    bar.empty()
    return table, window_summary(windows)
