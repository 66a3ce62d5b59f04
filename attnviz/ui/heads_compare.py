"""The Heads page's Compare tab: two maps (two heads, two layers' means, or one head on two texts), their
figures and their difference, each cached on what it shows (as attnviz.ui.heads caches the page's other views).
Maps up to FULL_MAP_MAX_TOKENS are drawn whole; longer ones are compared a block of rows at a time
(attnviz.compare), never holding a whole [n, n] map.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import streamlit as st

from attnviz import ui, views
from attnviz.figures import heads as figs
from attnviz.views import FULL_MAP_MAX_TOKENS, OVERVIEW


@dataclass(frozen=True)
class CompareMap:
    """One map of the Compare tab: head `head` of `layer` in `capture`, or the mean of the layer's heads (head
    None); key names it in the caches (what it is: layer, head, text), title is its chart's."""

    capture: object
    layer: int
    head: int | None
    key: tuple
    title: str

    @property
    def n(self) -> int:
        return self.capture.n_tokens

    @property
    def heads(self) -> int:
        """How many heads one of its rows is read from."""
        return 1 if self.head is not None else self.capture.n_heads

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Its weights for queries start .. stop - 1, [rows, key] float32: read from the dense pattern, or computed
        from the layer's q and k for these rows only."""
        if self.head is None:
            return self.capture.layer_rows(self.layer, start, stop).mean(0)
        return self.capture.head_pattern(self.layer, self.head, rows=(start, stop))


def compare_view(model: str, version: tuple, text: str, layers, a: CompareMap, b: CompareMap, gamma: float,
                 hide_sink: bool):
    """(figure A, figure B, A − B or None, views.map_difference or None) for Compare, or None after a message.
    Maps up to FULL_MAP_MAX_TOKENS are drawn whole; longer ones are compared a block of rows at a time
    (attnviz.compare: never a whole [n, n] map), admitted under the memory budget with compare.compare_bytes first,
    so a comparison that could never fit is refused with the numbers before anything runs."""
    from attnviz import budget, compare

    key = (model, version, text, layers)
    if max(a.n, b.n) <= FULL_MAP_MAX_TOKENS:
        return compare_figures(*key, a.key, b.key, gamma, hide_sink, a.rows(0, a.n), b.rows(0, b.n),
                               a.capture.tokens, b.capture.tokens, a.capture.causal, (a.title, b.title))
    need = compare.compare_bytes(a.n, b.n, heads_a=a.heads, heads_b=b.heads)
    waiting = st.empty()

    def on_poll(held=None, position=None):  # also touches the page while waiting, so Streamlit can stop the run
        waiting.info(f"Waiting for memory: other visitors' work holds {budget.BUDGET.held / 2**30:.1f} GiB of the "
                     f"{budget.BUDGET.limit / 2**30:.1f} GiB budget, and this comparison needs {need / 2**30:.2f} GiB. "
                     "It starts by itself as soon as it is free.")

    try:
        with budget.BUDGET.admit(need, on_wait=on_poll, on_poll=on_poll,
                                 what=f"Comparing two maps of {max(a.n, b.n):,} tokens"):
            waiting.empty()
            with st.spinner(f"Comparing the two maps a block of rows at a time ({max(a.n, b.n):,} rows)…"):
                result = compared(*key, a.key, b.key, hide_sink, a, b)
    except budget.OverBudget as exc:
        st.error(str(exc))
        return None
    return pooled_compare_figures(*key, a.key, b.key, gamma, hide_sink, result, a, b)


@st.cache_data(show_spinner=False, max_entries=8)
def compared(model: str, version: tuple, text: str, layers, a_key: tuple, b_key: tuple, hide_sink: bool, _a, _b):
    """attnviz.compare.compare_maps of the maps a and b named by a_key and b_key, pooled to OVERVIEW: cached apart
    from the figures, so the boost toggle redraws without a second pass over the rows."""
    from attnviz import compare

    return compare.compare_maps(_a.rows, _a.n, _b.rows, _b.n, OVERVIEW, hide_sink=hide_sink,
                                heads=(_a.heads, _b.heads))


def pooled_compare_figures(model: str, version: tuple, text: str, layers, a_key: tuple, b_key: tuple, gamma: float,
                           hide_sink: bool, _result, _a, _b):
    """The Compare figures of a comparison made block by block: each map max-pooled (as One head draws a long
    head; a map no longer than OVERVIEW is itself), and A − B pooled with its sign. Each figure is cached on what
    it shows alone, so a change of map B leaves map A's figure as it was (not built, nor sent again)."""
    key = (model, version, text, layers)
    fig_a = pooled_map_figure(*key, a_key, _a.title, gamma, hide_sink, _result.a, _a)
    fig_b = pooled_map_figure(*key, b_key, _b.title, gamma, hide_sink, _result.b, _b)
    if _result.diff is None:
        return fig_a, fig_b, None, None
    return fig_a, fig_b, pooled_difference_figure(*key, a_key, b_key, hide_sink, _a.n, _result), _result.summary


@ui.figure_cache(max_entries=16)
def pooled_map_figure(model: str, version: tuple, text: str, layers, map_key: tuple, title: str, gamma: float,
                      hide_sink: bool, _pooled, _map):
    """One Compare map's figure from its pooled weights (_map: the CompareMap named by map_key)."""
    if _map.n <= OVERVIEW:
        return figs.head_detail(_pooled, _map.capture.tokens, title=title, gamma=gamma, causal=_map.capture.causal)
    return figs.pooled_overview(_pooled, _map.n, gamma=gamma, causal=_map.capture.causal,
                                title=f"{title}, max-pooled to {_pooled.shape[-1]} px")


@ui.figure_cache(max_entries=8)
def pooled_difference_figure(model: str, version: tuple, text: str, layers, a_key: tuple, b_key: tuple,
                             hide_sink: bool, n: int, _result):
    """A − B of a block-by-block comparison of two maps of n tokens, pooled with its sign."""
    return figs.pooled_difference(_result.diff, n, _result.bound,
                                  title="A − B: red = more attention in A, blue = more in B")


@ui.figure_cache(max_entries=16)
def compare_figures(model: str, version: tuple, text: str, layers, a_key: tuple, b_key: tuple, gamma: float,
                    hide_sink: bool, _a, _b, _tokens_a, _tokens_b, causal: bool, titles: tuple[str, str]):
    """The two Compare maps of at most FULL_MAP_MAX_TOKENS tokens drawn whole, their difference and
    views.map_difference, for maps a and b named by a_key and b_key (what they are: layer, head, text), so a rerun
    that changes neither draws nothing again."""
    a = views.sink_hidden(_a) if hide_sink else _a
    b = views.sink_hidden(_b) if hide_sink else _b
    fig_a = figs.head_detail(a, _tokens_a, title=titles[0], gamma=gamma, causal=causal)
    fig_b = figs.head_detail(b, _tokens_b, title=titles[1], gamma=gamma, causal=causal)
    if a.shape != b.shape:
        return fig_a, fig_b, None, None
    diff = figs.difference(a, b, _tokens_a, title="A − B: red = more attention in A, blue = more in B")
    return fig_a, fig_b, diff, views.map_difference(a, b)


def two_heads(capture, layer: int, head: int, layer_b: int, head_b: int) -> tuple[CompareMap, CompareMap]:
    """The maps of "Two heads": head `head` of `layer` (A) and head_b of layer_b (B)."""
    return (CompareMap(capture, layer, head, ("head", layer, head), f"A: layer {layer}, head {head}"),
            CompareMap(capture, layer_b, head_b, ("head", layer_b, head_b), f"B: layer {layer_b}, head {head_b}"))


def two_layers(capture, layer: int, layer_b: int) -> tuple[CompareMap, CompareMap]:
    """The maps of "Two layers": the mean over heads of `layer` (A) and of layer_b (B)."""
    return (CompareMap(capture, layer, None, ("mean", layer), f"A: layer {layer}, mean of its heads"),
            CompareMap(capture, layer_b, None, ("mean", layer_b), f"B: layer {layer_b}, mean of its heads"))


def prefetch(key: tuple, pairs: list[tuple[CompareMap, CompareMap]], hide_sink: bool) -> None:
    """Compares, in the background (ui.build_in_background), pairs of maps a visitor is likely to ask for next (the
    page's Compare tab chooses them: the next Layer B, the next Head B, the other mode). Only maps compared block by
    block (longer than FULL_MAP_MAX_TOKENS: shorter ones are drawn whole at once), each admitted under the memory budget
    as compare_view admits it."""
    calls = [(*key, a.key, b.key, hide_sink, a, b) for a, b in pairs if max(a.n, b.n) > FULL_MAP_MAX_TOKENS]
    ui.build_in_background(_compared_in_budget, calls, "attnviz-compare-next")


def _compared_in_budget(model, version, text, layers, a_key, b_key, hide_sink, a, b):
    from attnviz import budget, compare

    with budget.BUDGET.admit(compare.compare_bytes(a.n, b.n, heads_a=a.heads, heads_b=b.heads),
                             what="A comparison built ahead"):
        return compared(model, version, text, layers, a_key, b_key, hide_sink, a, b)
