"""attnviz.figures.text: the text-centred view is the text itself, escaped, with each token's shade proportional to
its value."""

from __future__ import annotations

import re

import numpy as np
import pytest

from attnviz.figures.text import shade_levels, shaded_text


def _alphas(html: str) -> list[float | None]:
    """Each span's background alpha, None where it has no background."""
    out = []
    for attributes in re.findall(r"<span([^>]*)>", html):
        m = re.search(r"background:rgba\(\d+,\d+,\d+,([0-9.]+)\)", attributes)
        out.append(float(m.group(1)) if m else None)
    return out


def test_each_token_is_shaded_by_its_weight_over_the_largest():
    tokens = ["<bos>", "The", "␣cat", "↵", "sat"]
    w = np.array([0.5, 0.1, 0.25, 0.15, 0.0])
    html = shaded_text(tokens, w, selected=2)
    assert _alphas(html)[:4] == pytest.approx([1.0, 0.2, 0.5, 0.3], abs=1e-3)
    assert _alphas(html)[4] is None  # weight 0: no shade at all
    assert ">␣cat<" not in html and "> cat<" in html and "↵<br>" in html  # whitespace shown as the text's own
    assert 'title="2: ␣cat — weight 0.2500"' in html and "outline" in html.split("2: ␣cat")[1].split(">")[0]
    np.testing.assert_allclose(shade_levels(np.array([1.0, np.nan, 3.0])), [1 / 3, np.nan, 1.0])


def test_the_users_text_never_becomes_markup_and_later_keys_are_marked_unseen():
    tokens = ["<script>", "a&b", '"q"', "x", "<i>"]
    html = shaded_text(tokens, np.array([0.5, 0.5, 0.0, np.nan, 0.1]), visible=2)
    assert "<script>" not in html and "&lt;script&gt;" in html and "a&amp;b" in html and "<i>" not in html
    # the keys after the query: one faint span, unshaded, that still holds their text
    assert html.count("<span") == 3 and _alphas(html) == pytest.approx([1.0, 1.0, None])
    assert '<span class="unseen" title="tokens 2–4: not visible to the query">&quot;q&quot;x&lt;i&gt;</span>' in html
    assert "not visible" not in shaded_text(tokens, np.zeros(5))
    assert 'title="3: x — weight: none"' in shaded_text(tokens, np.array([0.5, 0.5, 0.0, np.nan, 0.1]))
    with pytest.raises(ValueError, match="one entry per token"):
        shaded_text(tokens, np.zeros(3))


def test_a_thousand_tokens_stay_text_not_an_image():
    n = 1_200
    html = shaded_text([f"t{i}" for i in range(n)], np.full(n, 1.0 / n))
    assert html.count("<span") == n and "data:image" not in html
    assert len(html) / n < 200  # bytes per token: small enough to send on every query change
