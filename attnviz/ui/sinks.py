"""Caches and widgets of the Sinks page: the eviction experiment's per-token losses, the sink metric over a
sample of texts, and the massive-activation intervention, each computed once for every session."""

from __future__ import annotations

import functools
import hashlib

import streamlit as st

from attnviz.once import ComputeOnce
from attnviz.ui import links

_LOSSES = ComputeOnce(max_items=64)  # the eviction experiment's per-token losses (text hash, window, sinks, positions)
_RESULTS = ComputeOnce(max_items=32)  # the sink scores and the metric's alphas, the massive-activation runs


URL_TEXT_LIMIT = 1500  # longer texts are not put in the link, as on the Heads page
LINK = links.Link("sinks_", {
    "model": links.Param("sinks_model", "model"),
    "text": links.Param("sinks_text", "text", "text"),
    "layer": links.Param("sinks_layer", "int", "layer"),
    "head": links.Param("sinks_head", "int", "head"),
    "sink": links.Param("sinks_hide", "choice", choices={"0": False, "1": True}),
})


def write_link(model: str | None) -> None:
    """The page's view into its URL: the model, the text while it fits a link, and the one-head view's layer, head
    and Hide the sinks once they are set."""
    view = {"model": model} if model else {}
    text = st.session_state.get("sinks_text")
    if text and len(text) <= URL_TEXT_LIMIT:
        view["text"] = text
    for name, key in (("layer", "sinks_layer"), ("head", "sinks_head")):
        if key in st.session_state:
            view[name] = int(st.session_state[key])
    if "sinks_hide" in st.session_state:
        view["sink"] = "1" if st.session_state["sinks_hide"] else "0"
    links.write(LINK, view)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def cached_losses(text: str, window: int | None, n_sinks: int, positions: str, compute, bar, label: str):
    """One setting's per-token losses of the eviction experiment (streaming.streaming_experiment's `cached`),
    computed once per (text, window, sinks, positions) for every session: compute(report) runs it, with a
    progress bar. Two sessions asking for the same setting at once compute it once: the second waits."""
    key = (_digest(text), window, n_sinks if window else 0, positions if window else "")

    def report(f: float) -> None:
        bar.progress(f, text=f"{label}: {f:.0%} of the layers")

    def waiting(seconds: float) -> None:
        bar.progress(0.0, text=f"{label}: another visitor is computing this setting; waiting for it ({seconds:.0f} s)")

    return _LOSSES.get(key, lambda: compute(report), on_wait=waiting, poll_seconds=1.0)


def alpha_over_texts(name: str, texts: tuple[str, ...]):
    """alpha_0 [text, layer, head] of `name` on each text (attnviz.sinks.alpha_over_texts), computed once per
    (model, model_version, texts) for every session, with a progress bar. None after an st.error."""
    from attnviz import budget, sinks, ui
    from attnviz.capture import CaptureError

    loaded = ui.get_model(name)
    if loaded is None:
        return None
    key = ("alpha0", name, ui.model_version(name), tuple(_digest(t) for t in texts))
    longest = max(len(loaded.tokenizer(t)["input_ids"]) for t in texts)
    need = ui.capture_need(loaded, longest, None, ui.capture_store(name, max(texts, key=len))[0])

    def compute(progress):
        with budget.BUDGET.admit(need, what=f"Capturing {len(texts)} texts"):
            return sinks.alpha_over_texts(loaded, texts, progress=progress)

    return ui.computed_once(_RESULTS, key, f"Capturing {len(texts)} texts through {name}", compute,
                            errors=(CaptureError, budget.OverBudget))


def layer_outputs(name: str, text: str):
    """(token ids [n], hidden [layer, token, dim]) of `text` through `name` (attnviz.massive.layer_outputs),
    computed once per (model, model_version, text), admitted by the memory budget (its eager forward pass holds
    one layer's [head, n, n] weights). None after a message."""
    from attnviz import budget, massive, ui

    loaded = ui.get_model(name)
    if loaded is None:
        return None
    key = ("hidden", name, ui.model_version(name), _digest(text))
    ids = loaded.tokenizer(text)["input_ids"]
    config = loaded.model.config
    need = budget.forward_bytes(config, len(ids)) + 4 * len(ids) * loaded.shape.d_model * loaded.shape.layers

    def compute():
        with budget.BUDGET.admit(need, what=f"Reading every layer's output on {len(ids):,} tokens"):
            return ids, massive.layer_outputs(loaded.model, ids)

    try:
        with st.spinner(f"Running {name} and keeping every layer's output…"):
            return _RESULTS.get(key, compute)
    except budget.OverBudget as exc:
        ui.show_error(exc)
        return None


def intervention(name: str, text: str, edit):
    """attnviz.massive.intervention of `edit` on `text`, computed once per (model, model_version, text, edit), in
    the store a capture of the text takes (ui.capture_store: the dense one while it fits, else q and k), admitted by
    the memory budget. None after a message."""
    from attnviz import budget, massive, ui
    from attnviz.capture import CaptureError
    from attnviz.lm import PredictionError

    loaded = ui.get_model(name)
    if loaded is None:
        return None
    store, _, n = ui.capture_store(name, text)
    key = ("intervention", name, ui.model_version(name), _digest(text), edit, store)
    need = ui.capture_need(loaded, n, None, store)

    def compute():
        with budget.BUDGET.admit(need, what=f"The intervention on {n:,} tokens"):
            return massive.intervention(loaded, text, edit, store=store)

    try:
        with st.spinner(f"Running {name} with and without the edit on {n:,} tokens (two forward passes for the "
                        "losses and two captures for the sink mass)…"):
            return _RESULTS.get(key, compute)
    except (CaptureError, PredictionError, budget.OverBudget) as exc:
        ui.show_error(exc)
        return None


REFERENCE_WINDOWS = 8   # texts the "mean" intervention averages over (Sun et al. average over many sequences)
REFERENCE_TOKENS = 64


def reference_outputs(name: str):
    """Every layer's output on REFERENCE_WINDOWS windows of the shipped text (REFERENCE_TOKENS tokens each): a list
    of [layer, token, dim] arrays, computed once per (model, model_version), with a progress bar."""
    from attnviz import massive, sinks, streaming, ui

    loaded = ui.get_model(name)
    if loaded is None:
        return None
    key = ("reference", name, ui.model_version(name))

    def compute(progress):
        texts = sinks.text_windows(streaming.shipped_text(), loaded.tokenizer, n_tokens=REFERENCE_TOKENS,
                                   n_windows=REFERENCE_WINDOWS)
        out = []
        for i, text in enumerate(texts):
            out.append(massive.layer_outputs(loaded.model, loaded.tokenizer(text)["input_ids"]))
            progress(i + 1, len(texts))
        return out

    return ui.computed_once(_RESULTS, key, f"Running {name} on windows of the shipped text for the means",
                            compute)


def sink_scores(name: str, text: str, capture):
    """attnviz.sinks.capture_sink_scores of this capture, computed once per (model, version, text, store, layers)
    for every session, with a progress bar while it runs (a long text in the long-text store takes a pass over
    every layer's q and k)."""
    from attnviz import sinks, ui

    key = ("alpha", name, ui.model_version(name), _digest(text), capture.store, tuple(capture.layers))
    return ui.computed_once(_RESULTS, key, "Averaging the attention each key receives, layer by layer",
                            lambda progress: sinks.capture_sink_scores(capture, progress=progress))


def shipped_tokens(name: str) -> int:
    """How many tokens model `name`'s tokenizer makes of the eviction experiment's shipped text (0 when the model
    cannot be loaded: its page has said why), counted once per model and version, not on every rerun."""
    from attnviz import streaming, ui

    loaded = ui.get_model(name)
    if loaded is None:
        return 0
    return _token_count(name, ui.model_version(name), loaded.tokenizer, streaming.shipped_text())


@functools.lru_cache(maxsize=16)
def _token_count(name: str, version: tuple, tokenizer, text: str) -> int:
    return len(tokenizer(text).input_ids)
