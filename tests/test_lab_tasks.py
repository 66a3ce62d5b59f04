"""attnviz.lab.tasks: task data against the rules that define each task, scores against hand-built
patterns and attnviz.stats, target patterns."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnviz import lab
from attnviz.diagnostics import repeated_token_scores
from attnviz.stats import previous_token_score, sink_mass

LETTERS = {ord(c) for c in lab.ALPHABET}


@pytest.mark.parametrize("task", lab.LETTER_TASKS)
def test_batches_are_letters_after_bos_and_reproducible(task):
    ids, mask = lab.make_batch(task, 64, 8, torch.Generator().manual_seed(3))
    again, mask_again = lab.make_batch(task, 64, 8, torch.Generator().manual_seed(3))
    other, _ = lab.make_batch(task, 64, 8, torch.Generator().manual_seed(4))
    assert ids.shape == mask.shape == (64, 18)
    assert torch.equal(ids, again) and torch.equal(mask, mask_again) and not torch.equal(ids, other)
    assert (ids[:, 0] == 256).all()
    allowed = LETTERS | ({ord("=")} if task != "induction" else set())
    assert set(ids[:, 1:].unique().tolist()) <= allowed
    assert not mask[:, 0].any() and mask.any(dim=1).all()
    few, _ = lab.make_batch(task, 64, 5, torch.Generator().manual_seed(3), n_letters=6)
    assert set(few[:, 1:].unique().tolist()) <= {ord(c) for c in "abcdef="}


def test_induction_answers_follow_the_induction_rule():
    """Each scored token is what the induction rule predicts: find the previous token's earlier occurrence (unique,
    since the letters seen so far are distinct) and copy the token after it. Unscored tokens in the second copy's
    first position are not predictable from what precedes them."""
    ids, mask = lab.make_batch("induction", 200, 10, torch.Generator().manual_seed(0))
    lengths = set()
    for row, m in zip(ids.tolist(), mask.tolist()):
        scored = [j for j in range(len(row)) if m[j]]
        assert scored == list(range(scored[0], scored[-1] + 1))
        l = len(scored) + 1                              # the first letter of the copy is not scored
        lengths.add(l)
        assert row[1:l + 1] == row[l + 1:2 * l + 1]      # the segment, then its copy
        assert len(set(row[1:l + 1])) == l               # distinct letters
        for j in scored:
            earlier = [p for p in range(1, j - 1) if row[p] == row[j - 1]]
            assert len(earlier) == 1 and row[earlier[0] + 1] == row[j]
    assert lengths == set(range(3, 11))                  # l uniform in [3, L]: no fixed offset


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_copy_and_reverse_answers(task):
    L = 7
    ids, mask = lab.make_batch(task, 50, L, torch.Generator().manual_seed(1))
    for row, m in zip(ids.tolist(), mask.tolist()):
        src, sep, out = row[1:L + 1], row[L + 1], row[L + 2:]
        assert sep == ord("=")
        assert out == (src if task == "copy" else src[::-1])
        assert m == [False] * (L + 2) + [True] * L


def test_probe_rows_repeat_a_segment_of_varying_length():
    probe = lab.make_probe(9, batch_size=10)
    lengths = lab.probe_lengths(9, 10)
    assert probe.shape == (10, 19) and (probe[:, 0] == 256).all()
    assert set(lengths) == {5, 6, 7, 8, 9}
    for row, l in zip(probe.tolist(), lengths):
        assert row[1:l + 1] == row[l + 1:2 * l + 1] and len(set(row[1:l + 1])) == l
    assert torch.equal(probe, lab.make_probe(9, batch_size=10))


# ---------------------------------------------------------------- scores


def _induction(pattern, L: int):
    """The lab's induction score of a probe row (the repeat from position 1, after <bos>)."""
    return repeated_token_scores(pattern, L, start=1)["prefix_matching"]


def _loop_scores(a: np.ndarray, L: int):
    """The three definitions, one query at a time."""
    n = a.shape[0]
    prev = sum(a[i, i - 1] for i in range(1, n)) / (n - 1)
    ind = sum(a[i, i - L + 1] for i in range(L + 1, 2 * L + 1)) / L
    sink = sum(a[i, 0] for i in range(1, n)) / (n - 1)
    return prev, ind, sink


def test_scores_match_their_definitions_on_ideal_and_random_patterns():
    L = 6
    n = 2 * L + 1
    previous = np.zeros((n, n))
    previous[0, 0] = 1
    previous[np.arange(1, n), np.arange(n - 1)] = 1
    induction = np.zeros((n, n))
    induction[:L + 1, 0] = 1
    induction[np.arange(L + 1, n), np.arange(L + 1, n) - L + 1] = 1
    sink = np.zeros((n, n))
    sink[:, 0] = 1
    rng = np.random.default_rng(0)
    random = np.tril(rng.random((n, n)))
    random /= random.sum(-1, keepdims=True)
    for a in (previous, induction, sink, random):
        got = (previous_token_score(a), _induction(a, L), sink_mass(a))
        np.testing.assert_allclose(got, _loop_scores(a, L), rtol=0, atol=1e-12)
    assert previous_token_score(previous) == 1.0 and _induction(induction, L) == 1.0
    assert sink_mass(sink) == 1.0 and _induction(previous, L) == 0.0
    stacked = np.stack([previous, induction, sink])[None]          # [layer, head, query, key]
    np.testing.assert_allclose(_induction(stacked, L), [[0.0, 1.0, 0.0]])
    with pytest.raises(ValueError):
        _induction(previous, L + 1)


def test_the_induction_score_agrees_with_head_stats_on_the_probe():
    """attnviz.stats finds induction targets by matching tokens; on each probe row cut after its second copy that
    is exactly the key i-l+1 of the second-copy queries, which the lab's score takes from the layout."""
    from attnviz.stats import induction_targets, pattern_stats

    model = lab.build_model(lab.LabConfig(d_model=32, n_letters=26))
    probe = lab.make_probe(6, batch_size=4)
    with torch.no_grad():
        attentions = model(input_ids=probe, output_attentions=True).attentions
    for b, l in enumerate(lab.probe_lengths(6, 4)):
        n = 2 * l + 1
        p = attentions[1][b, :, :n, :n].double().numpy()                 # [head, query, key]
        theirs = pattern_stats(p, induction_targets(probe[b, :n].tolist()))
        np.testing.assert_allclose(_induction(p, l), theirs["induction"], rtol=1e-12)


@pytest.mark.parametrize("task", lab.LETTER_TASKS)
@pytest.mark.parametrize("n_letters", [3, 8, 26])
def test_example_text_follows_the_task(task, n_letters):
    text = lab.example_text(lab.LabConfig(task=task, n_letters=n_letters, segment_len=3))
    if task == "induction":
        half = text[:len(text) // 2]
        assert text == half + half
    else:
        src, out = text.split("=")
        assert out == (src if task == "copy" else src[::-1])
        half = src
    assert len(set(half)) == len(half) == 3 and set(half) <= set(lab.ALPHABET[:n_letters])


def test_chance_is_log_of_the_number_of_letters():
    assert lab.chance_loss() == pytest.approx(math.log(26)) and lab.chance_loss(8) == pytest.approx(math.log(8))


def test_target_patterns_score_perfectly_on_a_repeat():
    text = "dafchdafch"
    tokens, targets = lab.target_patterns(text)
    assert tokens[0] == "<bos>" and tokens[1:] == list(text)
    for p in targets.values():
        np.testing.assert_allclose(p.sum(axis=1), 1.0)
        assert np.all(np.triu(p, k=1) == 0), "a causal target never looks ahead"
    assert previous_token_score(targets["previous-token"]) == pytest.approx(1.0)
    assert _induction(targets["induction"], 5) == pytest.approx(1.0)
    # Hand-derived: the second 'a' (query 7) copies from the key after the first 'a', position 3.
    assert targets["induction"][7, 3] == 1.0
    # First-copy queries have nothing earlier to copy and rest on <bos>.
    assert np.all(targets["induction"][1:6, 0] == 1.0)


def test_head_scores_agree_with_a_manual_attention_computation():
    """GPT-2's attention recomputed from its weights in float64 (softmax(q k^T / sqrt(d)) with a causal mask) gives
    the same scores as head_scores reads from output_attentions."""
    cfg = lab.LabConfig(positional="learned", n_layers=1, n_heads=2, d_model=16)
    model = lab.build_model(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype) * 0.3)
    probe = lab.make_probe(4, batch_size=3)
    got = lab.head_scores(model, probe, 4)
    t = model.transformer
    with torch.no_grad():
        x = t.wte(probe) + t.wpe(torch.arange(probe.shape[1]))
        qkv = t.h[0].attn.c_attn(t.h[0].ln_1(x))                            # [batch, n, 3 d]
        q, k, _ = qkv.split(16, dim=-1)
        q = q.view(3, -1, 2, 8).transpose(1, 2)                              # [batch, head, n, d_head]
        k = k.view(3, -1, 2, 8).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(8)
        n = probe.shape[1]
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        pattern = scores.softmax(-1).numpy()                                 # [batch, head, query, key]
    lengths = lab.probe_lengths(4, 3)
    for name, index in (("previous_token", 0), ("induction", 1), ("sink", 2)):
        want = [[np.mean([_loop_scores(pattern[b, h], lengths[b])[index] for b in range(3)]) for h in range(2)]]
        np.testing.assert_allclose(got[name], want, rtol=1e-9, atol=1e-12)


def test_text_task_rows_are_bytes_of_the_shipped_text():
    from attnviz.lab.tasks import TEXT_FILE

    data = TEXT_FILE.read_bytes()
    ids, mask = lab.make_batch("text", 8, 8, torch.Generator().manual_seed(0), text_len=32)
    assert ids.shape == mask.shape == (8, 32)
    assert (ids[:, 0] == lab.BOS_ID).all() and not mask[:, 0].any() and mask[:, 1:].all()
    for row in ids:
        assert bytes(row[1:].tolist()) in data
    probe = lab.text_probe(32, batch_size=4)
    assert probe.shape == (4, 32) and (probe[:, 0] == lab.BOS_ID).all()
    assert bytes(probe[0, 1:].tolist()) == data[:31] and bytes(probe[-1, 1:].tolist()) == data[-31:]
    assert lab.chance_loss(8, "text") == pytest.approx(math.log(256))
    assert lab.LabConfig(task="text", text_len=48).seq_len == 48
