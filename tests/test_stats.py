"""attnviz.stats on hand-built patterns whose statistics are known by construction, and against a loop reference."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from attnviz.stats import COLUMNS, ROLES, by_layer_kind, head_stats, induction_targets, top_heads

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


def _reference_stats(p: np.ndarray, ids) -> dict[str, np.ndarray]:
    """The module docstring's definitions, one head and one query row at a time, in float64 Python loops."""
    n_heads, n = p.shape[0], p.shape[-1]
    out = {c: np.zeros(n_heads) for c in COLUMNS}
    for h in range(n_heads):
        ph = p[h].astype(np.float64)
        out["entropy"][h] = math.fsum(-x * math.log(x) for row in ph for x in row if x > 0) / n
        out["sink_mass"][h] = math.fsum(ph[q, 0] for q in range(1, n)) / (n - 1)
        out["mean_distance"][h] = math.fsum(ph[q, k] * abs(q - k) for q in range(n) for k in range(n)) / n
        out["prev_token"][h] = math.fsum(ph[q, q - 1] for q in range(1, n)) / (n - 1)
        out["self"][h] = math.fsum(ph[q, q] for q in range(n)) / n
        ind = [math.fsum(ph[q, t] for t in {j + 1 for j in range(q) if ids[j] == ids[q] and j + 1 < q})
               for q in range(n) if any(ids[j] == ids[q] and j + 1 < q for j in range(q))]
        out["induction"][h] = math.fsum(ind) / len(ind) if ind else np.nan
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_vectorised_stats_equal_a_float64_loop_to_1e_12(causal, dtype):
    """Blocks of 4 query rows over 23 tokens: blocks that end mid-text, a last short block, and (bidirectional)
    weight after each block's last query, which the causal shortcut must not drop."""
    rng = np.random.default_rng(3)
    n, heads = 23, 3
    logits = rng.normal(scale=3.0, size=(2, heads, n, n))
    if causal:
        logits[..., np.triu(np.ones((n, n), dtype=bool), 1)] = -np.inf
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p = (p / p.sum(-1, keepdims=True)).astype(dtype)
    ids = list(rng.integers(0, 5, n))
    capture = SimpleNamespace(pattern=p, layers=[4, 7], kv_head_of=[0, 0, 1], token_ids=ids)
    for block in (4, 256):
        stats = head_stats(capture, block=block)
        assert stats["layer"].tolist() == [4] * heads + [7] * heads and stats["kv_head"].tolist() == [0, 0, 1] * 2
        for li in range(2):
            ref = _reference_stats(p[li], ids)
            rows = stats.iloc[li * heads:(li + 1) * heads]
            for column in COLUMNS:
                np.testing.assert_allclose(rows[column].to_numpy(), ref[column], rtol=1e-12, atol=1e-12,
                                           err_msg=f"{column}, block {block}")


def test_a_far_weight_after_the_block_counts():
    """A single weight far right of a causal-looking pattern (row 0 -> last key) is read, not skipped."""
    n = 12
    p = causal_uniform(n)
    p[0] = 0.0
    p[0, n - 1] = 1.0
    capture = make_capture([p])
    stats = head_stats(capture, block=4)
    ref = _reference_stats(capture.pattern[0], capture.token_ids)
    by_hand = (n - 1 + sum(math.fsum(abs(q - k) / (q + 1) for k in range(q + 1)) for q in range(1, n))) / n
    assert stats.mean_distance[0] == pytest.approx(ref["mean_distance"][0], rel=1e-12)
    assert stats.mean_distance[0] == pytest.approx(by_hand, rel=1e-6)  # the float32 pattern's rounding
    assert stats.entropy[0] == pytest.approx(ref["entropy"][0], rel=1e-12)


def test_head_stats_takes_every_head_of_a_layer_at_once(monkeypatch):
    """The cost was a Python loop over 270 heads: one pattern_stats call per layer now, with all its heads."""
    from attnviz import stats as module

    shapes = []
    real = module.pattern_stats

    def spy(p, *args, **kwargs):
        shapes.append(np.shape(p))
        return real(p, *args, **kwargs)

    monkeypatch.setattr(module, "pattern_stats", spy)
    pattern = np.stack([np.stack([causal_uniform(N)] * 4)] * 3)  # 3 layers x 4 heads
    capture = SimpleNamespace(pattern=pattern, layers=[0, 1, 2], kv_head_of=[0, 0, 1, 1], token_ids=list(range(N)))
    assert len(module.head_stats(capture)) == 12
    assert shapes == [(4, N, N)] * 3


def test_statistics_by_layer_kind_are_the_means_of_each_kinds_heads(tmp_path):
    """A Gemma 3 with a sliding and a full layer: each kind's row is the plain mean of its heads' statistics, the
    layers read from the config's layer_types."""
    from attnviz.capture import capture_attention
    from attnviz.models import load_model
    from tests.families import build_family

    loaded = load_model(str(build_family("gemma3_text", tmp_path)))
    stats = head_stats(capture_attention(loaded, "The cat sat on the mat and the dog sat on the mat too."))
    table = by_layer_kind(stats, loaded.shape).set_index("kind")
    types = loaded.model.config.layer_types
    for kind, layer_type in (("local", "sliding_attention"), ("global", "full_attention")):
        layers = [i for i, t in enumerate(types) if t == layer_type]
        rows = stats[stats["layer"].isin(layers)]
        assert table.loc[kind, "layers"] == len(layers) and table.loc[kind, "heads"] == len(rows)
        for column in COLUMNS:
            np.testing.assert_allclose(table.loc[kind, column], rows[column].mean())
    assert list(by_layer_kind(stats.assign(layer=0), SimpleNamespace(layer_kind=lambda _: "global"))["kind"]) == [
        "global"]
