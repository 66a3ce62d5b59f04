"""The one attnviz module that imports streamlit: the page list, cached loaders and shared widgets."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st


@dataclass(frozen=True)
class PageInfo:
    script: str
    title: str
    icon: str
    url_path: str
    summary: str
    default: bool = False


PAGES: tuple[PageInfo, ...] = (
    PageInfo("pages/home.py", "Home", "🏠", "home", "What attnviz shows and where.", default=True),
    PageInfo("pages/heads.py", "Heads", "🧠", "heads",
             "Run a real or toy model on your text and explore every head's attention map and statistics."),
    PageInfo("pages/sinks.py", "Attention sinks", "🕳️", "sinks",
             "Where the first token soaks up attention, and what breaks when it is evicted from the cache."),
    PageInfo("pages/positional.py", "Positional encodings", "📐", "positional",
             "Sinusoidal, RoPE and ALiBi: distance decay in theory and measured in real heads."),
    PageInfo("pages/softmax.py", "Softmax saturation", "🌡️", "softmax",
             "Why attention divides by sqrt(d_k): saturation and vanishing gradients without it."),
    PageInfo("pages/variants.py", "MHA, GQA, MQA", "🧮", "variants",
             "How query heads share key/value heads, and what that saves in KV cache and FLOPs."),
    PageInfo("pages/worked_example.py", "Worked example", "✏️", "worked-example",
             "Every number of scaled dot-product attention on a small example you can edit."),
    PageInfo("pages/kernel.py", "Tiled kernel", "🧱", "kernel",
             "A FlashAttention-style Triton kernel, tile by tile, checked and timed against naive attention."),
    PageInfo("pages/toy_lab.py", "Toy lab", "🧪", "toy-lab",
             "Train a small transformer in the browser and watch previous-token and induction heads form."),
)


def placeholder(what_is_coming: str) -> None:
    """An honest notice for a page that is not built yet."""
    st.warning(f"🚧 This page is coming: it is not built yet. It will show {what_is_coming}")
