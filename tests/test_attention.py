import math

import numpy as np
import pytest
import torch

from attnviz.attention import attention_scores, causal_mask, scaled_dot_product_attention


def reference(q, k, v, mask=None, bias=None, scale=None):
    """Loop-by-loop float64 attention, written from the formula, independent of the vectorised code."""
    n, d = q.shape
    m = k.shape[0]
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = np.zeros((n, v.shape[1]))
    w = np.zeros((n, m))
    for i in range(n):
        s = [sum(q[i, t] * k[j, t] for t in range(d)) * scale + (0 if bias is None else bias[i, j]) for j in range(m)]
        allowed = [mask is None or mask[i, j] for j in range(m)]
        top = max(s[j] for j in range(m) if allowed[j])
        e = [math.exp(s[j] - top) if allowed[j] else 0.0 for j in range(m)]
        w[i] = np.array(e) / sum(e)
        out[i] = w[i] @ v
    return out, w


@pytest.mark.parametrize("scale", [None, 1.0, 0.3])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_loop_reference(scale, causal):
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(5, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 3))
    bias = rng.normal(size=(5, 5))
    mask = causal_mask(5) if causal else None
    out, w = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, scale=scale)
    ref_out, ref_w = reference(q, k, v, mask=mask, bias=bias, scale=scale)
    np.testing.assert_allclose(w, ref_w, atol=1e-12)
    np.testing.assert_allclose(out, ref_out, atol=1e-12)


def test_matches_torch_sdpa_batched():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8, dtype=torch.float64) for _ in range(3))
    out, w = scaled_dot_product_attention(q, k, v, mask=torch.as_tensor(causal_mask(7)))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 7, dtype=torch.float64))


def test_fully_masked_row_is_zero_not_nan():
    q = k = v = np.ones((2, 2))
    mask = np.array([[False, False], [True, True]])
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    assert np.all(np.isfinite(w)) and np.all(w[0] == 0) and np.allclose(w[1], 0.5)


def test_causal_mask_offsets_queries_to_the_last_keys():
    m = causal_mask(2, 4)
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]


def test_attention_scores_are_what_the_softmax_sees():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), rng.normal(size=(4, 2))
    bias = rng.normal(size=(4, 4))
    mask = causal_mask(4)
    s = attention_scores(q, k, mask=mask, bias=bias, scale=0.7)
    np.testing.assert_allclose(s[mask], ((q @ k.T) * 0.7 + bias)[mask], atol=1e-12)
    assert np.all(np.isneginf(s[~mask]))
    e = np.exp(s - s.max(axis=1, keepdims=True))
    _, w = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, scale=0.7)
    np.testing.assert_allclose(w, e / e.sum(axis=1, keepdims=True), atol=1e-12)


# ----- the attention core: LayerInputs, MaskRule, scores, pattern with a learned sink, blocked output -----

from attnviz.attention import (  # noqa: E402
    LayerInputs, MaskRule, kv_head_of, layer_output, layer_pattern, layer_scores, softmax_with_sink,
)


def _inputs(n=23, heads=4, kv=2, d=8, *, mask=None, softcap=None, bias=False, sink=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(heads, n, d, generator=g) * 2
    k = torch.randn(kv, n, d, generator=g) * 2
    return LayerInputs(q=q, k=k, kv_head_of=tuple(kv_head_of(heads, kv)), scaling=d ** -0.5,
                       mask=mask or MaskRule(n, n, causal=True), softcap=softcap,
                       key_bias=torch.randn(heads, n, generator=g) if bias else None,
                       sink=torch.randn(heads, generator=g) + 1 if sink else None)


def _reference_logits(x: LayerInputs, visible: np.ndarray) -> np.ndarray:
    """float64 logits written from the definitions, head by head and entry by entry."""
    q, k = x.q.double().numpy(), x.k.double().numpy()
    out = np.full((x.n_heads, x.n_query, x.n_key), -np.inf)
    for h in range(x.n_heads):
        for i in range(x.n_query):
            for j in range(x.n_key):
                if not visible[i, j]:
                    continue
                s = float(q[h, i] @ k[x.kv_head_of[h], j]) * x.scaling
                if x.softcap:
                    s = x.softcap * math.tanh(s / x.softcap)
                if x.key_bias is not None:
                    s += float(x.key_bias[h, j])
                out[h, i, j] = s
    return out


@pytest.mark.parametrize("softcap, bias, sink", [(None, False, False), (1.5, False, False), (None, True, False),
                                                 (None, False, True), (2.0, True, True)])
def test_layer_scores_and_pattern_match_the_definitions(softcap, bias, sink):
    n = 19
    window = np.tril(np.ones((n, n), dtype=bool)) & ~np.tril(np.ones((n, n), dtype=bool), -5)  # sliding window 5
    for visible, rule in ((causal_mask(n), MaskRule(n, n, causal=True)), (window, MaskRule.from_bool(window))):
        x = _inputs(n, mask=rule, softcap=softcap, bias=bias, sink=sink)
        expected = _reference_logits(x, visible)
        got = layer_scores(x, dtype=torch.float64).numpy()
        assert np.array_equal(np.isinf(got), np.isinf(expected))
        np.testing.assert_allclose(got[np.isfinite(got)], expected[np.isfinite(expected)], rtol=1e-12, atol=1e-12)
        # the pattern: the sink logit joins every row's normalisation as a column that is then dropped
        columns = expected if not sink else np.concatenate(
            [expected, np.broadcast_to(x.sink.double().numpy()[:, None, None], (x.n_heads, n, 1))], axis=-1)
        full = np.exp(columns - columns.max(-1, keepdims=True))
        full /= full.sum(-1, keepdims=True)
        weights, sink_weight = layer_pattern(x, dtype=torch.float64)
        np.testing.assert_allclose(weights.numpy(), full[..., :n], atol=1e-12)
        if sink:
            np.testing.assert_allclose(sink_weight.numpy(), full[..., n], atol=1e-12)
            np.testing.assert_allclose(weights.sum(-1) + sink_weight, 1.0, atol=1e-12)
        else:
            assert sink_weight is None
        # any block of rows is the same rows of the whole
        block, _ = layer_pattern(x, 7, 12, dtype=torch.float64)
        np.testing.assert_allclose(block.numpy(), weights.numpy()[:, 7:12, :block.shape[-1]], atol=0)


def test_mask_rule_round_trips_and_knows_the_last_key_a_block_needs():
    n = 37
    rng = np.random.default_rng(0)
    explicit = rng.random((n, n)) < 0.4
    for visible in (np.ones((n, n), dtype=bool), causal_mask(n), causal_mask(n, n + 5), explicit):
        rule = MaskRule.from_bool(visible)
        assert np.array_equal(rule.rows(0, visible.shape[0]), visible)
        for a, b in ((0, 5), (10, 11), (30, n)):
            seen = np.nonzero(visible[a:b].any(0))[0]
            assert rule.key_end(a, b) >= (seen[-1] + 1 if len(seen) else 0)
            assert not visible[a:b, rule.key_end(a, b):].any()
    assert MaskRule.from_bool(causal_mask(n)).kind == "causal" and MaskRule.from_bool(explicit).kind == "explicit"
    assert MaskRule.from_bool(explicit).bits.nbytes <= n * math.ceil(n / 8)  # one bit an entry


def test_blocked_output_equals_dense_attention_and_a_fully_masked_row_is_zero():
    x = _inputs(50, heads=6, kv=3, d=16, softcap=3.0, sink=True, seed=2)
    v = torch.randn(3, 50, 5, generator=torch.Generator().manual_seed(9)).double()
    weights, _ = layer_pattern(x, dtype=torch.float64)
    dense = torch.matmul(weights, v[list(x.kv_head_of)])
    np.testing.assert_allclose(layer_output(x, v, block=7, dtype=torch.float64).numpy(), dense.numpy(), atol=1e-12)
    scores = torch.tensor([[[0.0, float("-inf")], [float("-inf"), float("-inf")]]])
    w, s = softmax_with_sink(scores)
    assert torch.equal(w[0, 1], torch.zeros(2)) and s is None and torch.isfinite(w).all()


def test_kv_head_of_for_mha_gqa_and_mqa():
    assert kv_head_of(4) == [0, 1, 2, 3] and kv_head_of(4, 2) == [0, 0, 1, 1] and kv_head_of(4, 1) == [0] * 4
    with pytest.raises(ValueError):
        kv_head_of(6, 4)


def test_masked_softmax_numpy_and_torch_against_a_python_loop():
    """The one softmax of attnviz, both paths, with -inf masks, an all-masked row and an extra (sink) logit, against
    exp / sum written out per row in Python floats."""
    import math

    from attnviz.attention import masked_softmax

    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 4, 5)) * 30  # large logits: the max subtraction matters
    x[0, 1, 2:] = -np.inf
    x[1, 3, :] = -np.inf  # no visible key
    extra = rng.normal(size=(2, 4)) * 30

    def loop(row, ex=None):
        finite = [v for v in row if v != -math.inf] + ([ex] if ex is not None else [])
        if not finite:
            return [0.0] * len(row), None
        m = max(finite)
        total = sum(math.exp(v - m) for v in finite)
        return [0.0 if v == -math.inf else math.exp(v - m) / total for v in row], (
            None if ex is None else math.exp(ex - m) / total)

    for use_extra in (False, True):
        w_np, e_np = masked_softmax(x, -1, extra if use_extra else None)
        w_t, e_t = masked_softmax(torch.from_numpy(x), -1, torch.from_numpy(extra) if use_extra else None)
        for a in range(2):
            for b in range(4):
                want, want_extra = loop(list(x[a, b]), float(extra[a, b]) if use_extra else None)
                np.testing.assert_allclose(w_np[a, b], want, rtol=1e-12, atol=1e-300)
                np.testing.assert_allclose(w_t[a, b].numpy(), want, rtol=1e-12, atol=1e-300)
                if use_extra:
                    assert e_np[a, b] == pytest.approx(want_extra, rel=1e-12)
                    assert float(e_t[a, b]) == pytest.approx(want_extra, rel=1e-12)
        assert not np.isnan(w_np).any() and not torch.isnan(w_t).any()
    # along another axis: the same as moving that axis last
    w0, _ = masked_softmax(x[0], 0)
    np.testing.assert_allclose(w0, masked_softmax(x[0].T, -1)[0].T, rtol=1e-12)
