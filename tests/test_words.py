"""AttentionCapture.by_words and span_attention (attnviz.capture.words): the word rule on hand-chosen texts whose
words are known, and the merged maps against Clark et al.'s merge computed by hand in float64 from transformers' own
output_attentions (keys summed, queries averaged)."""

from __future__ import annotations

import numpy as np
import pytest

import attnviz
from attnviz.capture import CaptureError, capture_attention
from attnviz.capture.words import merged_layer, token_words, word_spans, words_from_tokens
from attnviz.models import load_model
from attnviz.stats import COLUMNS, head_stats
from tests.families import build_family

TEXT = "The cat's mat. Unaffable"
# the byte tokenizer: <bos>, then one token per byte; whitespace joins the word after it
WORDS = ["<bos>", "The", "␣cat", "'", "s", "␣mat", ".", "␣Unaffable"]
SPANS = [(0, 1), (1, 4), (4, 8), (8, 9), (9, 10), (10, 14), (14, 15), (15, 25)]


def clark_merge(weights: np.ndarray, spans) -> np.ndarray:
    """[..., query, key] -> [..., word, word] float64, one pair of words at a time: for each query word, the mean over
    its tokens of the sum of their weights on the key word's tokens."""
    weights = np.asarray(weights, dtype=np.float64)
    out = np.zeros((*weights.shape[:-2], len(spans), len(spans)))
    for v, (a, b) in enumerate(spans):
        for w, (c, d) in enumerate(spans):
            out[..., v, w] = weights[..., a:b, c:d].sum(-1).mean(-1)
    return out


@pytest.fixture(scope="module")
def gpt2():
    return load_model("toy-gpt2")


@pytest.fixture(scope="module")
def gpt2_caps(gpt2):
    return {store: capture_attention(gpt2, TEXT, store=store) for store in ("pattern", "qk")}


# -- the word rule --

def test_word_rule_on_offsets():
    # GPT-2's BPE: offsets without the leading space; "'s" covers two units, so it is one word of its own
    text = "The cat's mat."
    assert token_words(text, [(0, 3), (3, 7), (7, 9), (9, 13), (13, 14)], [False] * 5) == [0, 1, 2, 3, 4]
    # BERT: [CLS] una ##ff ##able cat [SEP] "[SEP]" typed in the text is a special token too
    text = "unaffable cat [SEP] ok"
    offsets = [(0, 0), (0, 3), (3, 5), (5, 9), (10, 13), (14, 19), (20, 22), (0, 0)]
    special = [True, False, False, False, False, True, False, True]
    assert token_words(text, offsets, special) == [0, 1, 1, 1, 2, 3, 4, 5]
    # SentencePiece: a lone "▁" before a special token and at the end is a word of its own; "\n\n" joins "OK";
    # the two byte pieces of "é" share its character
    text = "café\n\nOK <bos> end "
    offsets = [(0, 0), (0, 3), (3, 4), (3, 4), (4, 6), (6, 8), (8, 9), (9, 14), (14, 18), (18, 19)]
    special = [True, False, False, False, False, False, False, True, False, False]
    assert token_words(text, offsets, special) == [0, 1, 1, 1, 2, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("tokens, words", [
    (["<bos>", "The", "␣", "c", "a", "t", "'", "s", "."], [0, 1, 2, 2, 2, 2, 3, 4, 5]),  # readable byte tokens
    (["The", "Ġcat", "'s", "Ġmat", ".", "<|endoftext|>"], [0, 1, 2, 3, 4, 5]),  # GPT-2's vocabulary strings
    (["<s>", "▁The", "▁un", "aff", "able", "▁cat", "</s>"], [0, 1, 2, 2, 2, 3, 4]),  # SentencePiece's
    (["[CLS]", "the", "una", "##ff", "##able", "cat", "'", "s", "[SEP]"], [0, 1, 2, 2, 2, 3, 4, 5, 6]),  # WordPiece
    (["caf", "<0xC3>", "<0xA9>", "␣ok"], [0, 0, 0, 1]),  # a character's byte pieces stay in their word
])
def test_word_rule_from_tokens(tokens, words):
    assert words_from_tokens(tokens) == words


def test_words_given_as_word_ids(gpt2_caps):
    cap = gpt2_caps["pattern"]
    # transformers' word_ids(): None for a special token, consecutive equal numbers for one word
    ids = [None] + [0] * 14 + [1] * 10
    merged = cap.by_words(words=ids)
    assert merged.word_spans == [(0, 1), (1, 15), (15, 25)]
    assert merged.tokens == ["<bos>", "The␣cat's␣mat.", "␣Unaffable"]
    with pytest.raises(CaptureError, match="not consecutive"):
        word_spans([0, 0, 1, 0])
    with pytest.raises(CaptureError, match="one per token"):
        cap.by_words(words=[0, 1])


# -- the merge against output_attentions --

def test_words_of_a_capture(gpt2_caps):
    for cap in gpt2_caps.values():
        merged = cap.by_words()
        assert merged.tokens == WORDS and merged.word_spans == SPANS
        assert merged.n_tokens == len(WORDS) and merged.store == "pattern"
        assert len(set(merged.token_ids)) == len(WORDS)  # no two words the same


@pytest.mark.parametrize("store", ["pattern", "qk"])
def test_merged_pattern_equals_clark_merge_of_output_attentions(gpt2, gpt2_caps, attention_of, store):
    merged = gpt2_caps[store].by_words()
    expected = clark_merge(attention_of(gpt2.model, gpt2_caps[store].token_ids), SPANS)
    assert merged.pattern.dtype == np.float32 and merged.pattern.shape == expected.shape
    assert np.allclose(merged.pattern, expected, atol=1e-6)
    rows = merged.pattern.astype(np.float64).sum(-1)
    assert np.allclose(rows, 1.0, atol=1e-6)  # every word's row still sums to 1
    assert merged.causal and np.all(np.triu(merged.pattern, 1) == 0)  # causal across words


def test_merge_in_blocks_of_any_size():
    """Blocks of query rows that cut words anywhere add up to the same map as one block."""
    weights = np.random.default_rng(0).dirichlet(np.ones(11), size=(3, 11))  # [head, query, key], rows sum to 1
    spans = [(0, 1), (1, 4), (4, 5), (5, 9), (9, 11)]
    expected = clark_merge(weights, spans)
    for block in (1, 2, 3, 7, 11, 64):
        assert np.allclose(merged_layer(lambda a, b: weights[:, a:b], 11, spans, block), expected, atol=1e-12)


def test_bidirectional_encoder(tmp_path, attention_of):
    """A tiny BERT (every query sees every key): the merge is the same rule; rows sum to 1."""
    loaded = load_model(str(build_family("bert", tmp_path)))
    cap = attnviz.capture(loaded, TEXT)
    merged = cap.by_words()
    assert not merged.causal and merged.tokens == WORDS
    expected = clark_merge(attention_of(loaded.model, cap.token_ids), SPANS)
    assert np.allclose(merged.pattern, expected, atol=1e-6)
    assert np.allclose(merged.pattern.astype(np.float64).sum(-1), 1.0, atol=1e-6)
    assert (np.triu(merged.pattern, 1) > 0).any()


def test_learned_sink_is_averaged_over_each_word(tmp_path):
    """gpt-oss: each token's row plus its sink weight sums to 1, so each word's row plus the mean of its tokens' sink
    weights does too."""
    loaded = load_model(str(build_family("gpt_oss", tmp_path)))
    cap = attnviz.capture(loaded, TEXT)
    merged = cap.by_words()
    sink = cap.learned_sink.astype(np.float64)
    expected = np.stack([sink[..., a:b].mean(-1) for a, b in merged.word_spans], axis=-1)
    assert np.allclose(merged.learned_sink, expected, atol=1e-6)
    assert np.allclose(merged.pattern.astype(np.float64).sum(-1) + merged.learned_sink, 1.0, atol=1e-6)
    assert np.allclose(head_stats(merged)["learned_sink"], expected.mean(-1).reshape(-1), atol=1e-6)


@pytest.mark.slow
def test_minilm_wordpieces(minilm, attention_of):
    """A real BERT: WordPiece's ## pieces join their word, punctuation and [CLS] / [SEP] stay words."""
    text = "The unaffable cat sat."
    cap = attnviz.capture(minilm, text)
    merged = cap.by_words()
    assert merged.tokens == ["[CLS]", "the", "unaffable", "cat", "sat", ".", "[SEP]"]
    assert words_from_tokens(cap.tokens) == cap.token_words  # the fallback reads the same words from the tokens
    expected = clark_merge(attention_of(minilm.model, cap.token_ids), merged.word_spans)
    assert np.allclose(merged.pattern, expected, atol=1e-6)
    assert np.allclose(merged.pattern.astype(np.float64).sum(-1), 1.0, atol=1e-6)


# -- span attention --

@pytest.mark.parametrize("store", ["pattern", "qk"])
def test_span_attention_equals_numpy_over_rows(gpt2, gpt2_caps, attention_of, store):
    cap = gpt2_caps[store]
    weights = attention_of(gpt2.model, cap.token_ids)  # [layer, head, query, key] float64
    for queries, rows in [((4, 8), [4, 5, 6, 7]), ({9, 2, 15}, [2, 9, 15]), (slice(-3, None), [22, 23, 24]),
                          (6, [6]), ([3, 3, 4], [3, 4])]:
        got = cap.span_attention(1, 2, queries)
        assert got.dtype == np.float64 and got.shape == (cap.n_tokens,)
        assert np.allclose(got, weights[1, 2, rows].sum(0), atol=1e-6)
        assert np.isclose(got.sum(), len(rows), atol=1e-5)
        assert np.allclose(cap.span_attention(1, 2, queries, how="mean"), weights[1, 2, rows].mean(0), atol=1e-6)


def test_span_attention_over_words(gpt2_caps):
    merged = gpt2_caps["pattern"].by_words()
    pattern = merged.pattern.astype(np.float64)
    assert np.allclose(merged.span_attention(0, 1, (1, 3)), pattern[0, 1, 1:3].sum(0), atol=1e-12)
    assert np.allclose(merged.span_attention(0, 1, [2, 5, 7], how="mean"), pattern[0, 1, [2, 5, 7]].mean(0), atol=1e-12)
    assert np.isclose(merged.span_attention(0, 1, [2, 5, 7], how="mean").sum(), 1.0, atol=1e-6)


def test_span_attention_refusals(gpt2_caps):
    cap = gpt2_caps["pattern"]
    for queries in [(5, 5), (0, 99), [], [-1], [0.5]]:
        with pytest.raises(CaptureError):
            cap.span_attention(0, 0, queries)
    with pytest.raises(CaptureError, match="how"):
        cap.span_attention(0, 0, (0, 2), how="max")


# -- the views take a merged capture --

def test_views_and_files_take_a_merged_capture(gpt2_caps, tmp_path):
    merged = gpt2_caps["qk"].by_words()
    frame = head_stats(merged)
    assert len(frame) == merged.n_layers * merged.n_heads
    # induction needs a repeated word, and TEXT repeats none
    assert frame[[c for c in COLUMNS if c != "induction"]].notna().all().all() and frame["induction"].isna().all()
    assert merged.select([1]).by_words().tokens == WORDS  # a merged capture is its own words
    html = merged.text_view(layer=1, head=0).to_html(tmp_path / "words.html").read_text(encoding="utf-8")
    assert "Unaffable" in html
    merged.save(tmp_path / "words.npz")
    back = attnviz.load_capture(tmp_path / "words.npz")
    assert back.tokens == WORDS and np.array_equal(back.pattern, merged.pattern)
