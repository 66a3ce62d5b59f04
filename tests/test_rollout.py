import numpy as np
import pytest

from attnviz.capture import capture_attention
from attnviz.models import load_model
from attnviz.rollout import capture_rollout, layer_matrix, rollout


def _direct(pattern, residual=0.5):
    """Rollout written out element by element in float64: no matrix product, no broadcasting."""
    n_layers, n_heads, n, _ = pattern.shape
    joint = None
    out = []
    for layer in range(n_layers):
        a = [[0.0] * n for _ in range(n)]
        for q in range(n):
            for k in range(n):
                mean = sum(float(pattern[layer, h, q, k]) for h in range(n_heads)) / n_heads
                a[q][k] = (1 - residual) * mean + (residual if q == k else 0.0)
            total = sum(a[q])
            a[q] = [x / total for x in a[q]]
        if joint is None:
            joint = a
        else:
            joint = [[sum(a[q][m] * joint[m][k] for m in range(n)) for k in range(n)] for q in range(n)]
        out.append(np.array(joint))
    return np.stack(out)


@pytest.mark.parametrize("name", ["toy-gpt2", "toy-llama-gqa", "toy-bloom-alibi", "minilm-l6"])
def test_rollout_of_a_model_equals_the_direct_float64_computation(name):
    loaded = load_model(name)
    capture = capture_attention(loaded, "The cat sat on the mat. The cat sat.")
    got = capture_rollout(capture)
    np.testing.assert_allclose(got, _direct(capture.pattern.astype(np.float64)), atol=1e-12)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-12)
    if capture.causal:  # nothing flows from the future
        assert np.abs(np.triu(got[-1], 1)).max() == 0


def test_rollout_qk_store_equals_pattern_store():
    loaded = load_model("toy-llama-gqa")
    text = "one two three one two three"
    dense = capture_rollout(capture_attention(loaded, text))
    long = capture_rollout(capture_attention(loaded, text, store="qk"))
    np.testing.assert_allclose(long, dense, atol=1e-6)


def test_rows_that_do_not_sum_to_one_are_renormalised():
    rng = np.random.default_rng(0)
    p = rng.random((3, 2, 5, 5)) * 0.3  # rows sum to far less than 1, as with a learned sink
    got = rollout(p)
    np.testing.assert_allclose(got, _direct(p), atol=1e-12)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(layer_matrix(p[0], residual=1.0), np.eye(5))  # all residual: nothing moves


def test_rollout_needs_layers_from_zero():
    capture = capture_attention(load_model("toy-gpt2"), "a b c", layers=[1])
    with pytest.raises(ValueError, match="every layer from 0"):
        capture_rollout(capture)
    with pytest.raises(ValueError, match="at least one layer"):
        rollout([])
