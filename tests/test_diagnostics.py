"""attnviz.diagnostics: the repeated-random-tokens induction test, against a hand-written loop over the model's own
attention weights (transformers' output_attentions), and the loss on each copy against transformers' loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnviz.capture import CaptureError
from attnviz.diagnostics import (MAX_LENGTH, SCORES, capture_token_ids, induction_test, repeated_random_tokens,
                                 repeated_token_scores, special_tokens)
from attnviz.models import load_model


@pytest.fixture(scope="module")
def llama():
    return load_model("toy-llama-gqa")


def _own_attention(loaded, ids) -> np.ndarray:
    with torch.no_grad():
        out = loaded.model(input_ids=torch.tensor([ids]), output_attentions=True)
    return torch.stack([a[0] for a in out.attentions]).double().numpy()  # [layer, head, n, n]


def test_the_sequence_is_a_random_block_repeated_once_after_the_start_token(llama):
    ids, start = repeated_random_tokens(llama.tokenizer, llama.shape.vocab, 30, seed=1)
    assert start == 1 and ids[0] == llama.tokenizer("").input_ids[0] and len(ids) == 61
    first, second = ids[1:31], ids[31:61]
    assert first == second and len(set(first)) == 30 and 256 not in first  # distinct, no special token
    assert repeated_random_tokens(llama.tokenizer, llama.shape.vocab, 30, seed=1)[0] == ids
    assert repeated_random_tokens(llama.tokenizer, llama.shape.vocab, 30, seed=2)[0] != ids
    with pytest.raises(CaptureError, match="length must lie"):
        repeated_random_tokens(llama.tokenizer, llama.shape.vocab, MAX_LENGTH + 1)
    minilm_prefix, minilm_suffix = special_tokens(load_model("minilm-l6").tokenizer)
    assert (minilm_prefix, minilm_suffix) == ([101], [102])  # [CLS] ... [SEP]


def test_scores_equal_a_hand_written_loop_over_the_models_own_weights(llama):
    length = 25
    test = induction_test(llama, length, seed=3)
    ids = test.capture.token_ids
    p = _own_attention(llama, ids)
    np.testing.assert_allclose(test.capture.pattern, p, atol=1e-6)  # the capture ran on exactly these ids
    for row in test.scores.itertuples():
        prefix = dup = prev = 0.0
        for q in range(len(ids)):
            if q < test.start + length:
                continue  # the first copy (and the start token)
            earlier = [j for j in range(q) if ids[j] == ids[q]]
            assert len(earlier) == 1
            prefix += p[row.layer, row.head, q, earlier[0] + 1]
            dup += p[row.layer, row.head, q, earlier[0]]
            prev += p[row.layer, row.head, q, q - 1]
        assert row.prefix_matching == pytest.approx(prefix / length, abs=1e-6)
        assert row.duplicate_token == pytest.approx(dup / length, abs=1e-6)
        assert row.previous_token == pytest.approx(prev / length, abs=1e-6)


def test_the_layouts_targets_are_the_repeated_tokens_targets():
    """repeat_targets by hand (<bos> a b a b: queries 3 and 4 look at 2 and 3), and on a prefix + r + r of distinct
    tokens the targets stats.induction_targets finds by matching tokens, so prefix_matching is the statistic
    pattern_stats reports (its induction column) on such a sequence."""
    from attnviz.diagnostics import repeat_targets
    from attnviz.stats import induction_targets, pattern_stats

    assert repeat_targets(2, 1) == [[], [], [], [2], [3]]
    assert repeat_targets(1, 0) == [[], [1]] and induction_targets([7, 7]) == [[], []]  # L = 1: the query itself
    rng = np.random.default_rng(0)
    for length, start in ((2, 0), (5, 1), (7, 2)):
        r = (100 + rng.permutation(50)[:length]).tolist()
        ids = list(range(start)) + r + r
        assert repeat_targets(length, start) == induction_targets(ids)
        p = rng.random((3, len(ids), len(ids)))
        p /= p.sum(-1, keepdims=True)
        np.testing.assert_allclose(repeated_token_scores(p, length, start)["prefix_matching"],
                                   pattern_stats(p, induction_targets(ids))["induction"], rtol=1e-12)


def test_a_perfect_induction_head_scores_1_and_the_loss_per_copy_is_transformers_loss(llama):
    length, start = 6, 1
    n = start + 2 * length
    p = np.zeros((n, n))
    for q in range(n):
        p[q, q - length + 1 if q >= start + length else q] = 1.0  # second copy: the token after the earlier copy
    scores = repeated_token_scores(p, length, start)
    assert scores["prefix_matching"] == 1.0 and scores["duplicate_token"] == 0.0
    assert scores["previous_token"] == 0.0
    previous = np.eye(n, k=-1)
    previous[0, 0] = 1.0
    assert repeated_token_scores(previous, length, start)["previous_token"] == 1.0
    assert repeated_token_scores(previous, length, start)["prefix_matching"] == 0.0
    test = induction_test(llama, 20, seed=0)
    ids = torch.tensor([test.capture.token_ids])
    with torch.no_grad():
        logits = llama.model(input_ids=ids).logits[0].double()
    nll = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:], reduction="none").numpy()
    assert test.loss_first == pytest.approx(nll[1:20].mean(), abs=1e-5)  # tokens 2 .. 20 of the first copy
    assert test.loss_second == pytest.approx(nll[21:40].mean(), abs=1e-5)


def test_an_encoder_gets_scores_but_no_loss():
    test = induction_test(load_model("minilm-l6"), 10)
    assert test.loss_first is None and len(test.scores) == 6 * 12
    assert test.capture.tokens[0] == "[CLS]" and test.capture.tokens[-1] == "[SEP]"


def test_capture_token_ids_refuses_nothing_to_capture(llama):
    with pytest.raises(CaptureError, match="No tokens"):
        capture_token_ids(llama, [])


def test_a_longer_l_draws_the_same_block_and_more(llama):
    """A seed's block of L tokens is the start of its block of any longer L, which is what lets tests of every L
    share one first copy."""
    short, start = repeated_random_tokens(llama.tokenizer, llama.shape.vocab, 12, seed=4)
    long, _ = repeated_random_tokens(llama.tokenizer, llama.shape.vocab, 40, seed=4)
    assert short[start:start + 12] == long[start:start + 12] and len(set(long[start:start + 40])) == 40


def test_a_test_from_the_first_copies_runs_only_its_second_copy_and_equals_one_pass(llama, monkeypatch):
    """reuse_test from FirstCopies at least L long runs the L tokens of the second copy alone, on the kept keys and
    values; its weights are transformers' own over the whole sequence, and its scores and losses the one-pass
    test's. A longer L runs the whole sequence once and keeps its first copy."""
    from attnviz import diagnostics
    from attnviz.diagnostics import first_copies, reuse_test, reuses_first_copies

    ran, real = [], diagnostics._continued
    monkeypatch.setattr(diagnostics, "_continued",
                        lambda loaded, kv, past, chunk: ran.append((past, len(chunk))) or real(loaded, kv, past, chunk))
    assert reuses_first_copies(llama)
    first = first_copies(llama, 30, seed=5)
    assert ran == [(0, 31)] and first.length == 30 and first.pattern.shape[-1] == 31
    for length in (30, 7, 19, 1):
        ran.clear()
        test, kept = reuse_test(llama, length, seed=5, first=first)
        assert kept is first and ran == [(1 + length, length)]  # the second copy only
        np.testing.assert_allclose(test.capture.pattern, _own_attention(llama, test.capture.token_ids), atol=1e-6)
        whole = induction_test(llama, length, seed=5, one_pass=True)
        assert test.capture.token_ids == whole.capture.token_ids and test.capture.layers == whole.capture.layers
        np.testing.assert_allclose(test.scores[list(SCORES)], whole.scores[list(SCORES)], atol=1e-6)
        if length > 1:
            assert test.loss_first == pytest.approx(whole.loss_first, abs=1e-5)
            assert test.loss_second == pytest.approx(whole.loss_second, abs=1e-5)
        else:  # no token of a copy after its first
            assert test.loss_first is None is whole.loss_first
        lean, _ = reuse_test(llama, length, seed=5, first=first, logits=False)  # what the Heads page keeps
        assert lean.capture.logits is None and test.capture.logits.shape[0] == len(test.capture.token_ids)
        assert (lean.loss_first, lean.loss_second) == (test.loss_first, test.loss_second)
        np.testing.assert_array_equal(lean.capture.pattern, test.capture.pattern)
    test, kept = reuse_test(llama, 40, seed=5, first=first)
    assert ran[-1] == (0, 81) and kept.length == 40 and kept.ids == test.capture.token_ids[:41]
    np.testing.assert_array_equal(kept.pattern, test.capture.pattern[:, :, :41, :41])
    with pytest.raises(ValueError, match="seed 5"):
        reuse_test(llama, 5, seed=6, first=first)


def test_models_that_cannot_reuse_a_first_copy_run_the_test_in_one_pass():
    """An encoder (both directions: the first copy sees the second) and a family whose attention transformers' own
    interface does not record (BLOOM's ALiBi, by hooks) take the one-pass capture."""
    from attnviz.diagnostics import reuses_first_copies

    for name in ("minilm-l6", "toy-bloom-alibi"):
        loaded = load_model(name)
        assert not reuses_first_copies(loaded)
        test = induction_test(loaded, 6, seed=1)
        np.testing.assert_array_equal(test.capture.pattern, induction_test(loaded, 6, seed=1, one_pass=True)
                                      .capture.pattern)
