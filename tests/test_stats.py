"""attnviz.stats on hand-built patterns whose statistics are known by construction, and against a loop reference."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from attnviz.stats import COLUMNS, ROLES, head_stats, induction_targets, top_heads

N = 6


def causal_uniform(n: int) -> np.ndarray:
    return np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]


def shifted(n: int, offset: int) -> np.ndarray:
    """Row q puts all weight on key max(q - offset, 0)."""
    p = np.zeros((n, n))
    p[np.arange(n), np.maximum(np.arange(n) - offset, 0)] = 1.0
    return p


def sink(n: int) -> np.ndarray:
    p = np.zeros((n, n))
    p[:, 0] = 1.0
    return p


def make_capture(heads: list[np.ndarray], token_ids=None):
    pattern = np.stack(heads)[None].astype(np.float32)  # [1 layer, head, query, key]
    n = pattern.shape[-1]
    return SimpleNamespace(pattern=pattern, layers=[3], kv_head_of=list(range(len(heads))),
                           token_ids=list(range(n)) if token_ids is None else token_ids)


def test_known_heads():
    stats = head_stats(make_capture([shifted(N, 0), shifted(N, 1), sink(N), causal_uniform(N)]))
    assert list(stats.columns) == ["layer", "head", "kv_head", *COLUMNS]
    assert (stats.layer == 3).all() and list(stats["head"]) == [0, 1, 2, 3]
    diag, prev, snk, uni = (stats.iloc[i] for i in range(4))
    assert diag.self == 1 and diag.entropy == 0 and diag.mean_distance == 0 and diag.prev_token == 0
    assert prev.prev_token == 1 and prev.mean_distance == pytest.approx((N - 1) / N)  # row 0 looks at itself
    assert snk.sink_mass == 1 and snk.mean_distance == pytest.approx(np.mean(np.arange(N)))
    assert uni.entropy == pytest.approx(np.mean([math.log(q + 1) for q in range(N)]), rel=1e-6)
    assert uni.sink_mass == pytest.approx(np.mean([1 / (q + 1) for q in range(1, N)]), rel=1e-6)
    assert np.isnan(stats.induction).all()  # no token repeats


def test_induction_targets_by_hand():
    #           a  b  c  a  b  c  a
    ids = [1, 2, 3, 1, 2, 3, 1]
    assert induction_targets(ids) == [[], [], [], [1], [2], [3], [1, 4]]


def test_induction_head_scores_one_and_previous_token_head_does_not():
    ids = [7, 1, 2, 3, 1, 2, 3]  # "x a b c a b c": period 3
    n = len(ids)
    induction = np.zeros((n, n))
    for q in range(n):
        induction[q, q - 2 if q >= 4 else 0] = 1.0  # q looks at the token after the earlier copy of ids[q]
    stats = head_stats(make_capture([induction, shifted(n, 1)], token_ids=ids))
    assert stats.induction[0] == 1.0
    assert stats.induction[1] == 0.0


def test_against_loop_reference():
    rng = np.random.default_rng(0)
    n = 9
    logits = rng.normal(size=(3, n, n))
    logits[:, np.triu(np.ones((n, n), dtype=bool), 1)] = -np.inf
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ids = [5, 1, 2, 5, 1, 3, 5, 2, 1]
    stats = head_stats(make_capture(list(p), token_ids=ids))
    for h in range(3):
        ph = p[h].astype(np.float32).astype(np.float64)
        ent = sum(-sum(x * math.log(x) for x in row if x > 0) for row in ph) / n
        dist = sum(ph[q, k] * abs(q - k) for q in range(n) for k in range(n)) / n
        ind = []
        for q in range(n):
            targets = {j + 1 for j in range(q) if ids[j] == ids[q] and j + 1 < q}
            if targets:
                ind.append(sum(ph[q, t] for t in targets))
        row = stats.iloc[h]
        assert row.entropy == pytest.approx(ent, rel=1e-9)
        assert row.mean_distance == pytest.approx(dist, rel=1e-9)
        assert row.sink_mass == pytest.approx(np.mean(ph[1:, 0]), rel=1e-9)
        assert row.prev_token == pytest.approx(np.mean([ph[q, q - 1] for q in range(1, n)]), rel=1e-9)
        assert row.self == pytest.approx(np.mean(np.diag(ph)), rel=1e-9)
        assert row.induction == pytest.approx(np.mean(ind), rel=1e-9)


def test_top_heads_ranks_by_role():
    stats = head_stats(make_capture([shifted(N, 0), shifted(N, 1), sink(N), causal_uniform(N)]))
    assert top_heads(stats, "Previous token", k=1)["head"].tolist() == [1]
    assert top_heads(stats, "Sink", k=1)["head"].tolist() == [2]
    assert top_heads(stats, "Self", k=1)["head"].tolist() == [0]
    assert top_heads(stats, "Broad", k=1)["head"].tolist() == [3]
    assert top_heads(stats, "Induction").empty  # NaN never ranks
    assert set(ROLES) >= {"Sink", "Previous token", "Induction"}
