"""The Heads page's next view, built before it is asked for: once a head's One head map is drawn, the maps of the
heads beside it (the next and the previous head of its layer) are built in the background (ui.build_in_background)
into the caches the page reads, so that stepping through the heads finds each map made. On a long text a map costs
most of a view change: the head's pooled overview computed from q and k, or its dense map renormalised and encoded
as an image. Two maps at most: what is built in the background takes the cores from every visitor's next view
changes (building the same head of the layers either side too kept a 2-core machine busy into them)."""

from __future__ import annotations

from attnviz import ui
from attnviz.ui import heads as cache
from attnviz.views import FULL_MAP_MAX_TOKENS


def neighbours(n_heads: int, layer: int, head: int) -> list[tuple[int, int]]:
    """The (layer, head) pairs a visitor at (layer, head) is likely to ask for next, the likeliest first: the next
    and the previous head of the layer (the Head box's neighbours)."""
    return [(layer, h) for h in (head + 1, head - 1) if 0 <= h < n_heads]


def prefetch_maps(key: tuple, layer: int, head: int, gamma: float, hide_sink: bool, capture) -> bool:
    """Builds the One head maps of (layer, head)'s neighbours with the page's settings in a background thread:
    the pooled overview where the page draws one (a long text, or the q and k store), else the dense map. key:
    the page's (model, version, text, layers). False when the background builders are busy (nothing started)."""
    pooled = capture.pattern is None or capture.n_tokens > FULL_MAP_MAX_TOKENS
    build = cache.overview_figure if pooled else cache.head_figure
    calls = [(*key, x, h, gamma, hide_sink, capture)
             for x, h in neighbours(capture.n_heads, layer, head)]
    return ui.build_in_background(build, calls, "attnviz-heads-next")
