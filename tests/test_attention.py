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
