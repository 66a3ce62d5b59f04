"""What a Heads rerun no longer pays, and what keeps its view steady (attnviz.ui): figures kept once for every
session and handed out as they are (ui.figure_cache), equal to a fresh build and unchanged by drawing; a text's
token count counted once (ui.loaded.token_count); the axes' mark that keeps a zoom (ui.same_axes); the page's
style and script (ui.steady_reruns). The browser side is tests/test_browser_steady.py."""

from __future__ import annotations

import json

import numpy as np
import plotly.io

from tests.test_heads_page import heads_page
from tests.test_one_draw import as_sent

TEXT = "A rerun keeps its figures. A rerun keeps its figures."


def _drawn(fig) -> dict:
    """A figure as Streamlit sends it (plotly's JSON), without its axes mark."""
    out = json.loads(plotly.io.to_json(fig, validate=False))
    out["layout"].pop("uirevision", None)
    return out


def test_the_one_head_map_is_kept_once_drawn_as_kept_and_equal_to_a_fresh_build(monkeypatch):
    from attnviz import ui, views
    from attnviz.capture import capture_attention
    from attnviz.figures import heads as figs
    from attnviz.models import load_model
    from attnviz.ui import heads as cache
    from attnviz.ui.steady import STEADY_CSS

    at = heads_page({"model": "toy-gpt2", "text": TEXT, "layer": "1", "head": "2", "boost": "0", "sink": "1",
                     "tab": "head"})
    sent = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert sent["layout"]["title"]["text"].startswith("Layer 1, head 2")
    bodies = [h.proto.body for h in at.get("html")]
    assert STEADY_CSS in bodies and any("<script>" in b and "__attnvizZoom" in b for b in bodies)

    capture = capture_attention(load_model("toy-gpt2"), TEXT)  # made here: the cache key names the page's
    p = capture.pattern[capture.index_of(1), 2]
    fresh = figs.head_detail(views.sink_hidden(p), capture.tokens, gamma=1.0, causal=capture.causal,
                             title=sent["layout"]["title"]["text"])
    built = []
    monkeypatch.setattr(figs, "head_detail", lambda *a, **k: built.append(1))  # a cache miss would call it
    key = ("toy-gpt2", ui.model_version("toy-gpt2"), TEXT, None, 1, 2, 1.0, True, capture)
    kept_fig, kept = cache.head_figure(*key)
    assert built == [] and cache.head_figure(*key)[0] is kept_fig  # the page's figure, one object, not a copy
    assert _drawn(kept_fig) == _drawn(fresh)  # drawing it changed nothing: still the fresh build
    assert as_sent(kept_fig) == sent  # what the page sent is what is kept
    np.testing.assert_array_equal(kept, views.mass_off_sink(p))
    assert not kept.flags.writeable  # shared with every session: read-only


def test_maps_over_the_same_tokens_share_their_axes_mark_and_other_texts_do_not():
    from attnviz import ui
    from attnviz.capture import capture_attention
    from attnviz.models import load_model
    from attnviz.ui import heads as cache

    loaded, version = load_model("toy-gpt2"), ui.model_version("toy-gpt2")
    other = TEXT.replace("figures", "zoom")
    a, b = capture_attention(loaded, TEXT), capture_attention(loaded, other)

    def mark(text, capture, layer, head, gamma, hide):
        fig, _ = cache.head_figure("toy-gpt2", version, text, None, layer, head, gamma, hide, capture)
        return fig.layout.uirevision

    same = {mark(TEXT, a, layer, head, gamma, hide) for layer, head, gamma, hide in
            [(0, 0, 1.0, False), (1, 2, 1.0, False), (0, 3, 0.5, False), (1, 1, 0.5, True)]}
    assert len(same) == 1 and isinstance(next(iter(same)), str)  # layer, head, boost, sink: the same axes
    assert mark(other, b, 0, 0, 1.0, False) not in same  # another text: other tokens on the axes
    grid = cache.grid_of("toy-gpt2", version, TEXT, None, False, 0.5, 48, a).layout.uirevision
    assert grid not in same and grid == cache.grid_of("toy-gpt2", version, TEXT, None, True, 0.5, 48,
                                                      a).layout.uirevision


def test_a_texts_token_count_is_counted_once_and_is_the_tokenizers():
    from types import SimpleNamespace

    from attnviz.models import load_model
    from attnviz.ui.loaded import token_count

    tokenizer = load_model("toy-gpt2").tokenizer
    calls = []

    def counting(text, **kwargs):
        calls.append(text)
        return tokenizer(text, **kwargs)

    loaded = SimpleNamespace(tokenizer=counting)
    text = f"{TEXT} {np.random.default_rng().integers(1 << 30)}"  # a text no other test counted
    n = token_count("toy-gpt2", text, loaded)
    assert n == len(tokenizer(text)["input_ids"]) and n > 10
    assert token_count("toy-gpt2", text, loaded) == n and calls == [text]  # the second rerun does not tokenize


def test_the_heads_beside_the_one_drawn_are_made_ahead(monkeypatch):
    import threading

    from attnviz import ui
    from attnviz.capture import capture_attention
    from attnviz.figures import heads as figs
    from attnviz.models import load_model
    from attnviz.ui import heads as cache
    from attnviz.ui.heads_next import neighbours

    assert neighbours(4, 1, 0) == [(1, 1)] and neighbours(4, 5, 3) == [(5, 2)]  # no head -1, no head 4
    text = TEXT.replace("keeps", "makes")
    heads_page({"model": "toy-gpt2", "text": text, "layer": "1", "head": "2", "boost": "1", "sink": "0",
                "tab": "head"})
    for thread in threading.enumerate():
        if thread.name == "attnviz-heads-next":
            thread.join(60)
    capture = capture_attention(load_model("toy-gpt2"), text)
    built = []
    real = figs.head_detail
    monkeypatch.setattr(figs, "head_detail", lambda *a, **k: built.append(1) or real(*a, **k))
    key = ("toy-gpt2", ui.model_version("toy-gpt2"), text, None)
    for layer, head in [(1, 3), (1, 1)]:  # toy-gpt2: layers 0 and 1, heads 0-3
        cache.head_figure(*key, layer, head, 0.5, False, capture)
    assert built == [], "a head beside the one drawn was not made ahead"
    cache.head_figure(*key, 0, 2, 0.5, False, capture)  # the same head in another layer: made now
    assert built == [1]
