"""Caches and widgets of the Sinks page: the eviction experiment's per-token losses, the sink metric over a
sample of texts, and the massive-activation intervention, each computed once for every session."""

from __future__ import annotations

import hashlib

import streamlit as st

from attnviz.once import ComputeOnce


@st.cache_resource(show_spinner=False)
def loss_store() -> ComputeOnce:
    """Per-token losses already computed, shared by every session: (text hash, window, sinks, positions) -> losses.

    A ComputeOnce rather than st.cache_data because the computation reports progress to the page while it
    runs, and st.cache_data would record and replay those progress updates. Two sessions asking for the same
    setting at once compute it once: the second waits for the first one's result."""
    return ComputeOnce(max_items=64)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def cached_losses(loaded, text: str, window: int | None, n_sinks: int, positions: str, bar, label: str):
    """streaming_token_losses on `text`, computed once per (text, window, sinks, positions), with a progress bar."""
    from attnviz import streaming

    key = (_digest(text), window, n_sinks if window else 0, positions if window else "")

    def compute():
        ids = loaded.tokenizer(text)["input_ids"]
        return streaming.streaming_token_losses(loaded.model, ids, window=window, n_sinks=n_sinks,
                                                positions=positions,
                                                progress=lambda f: bar.progress(f, text=f"{label}: {f:.0%} of the layers"))

    def waiting(seconds: float) -> None:
        bar.progress(0.0, text=f"{label}: another visitor is computing this setting; waiting for it ({seconds:.0f} s)")

    return loss_store().get(key, compute, on_wait=waiting, poll_seconds=1.0)
