"""The Heads page's next view, built before it is asked for: once a head's One head map is drawn, the maps of the
heads beside it (the next and the previous head of its layer, then the same head in the layers either side) are
built in the background (ui.build_in_background) into the caches the page reads, so that stepping through the heads
finds each map made. On a long text a map costs most of a view change: the head's pooled overview computed from q
and k, or its dense map renormalised and encoded as an image."""

from __future__ import annotations

from attnviz import ui
from attnviz.ui import heads as cache
from attnviz.views import FULL_MAP_MAX_TOKENS


def neighbours(layers: list[int], n_heads: int, layer: int, head: int) -> list[tuple[int, int]]:
    """The (layer, head) pairs a visitor at (layer, head) is likely to ask for next, the likeliest first: the next
    and the previous head of the layer, then the same head in the next and the previous captured layer."""
    i = layers.index(layer)
    pairs = [(layer, head + 1), (layer, head - 1)]
    pairs += [(layers[i + 1], head)] if i + 1 < len(layers) else []
    pairs += [(layers[i - 1], head)] if i > 0 else []
    return [(x, h) for x, h in pairs if 0 <= h < n_heads]


def prefetch_maps(key: tuple, layer: int, head: int, gamma: float, hide_sink: bool, capture) -> bool:
    """Builds the One head maps of (layer, head)'s neighbours with the page's settings in a background thread:
    the pooled overview where the page draws one (a long text, or the q and k store), else the dense map. key:
    the page's (model, version, text, layers). False when the background builders are busy (nothing started)."""
    pooled = capture.pattern is None or capture.n_tokens > FULL_MAP_MAX_TOKENS
    build = cache.overview_figure if pooled else cache.head_figure
    calls = [(*key, x, h, gamma, hide_sink, capture)
             for x, h in neighbours(list(capture.layers), capture.n_heads, layer, head)]
    return ui.build_in_background(build, calls, "heads-next")
