"""attnviz.lab.comparison: the attention variants' maps on one text, against each model's own output_attentions and
against attnviz.attention's computation from the q and k of the saved model."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz import lab

TINY = lab.LabConfig(steps=3, d_model=32, n_heads=2, segment_len=4, n_letters=6, eval_every=3)


@pytest.fixture()
def trained(lab_cache) -> lab.VariantComparison:
    """The four variants of a tiny config, three steps each, saved as they end."""
    comparison = lab.VariantComparison(TINY, auto_save=True)
    comparison.run()
    return comparison


def test_maps_are_each_variants_own_output_attentions_on_one_text(trained, attention_of):
    text = trained.map_text()
    assert text == "dcbadcba"  # the induction example over 6 letters, segment of 4: "dcba" twice
    tokens, maps = trained.patterns(text)
    assert tokens == ["<bos>", *text] and set(maps) == set(lab.VARIANTS)
    for name, run in trained.runs.items():
        want = attention_of(run.model, [lab.BOS_ID] + [ord(c) for c in text])  # [layer, head, query, key]
        assert maps[name].shape == want.shape == (TINY.n_layers, TINY.n_heads, 9, 9)
        np.testing.assert_allclose(maps[name], want, rtol=0, atol=1e-6)
    assert np.abs(maps["softmax"] - maps["off_by_one"]).max() > 0.05  # four models, not one drawn four times


def test_maps_and_the_share_on_tokens_match_attnviz_attention_from_q_and_k(trained):
    """The saved variants, loaded as every page loads them, captured in the long-text store: there each map is
    computed by attnviz.attention from the recorded q, k and sink logits, not by the model's eager softmax."""
    from attnviz.capture import capture_attention
    from attnviz.models import load_model

    text = trained.map_text()
    _, maps = trained.patterns(text)
    for name, run in trained.runs.items():
        capture = capture_attention(load_model(f"lab/{run.snapshot().saved_as}", device="cpu"), text, store="qk")
        for layer in range(TINY.n_layers):
            for head in range(TINY.n_heads):
                np.testing.assert_allclose(maps[name][layer, head], capture.head_pattern(layer, head),
                                           rtol=0, atol=1e-5)
        share = lab.weight_on_tokens(maps[name])  # [layer, head]
        if name in ("softmax", "gated"):
            np.testing.assert_allclose(share, 1.0, atol=1e-6)
        else:  # the rest of each row went to the sink logit
            np.testing.assert_allclose(share, 1.0 - capture.learned_sink.mean(-1), atol=1e-5)
            assert share.max() < 0.99


def test_maps_wait_until_the_variants_have_trained():
    comparison = lab.VariantComparison(TINY)
    with pytest.raises(RuntimeError, match="still training"):
        comparison.patterns(comparison.map_text())


def test_the_text_task_draws_its_maps_on_as_many_tokens_as_a_training_row():
    comparison = lab.VariantComparison(lab.LabConfig(task="text", text_len=16, d_model=32))
    assert comparison.map_text() == "Four score and "  # 15 bytes after <bos>: a 16-token row
