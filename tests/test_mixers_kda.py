"""attnviz.mixers.kda: Kimi Delta Attention's implicit map, whole and a block of rows at a time, checked against a
float64 step-by-step reading of its recurrence written here, against transformers' own KDA kernels, and on a tiny
random Kimi Linear model; its statistics streamed over row blocks against those of the whole map."""

from __future__ import annotations

import pytest
import torch

from attnviz.mixers.delta import apply_map, delta_rule_map
from attnviz.mixers.kda import kda_map
from attnviz.mixers.records import KdaRecord
from attnviz.mixers.record import mixer_records, record_mixers
from attnviz.mixers.records import MixerError, record_of
from tests import mixer_models

REL32 = 2e-5  # as tests/test_mixers.py: float32 rounding of sums over a few dozen tokens


def _close(got, want, rel=REL32):
    err = (got.double() - want.double()).abs().max().item()
    scale = want.double().abs().max().item()
    assert err <= rel * scale, (err, scale)


def recurrence(query, key, g, beta, *, l2norm=True):
    """w [head, query, key] in float64 by running the layer's state update token by token with one-hot values:
    with v_s = e_s, the state S_t [dk, N] holds in column s what key s contributes, and row t of w is q_t^T S_t.
    S_t = (I - beta_t k_t k_t^T) diag(e^(g_t)) S_(t-1) + beta_t k_t e_t^T (transformers'
    recurrent_kimi_delta_attention: decay first, then the delta correction)."""
    q, k, g, beta = (x.transpose(0, 1).double() for x in (query, key, g, beta))
    if l2norm:
        q, k = q / (q.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt(), k / (k.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    q = q / q.shape[-1] ** 0.5
    heads, n, dk = q.shape
    w = torch.zeros(heads, n, n, dtype=torch.float64)
    for h in range(heads):
        state = torch.zeros(dk, n, dtype=torch.float64)
        for t in range(n):
            state = g[h, t].exp()[:, None] * state
            state = state - beta[h, t] * torch.outer(k[h, t], k[h, t] @ state)
            state[:, t] += beta[h, t] * k[h, t]
            w[h, t] = q[h, t] @ state
    return w


def _inputs(n=23, heads=3, dk=8, dv=5, seed=0, strength=2.0):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(n, heads, dk, generator=gen), torch.randn(n, heads, dk, generator=gen)
    v = torch.randn(n, heads, dv, generator=gen)
    g = -strength * torch.rand(n, heads, dk, generator=gen)  # a log decay per key channel
    beta = torch.rand(n, heads, generator=gen)
    return q, k, v, g, beta


@pytest.mark.parametrize("chunk", [1, 4, 7, 64])
@pytest.mark.parametrize("l2norm", [True, False])
def test_kda_map_chunkwise_equals_recurrence(chunk, l2norm):
    q, k, _, g, beta = _inputs()
    want = recurrence(q, k, g, beta, l2norm=l2norm)
    got = kda_map(q, k, g, beta, l2norm=l2norm, chunk=chunk, dtype=torch.float64)
    assert torch.allclose(got, want, rtol=0, atol=1e-10)
    assert torch.all(got.triu(1) == 0)  # causal: no weight on later keys
    assert (want < 0).any()  # a signed map, not a probability


def test_kda_recurrence_equals_transformers_kernels():
    from transformers.models.kimi_linear.modeling_kimi_linear import (
        chunk_kimi_delta_attention,
        recurrent_kimi_delta_attention,
    )

    q, k, v, g, beta = _inputs(n=19)
    got = apply_map(recurrence(q, k, g, beta), v.double())
    step, _ = recurrent_kimi_delta_attention(q[None], k[None], v[None], g=g[None], beta=beta[None],
                                             initial_state=None, output_final_state=False,
                                             use_qk_l2norm_in_kernel=True)
    chunked, _ = chunk_kimi_delta_attention(q[None], k[None], v[None], g=g[None], beta=beta[None], chunk_size=8,
                                            use_qk_l2norm_in_kernel=True)
    _close(got, step[0], rel=1e-6)  # the kernels run in float32; the recurrence in float64
    _close(got, chunked[0], rel=1e-6)


def test_per_channel_decay_is_not_a_scalar_decay():
    # one decay per head (the gated delta rule of Qwen3-Next), even the channels' mean, misses KDA's output
    q, k, v, g, beta = _inputs(n=19)
    want = apply_map(kda_map(q, k, g, beta, dtype=torch.float64), v.double())
    scalar = apply_map(delta_rule_map(q, k, g.mean(-1), beta, dtype=torch.float64), v.double())
    assert (scalar - want).abs().max() > 0.05 * want.abs().max()


@pytest.mark.parametrize("chunk", [16, 64])  # 64: pairs across the chunk's blocks of 16 too
def test_kda_map_with_strong_decay_keeps_its_digits(chunk):
    # channels that forget within a few tokens: far weights fall under 1e-18 and are set to 0 rather than carried
    # on as subnormal floats; every other weight is the recurrence's
    q, k, _, g, beta = _inputs(n=90, strength=20.0)
    want = recurrence(q, k, g, beta)
    got = kda_map(q, k, g, beta, chunk=chunk)
    _close(got, want)
    assert (got[:, 80:, :10] == 0).all()


def test_kda_records_rebuild_the_kernel_output():
    model = mixer_models.build("kimi_linear")
    ids = mixer_models.text_ids(70)  # two chunks of the kernel's 64
    records = mixer_records(model, ids)
    assert sorted(records) == [0]  # layer 1 is MLA softmax attention
    record = records[0]
    assert isinstance(record, KdaRecord) and record.l2norm and record.kind == "gated delta rule"
    heads, dk = model.config.linear_num_heads, model.config.linear_head_dim
    assert record.g.shape == (70, heads, dk)  # a decay per key channel
    assert record.g.std(-1).max() > 0  # and the channels' decays differ
    for options in ({}, {"chunk": 16}):
        w = record.implicit_map(**options)
        assert w.shape == (heads, 70, 70)
        _close(record.mixed(w), record.output)
    exact = record.implicit_map(dtype=torch.float64)
    _close(record.mixed(exact), record.output)
    want = recurrence(record.query, record.key, record.g, record.beta)
    assert torch.allclose(exact, want, rtol=0, atol=1e-10)


def test_kda_layer_gets_its_map_not_a_skip():
    from attnviz.mixers.maps import implicit_maps

    found = implicit_maps(mixer_models.build("kimi_linear"), mixer_models.text_ids(20))
    assert sorted(found.maps) == [0] and found.skipped == {} and found.message() == ""
    assert found.kinds == ("gated delta rule", "softmax")
    _close(found.records[0].mixed(found.maps[0]), found.records[0].output)


def test_kda_recording_leaves_the_model_unchanged():
    import transformers.models.kimi_linear.modeling_kimi_linear as source

    model = mixer_models.build("kimi_linear")
    ids = mixer_models.text_ids(20)
    with torch.no_grad():
        before = model(ids, use_cache=False).logits
        with record_mixers(model) as records:
            during = model(ids, use_cache=False).logits
    assert sorted(records) == [0]
    assert torch.equal(before, during)
    assert not hasattr(source.chunk_kimi_delta_attention, "attnviz_original")


def test_kda_call_from_a_carried_state_is_not_recorded():
    model = mixer_models.build("kimi_linear")
    ids = mixer_models.text_ids(10)
    with record_mixers(model) as records, torch.no_grad():
        first = model(ids[:, :6], use_cache=True)
        assert sorted(records) == [0]
        model(ids[:, 6:], past_key_values=first.past_key_values, use_cache=True)  # starts from the carried state
    assert records == {}
    with pytest.raises(MixerError):
        record_of("chunk_kimi_delta_attention", 0, {"initial_state": torch.zeros(1)}, torch.zeros(1))


def _blocks(rows_of):
    """The blocks (a, b, rows) a row-block function yields, copied (its buffer is reused), checked to cover the
    rows 0 .. n - 1 in order, each once, and put together as the [head, N, N] map they make (0 past each block's
    last key b - 1)."""
    blocks = [(a, b, rows.clone()) for a, b, rows in rows_of]
    assert blocks[0][0] == 0 and all(x[1] == y[0] for x, y in zip(blocks, blocks[1:]))
    heads, n = blocks[-1][2].shape[0], blocks[-1][1]
    w = torch.full((heads, n, n), float("nan"), dtype=blocks[0][2].dtype)
    for a, b, rows in blocks:
        assert rows.shape == (heads, b - a, b)
        w[:, a:b, :b], w[:, a:b, b:] = rows, 0
    return w


@pytest.mark.parametrize("l2norm", [True, False])
def test_kda_rows_make_the_full_map_and_the_recurrence(l2norm):
    from attnviz.mixers.kda import kda_rows

    q, k, _, g, beta = _inputs(n=37)
    want = recurrence(q, k, g, beta, l2norm=l2norm)
    for chunk in (1, 5, 8, 64):  # 64: one block longer than the text
        dense = kda_map(q, k, g, beta, l2norm=l2norm, chunk=chunk)
        got = _blocks(kda_rows(q, k, g, beta, l2norm=l2norm, chunk=chunk))
        assert (got - dense).abs().max() <= 1e-6 * dense.abs().max()  # the same products, float32 rounding
        exact = _blocks(kda_rows(q, k, g, beta, l2norm=l2norm, chunk=chunk, dtype=torch.float64))
        assert torch.allclose(exact, want, rtol=0, atol=1e-10)
        for part in (slice(1, 3), slice(2, 3)):  # some heads: those heads' rows
            some = _blocks(kda_rows(q, k, g, beta, l2norm=l2norm, chunk=chunk, dtype=torch.float64, heads=part))
            assert torch.allclose(some, want[part], rtol=0, atol=1e-10)


def test_kda_rows_rebuild_transformers_output():
    from transformers.models.kimi_linear.modeling_kimi_linear import recurrent_kimi_delta_attention

    from attnviz.mixers.kda import kda_rows

    q, k, v, g, beta = _inputs(n=29)
    step, _ = recurrent_kimi_delta_attention(q[None], k[None], v[None], g=g[None], beta=beta[None],
                                             initial_state=None, output_final_state=False,
                                             use_qk_l2norm_in_kernel=True)
    w = _blocks(kda_rows(q, k, g, beta, chunk=8))
    _close(apply_map(w, v), step[0])


def test_kda_rows_keep_a_channel_that_does_not_forget():
    # every channel but one forgets at once: the decay's bound is its slowest channel's, so keys far back stay
    # (a bound from the mean or the fastest channel would drop them); the fast channels' entries are set to 0
    from attnviz.mixers.kda import kda_rows

    q, k, _, g, beta = _inputs(n=80, dk=4)
    g[:, :, 1:] = -60.0
    g[:, :, 0] = 0.0
    beta = beta * 0.2  # small corrections: channel 0 keeps much of what it holds
    want = recurrence(q, k, g, beta)
    assert want[:, 70:, :10].abs().max() > 1e-3  # the far keys still matter
    for got in (_blocks(kda_rows(q, k, g, beta, chunk=16)), kda_map(q, k, g, beta, chunk=16)):
        _close(got, want)
        _close(got[:, 70:, :10], want[:, 70:, :10])  # on their own scale


def test_kda_record_rows_rebuild_the_kernel_output():
    model = mixer_models.build("kimi_linear")
    record = mixer_records(model, mixer_models.text_ids(70))[0]
    for block in (None, 16):  # the kernel's chunk of 64: two blocks; 16: five
        w = _blocks(record.rows(block=block))
        assert w.shape == (record.heads, 70, 70)
        _close(record.mixed(w), record.output)
    exact = _blocks(record.rows(dtype=torch.float64, heads=slice(1, record.heads)))
    assert torch.allclose(exact, recurrence(record.query, record.key, record.g, record.beta)[1:], rtol=0, atol=1e-10)


def test_kda_streamed_stats_equal_the_full_maps():
    import numpy as np

    from attnviz.mixers.stats import linear_stats, map_stats, record_stats

    half = torch.randint(0, 256, (25,), generator=torch.Generator().manual_seed(3))
    tokens = torch.cat([half, half]).tolist()  # a repeat: induction targets
    q, k, v, g, beta = _inputs(n=50, strength=0.05)  # slow decay: weight far back, every statistic away from 0
    record = KdaRecord(0, q, k, v, g, beta, True, None)
    want = map_stats(recurrence(q, k, g, beta).numpy(), tokens)  # dense, on the float64 recurrence
    assert (want["half_mass_distance"] >= 3).all() and (want["induction"] > 0.01).all()
    found = [(map_stats(kda_map(q, k, g, beta).numpy(), tokens), 2e-5),  # the full map attnviz builds
             (linear_stats({4: record}, tokens)[4], 2e-5)]  # the record's own block, 64: one block
    for block in (3, 16, 50):
        found += [(record_stats(record, tokens, block=block, dtype=torch.float64), 1e-10),
                  (record_stats(record, tokens, block=block), 2e-5)]  # float32 rows
    for got, rtol in found:
        for key in ("prev_token", "induction", "distance_profile", "half_mass_distance"):
            np.testing.assert_allclose(got[key], want[key], rtol=rtol, atol=rtol * 1e-3, err_msg=key)
