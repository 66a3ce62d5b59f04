"""Implicit maps of linear mixers a block of rows at a time, and their statistics streamed over those blocks: the
blocks equal the dense map's rows (and the float64 definition), and the streamed statistics equal the dense ones
(attnviz.mixers.stats.map_stats on the float64 reference map) on tiny random models' texts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnviz.mixers.delta import delta_rule_map, delta_rule_map_naive, delta_rule_rows
from attnviz.mixers.record import mixer_records
from attnviz.mixers.records import DeltaRuleRecord, SsdRecord
from attnviz.mixers.ssd import ssd_map, ssd_map_naive, ssd_rows
from attnviz.mixers.stats import linear_stats, map_stats, record_stats, streamed_map_stats
from tests import mixer_models

KEYS = ("prev_token", "induction", "distance_profile", "half_mass_distance")


def _delta_inputs(n=37, k_heads=2, v_heads=4, dk=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(n, k_heads, dk, generator=gen), torch.randn(n, k_heads, dk, generator=gen)
    return q, k, -2 * torch.rand(n, v_heads, generator=gen), torch.rand(n, v_heads, generator=gen)


def _ssd_inputs(n=37, heads=4, groups=2, state=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    dt, A = torch.randn(n, heads, generator=gen), -torch.rand(heads, generator=gen) * 3
    B, C = torch.randn(n, groups, state, generator=gen), torch.randn(n, groups, state, generator=gen)
    return (dt, A, B, C), dict(dt_bias=torch.randn(heads, generator=gen), dt_softplus=True, dt_limit=(0.0, 4.0))


def _same(rows, dense):
    """Equal to float32 rounding: the same products, though BLAS may sum them in another order for another output
    layout (a block's own buffer against the N x N array)."""
    assert (rows - dense).abs().max() <= 1e-6 * dense.abs().max()


def _covered(blocks, n):
    """The blocks' (a, b) cover rows 0 .. n - 1 in order, each once."""
    spans = [(a, b) for a, b, _ in blocks]
    assert spans[0][0] == 0 and spans[-1][1] == n and all(x[1] == y[0] for x, y in zip(spans, spans[1:]))


def test_delta_rows_are_the_dense_maps_rows():
    q, k, g, beta = _delta_inputs()
    naive = delta_rule_map_naive(q, k, g, beta)
    for chunk in (1, 5, 8, 64):
        dense = delta_rule_map(q, k, g, beta, chunk=chunk)
        blocks = [(a, b, rows.clone()) for a, b, rows in delta_rule_rows(q, k, g, beta, chunk=chunk)]
        _covered(blocks, 37)
        for a, b, rows in blocks:
            _same(rows, dense[:, a:b, :b])
            assert torch.all(dense[:, a:b, b:] == 0)
        for a, b, rows in delta_rule_rows(q, k, g, beta, chunk=chunk, dtype=torch.float64):  # and the definition
            assert torch.allclose(rows, naive[:, a:b, :b], rtol=0, atol=1e-12)


def test_ssd_rows_are_the_dense_maps_rows():
    args, options = _ssd_inputs()
    naive = ssd_map_naive(*args, **options)
    for block in (1, 6, 16, 40):
        dense = ssd_map(*args, **options)
        blocks = [(a, b, rows.clone()) for a, b, rows in ssd_rows(*args, block=block, **options)]
        _covered(blocks, 37)
        for a, b, rows in blocks:
            _same(rows, dense[:, a:b, :b])
        for a, b, rows in ssd_rows(*args, block=block, dtype=torch.float64, **options):
            assert torch.allclose(rows, naive[:, a:b, :b], rtol=1e-12, atol=1e-14)


def test_dense_maps_write_into_a_given_array():
    q, k, g, beta = _delta_inputs(n=20)
    out = torch.full((4, 20, 20), float("nan"))
    assert delta_rule_map(q, k, g, beta, chunk=8, out=out) is out
    assert torch.equal(out, delta_rule_map(q, k, g, beta, chunk=8))  # every entry written, the upper triangle 0
    args, options = _ssd_inputs(n=20)
    out.fill_(float("nan"))
    assert torch.equal(ssd_map(*args, out=out, **options), ssd_map(*args, **options))
    with pytest.raises(ValueError):
        delta_rule_map(q, k, g, beta, out=torch.empty(4, 20, 19))


def _text(n=50, seed=3):
    """[1, n] ids: a random stretch, then it again, so that induction targets exist (and a few tokens repeat)."""
    half = torch.randint(0, 256, (n - n // 2,), generator=torch.Generator().manual_seed(seed))
    return torch.cat([half, half[:n // 2]])[None]


def _assert_stats_equal(got, want, rtol):
    for key in KEYS:
        assert np.asarray(got[key]).shape == np.asarray(want[key]).shape, key
        np.testing.assert_allclose(got[key], want[key], rtol=rtol, atol=rtol * 1e-3, err_msg=key)


def _reference(record):
    """The float64 definition's map of a record (the naive loops of attnviz.mixers.delta and .ssd)."""
    if record.kind == "gated delta rule":
        return delta_rule_map_naive(record.query, record.key, record.g, record.beta, l2norm=record.l2norm)
    return ssd_map_naive(record.dt, record.A, record.B, record.C, dt_bias=record.dt_bias,
                         dt_softplus=record.dt_softplus, dt_limit=record.dt_limit)


def _check_streamed(record, tokens):
    want = map_stats(_reference(record).numpy(), tokens)  # dense, on the float64 definition
    assert np.isfinite(want["induction"]).all()
    for block in (3, 16, 50):
        _assert_stats_equal(record_stats(record, tokens, block=block, dtype=torch.float64), want, 1e-10)
        _assert_stats_equal(record_stats(record, tokens, block=block), want, 2e-5)  # float32 rows
    return want


@pytest.mark.parametrize("name", ["qwen3_next", "mamba2", "falcon_h1"])
def test_streamed_stats_of_recorded_layers_equal_the_dense_maps(name):
    ids = _text()
    records = mixer_records(mixer_models.build(name), ids)
    assert records
    _check_streamed(records[min(records)], ids[0].tolist())  # one layer: every layer is test_stats_of_every_...


def test_streamed_stats_of_slowly_decaying_maps():
    # the tiny random models' delta rule heads forget within a token or two; these heads, with g near 0 and small
    # dt, spread their weight far back, so that every statistic is far from 0
    tokens = _text()[0].tolist()
    q, k, g, beta = _delta_inputs(n=50)
    delta = DeltaRuleRecord(0, q, k, None, g * 0.02, beta, True, None)
    (dt, A, B, C), options = _ssd_inputs(n=50)
    ssd = SsdRecord(1, None, dt - 3, A * 0.1, B, C, None, output=None, **options)
    for record in (delta, ssd):
        want = _check_streamed(record, tokens)
        assert (want["half_mass_distance"] >= 3).all() and (want["induction"] > 0.01).all()


def test_stats_of_every_linear_layer():
    ids = _text(40)
    records = mixer_records(mixer_models.build("qwen3_next"), ids)
    got = linear_stats(records, ids[0].tolist(), block=8)
    assert sorted(got) == [0, 1, 2]
    for layer, stats in got.items():
        dense = map_stats(records[layer].implicit_map(dtype=torch.float64).numpy(), ids[0].tolist())
        _assert_stats_equal(stats, dense, 2e-5)


def test_streamed_stats_of_a_known_map():
    # a hand-made map, streamed a few rows at a time: all weight (negative) on the previous token except row 0,
    # whose only key is itself; the text repeats, so each query of the second copy has one induction target
    n, tokens = 12, [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10]
    w = torch.zeros(2, n, n, dtype=torch.float64)
    w[:, 0, 0] = 2.0
    w[:, torch.arange(1, n), torch.arange(n - 1)] = -3.0
    w[1, 6:, :] = 0
    w[1, torch.arange(6, n), torch.arange(1, 7)] = 0.5  # head 1: the second copy's rows on their targets
    w[1, torch.arange(6, n), torch.arange(6, n)] = -0.5

    def rows_of(into):
        for a in range(0, n, 5):
            b = min(n, a + 5)
            rows = into(a, b)[:, :, :b]
            rows[:] = w[:, a:b, :b]
            yield a, b, rows

    got = streamed_map_stats(rows_of, 2, n, tokens, block=5, dtype=torch.float64)
    assert got["prev_token"][0] == 1.0 and got["half_mass_distance"][0] == 1
    assert got["induction"][1] == 0.5 and got["induction"][0] == 0.0
    assert got["distance_profile"][0, 0] == 1 / n  # only row 0 puts weight at distance 0
    assert got["distance_profile"][1, 5] == 0.5 * 6 / (n - 5)  # six rows put half their weight 5 back


def test_rows_of_some_heads_are_those_heads_rows():
    # the per-core groups (record_stats, the dense maps) compute a slice of the heads each: the same rows
    q, k, g, beta = _delta_inputs(n=21)
    full = delta_rule_map(q, k, g, beta, chunk=8, dtype=torch.float64)
    for part in (slice(1, 3), slice(3, 4), slice(0, 4)):
        for a, b, rows in delta_rule_rows(q, k, g, beta, chunk=8, dtype=torch.float64, heads=part):
            assert torch.allclose(rows, full[part, a:b, :b], rtol=0, atol=1e-14)
    args, options = _ssd_inputs(n=21)
    full = ssd_map(*args, dtype=torch.float64, **options)
    for part in (slice(1, 3), slice(2, 4)):  # across the two groups' B and C, and within one
        for a, b, rows in ssd_rows(*args, block=5, dtype=torch.float64, heads=part, **options):
            assert torch.allclose(rows, full[part, a:b, :b], rtol=1e-13, atol=1e-15)
