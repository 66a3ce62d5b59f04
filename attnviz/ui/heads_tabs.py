"""Parts of the Heads page that run on their own (fragments): the Many texts tab (every head's statistics averaged
over windows, two models compared), and the One head tab's zoom window on a long text. The Induction test tab:
ui/induction.py.
"""

from __future__ import annotations

import streamlit as st

from attnviz import ui
from attnviz.corpus import CorpusError, compare_heads, layer_means
from attnviz.figures import compare as compare_figs
from attnviz.figures import heads as figs
from attnviz.stats import COLUMNS
from attnviz.ui import heads as cache

MAX_CORPUS_CHARS = 500_000  # an uploaded text: at most 64 windows of it are run anyway


@st.fragment
def zoom_panel(capture, key: tuple, layer: int, head: int, hide_sink: bool, gamma: float) -> None:
    """A long head's window at full resolution: moving the window reruns this panel only. key: (model, version,
    text, captured layers), what every cached view of this capture is keyed on."""
    n = capture.n_tokens
    z1, z2, z3 = st.columns(3)
    size = z3.select_slider("Window (tokens)", [32, 64, 96, 128, 160], 64, key="heads_zoom_size",
                            persist_state="session")
    span = max(0, n - size)  # the last window start; the window is the whole text when it is that short
    q0 = z1.slider("Queries from", 0, span, span, key="heads_zoom_q", persist_state="session") if span else 0
    k0 = z2.slider("Keys from", 0, span, min(span, q0), key="heads_zoom_k", persist_state="session") if span else 0
    ui.plot(window_figure(*key, layer, head, (q0, min(n, q0 + size)), (k0, min(n, k0 + size)), hide_sink, gamma,
                          capture), width="stretch")
    st.write("The window's weights at full resolution, "
             + ("read from the capture." if capture.pattern is not None else
                "computed from the layer's q and k for these rows only.")
             + (" Grey cells are masked: a causal query cannot see later keys." if capture.causal else ""))


@ui.figure_cache(max_entries=32)
def window_figure(model: str, version: tuple, text: str, layers, layer: int, head: int, rows: tuple, keys: tuple,
                  hide_sink: bool, gamma: float, _capture):
    """The zoom window's figure (figs.window_detail of cache.head_window), built once for every session: a rerun
    of the page that leaves the window as it was (another panel's control) draws it again without computing it."""
    window = cache.head_window(_capture, layer, head, rows, keys, hide_sink)
    (q0, _), (k0, _) = rows, keys
    return figs.window_detail(window, _capture.tokens, q0, k0, gamma=gamma,
                              causal_offset=0 if _capture.causal else None,
                              title=f"Layer {layer}, head {head}: queries {q0:,}–{q0 + len(window) - 1:,}, keys "
                                    f"{k0:,}–{k0 + window.shape[1] - 1:,}")


@st.fragment
def many_texts_panel(model: str, version: tuple, text: str, loaded) -> None:
    """The Many texts tab: every head's statistics averaged over windows of the text or an upload, and two models
    compared."""
    st.write("One text says little about a head. Average every head's statistics over many windows of text (each "
             "run on its own), and compare two models head by head.")
    source_kind = st.radio("Texts", ["Windows of the text above", "An uploaded .txt file"], horizontal=True,
                           key="heads_corpus_source", persist_state="session")
    source = text if not source_kind.startswith("An uploaded") else _uploaded_text()
    if source is None:
        return
    w1, w2, w3 = st.columns(3)
    window = w1.select_slider("Window (tokens)", [32, 64, 128, 256, 512], 128, key="heads_corpus_window",
                              persist_state="session")
    max_windows = w2.slider("Windows at most", 1, 64, 16, key="heads_corpus_windows", persist_state="session")
    column = w3.selectbox("Statistic", COLUMNS, key="heads_corpus_stat", persist_state="session")
    model_b = None
    if st.toggle("Compare with a second model (or toy-lab checkpoint)", key="heads_corpus_compare",
                 persist_state="session"):
        model_b = ui.model_picker("heads_model_b", default="gemma3-270m" if model == "smollm2-135m" else "toy-gpt2",
                                  label="Model B")
        if model_b is None or ui.get_model(model_b) is None:
            return
    wanted = (model, version, source, window, max_windows, model_b)
    if st.button("Compute", key="heads_corpus_go"):
        st.session_state["heads_corpus_for"] = hash(wanted)
    if st.session_state.get("heads_corpus_for") != hash(wanted):
        st.caption("Press Compute: every window is a forward pass (a few seconds each for a real model).")
        return
    table, summary = cache.corpus_of(model, version, source, window, max_windows)
    units = {"entropy": "nats", "mean_distance": "tokens"}.get(column, "share of attention")
    ui.plot(figs.stat_grid(table, column, title=f"{model}: {column}, mean over {summary}",
                                   colorbar_title=f"{column} ({units})"), width="stretch")
    st.write(f"A head's mean over the windows; `{column}_std` in the table is its spread from window to window (a "
             "steady role has a small spread).")
    st.dataframe(table, hide_index=True, width="stretch")
    if model_b is not None:
        _compare_models(model, loaded, model_b, table, column, units, source, window, max_windows)


def _compare_models(model, loaded, model_b, table, column, units, source, window, max_windows) -> None:
    """Model B beside model A: every head's mean as a distribution, each layer against relative depth, and head by
    head where the shapes match."""
    table_b, summary_b = cache.corpus_of(model_b, ui.model_version(model_b), source, window, max_windows)
    shape_b = ui.get_model(model_b).shape
    ui.chart(compare_figs.distributions({model: table[column], model_b: table_b[column]},
                                        title=f"{column} of every head: {model} against {model_b}",
                                        y_title=f"{column} ({units})"),
             "Each point is one head's mean over the windows (each model cuts the text with its own tokenizer); the "
             "box spans the middle half of the heads, the line in it is the median. Models of any shape compare "
             "here.")
    means_a, means_b = layer_means(table, column), layer_means(table_b, column)
    ui.chart(compare_figs.depth_curves({model: compare_figs.depth_curve(loaded.shape, means_a.index, means_a),
                                        model_b: compare_figs.depth_curve(shape_b, means_b.index, means_b)},
                                       title=f"{column}, mean over each layer's heads, against relative depth",
                                       y_title=f"{column} ({units})"),
             "Each point is one layer: 0 is the first layer and 1 the last, so models of different depths line up. "
             "Triangles mark local (sliding-window) layers, circles global ones, in a model that has both.")
    try:
        diff = compare_heads(table, table_b, column)
    except CorpusError:
        st.caption(f"Head by head only for models of one shape: {model} has {loaded.shape.layers} x "
                   f"{loaded.shape.heads} heads, {model_b} {shape_b.layers} x {shape_b.heads}.")
        return
    ui.plot(figs.stat_grid(diff, "difference", title=f"{column}: {model} − {model_b} (B: {summary_b})",
                                   colorbar_title=f"A − B ({units})"), width="stretch")
    st.write("Head by head, model A's mean minus model B's: a head that gained or lost a role between the two "
             "stands out.")


def _uploaded_text() -> str | None:
    """The uploaded .txt file's text (its first MAX_CORPUS_CHARS characters), or None with a message why not."""
    upload = st.file_uploader("A plain-text file (.txt, UTF-8)", type=["txt"], key="heads_corpus_file")
    if upload is None:
        st.info("Choose a .txt file: it is cut into windows of tokens.")
        return None
    try:
        source = upload.getvalue().decode("utf-8")
    except UnicodeDecodeError:
        st.error("The file is not UTF-8 text: save it as UTF-8 and upload it again.")
        return None
    if not source.strip():
        st.error("The file is empty.")
        return None
    if len(source) > MAX_CORPUS_CHARS:
        st.warning(f"The file has {len(source):,} characters: its first {MAX_CORPUS_CHARS:,} are used.")
        source = source[:MAX_CORPUS_CHARS]
    return source
