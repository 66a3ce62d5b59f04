import numpy as np
import torch

from attnviz.sinks import without_sinks


def _causal_random_pattern(rng, shape):
    """Random row-stochastic causal pattern [..., n, n] built from exponentials, float64."""
    n = shape[-1]
    raw = rng.exponential(size=shape) * np.tril(np.ones((n, n)))
    return raw / raw.sum(axis=-1, keepdims=True)


def test_without_sinks_matches_loop_renormalisation():
    rng = np.random.default_rng(0)
    pattern = _causal_random_pattern(rng, (2, 3, 6, 6))
    out = without_sinks(pattern, sink_keys=(0, 2))
    expected = np.zeros_like(pattern)
    for idx in np.ndindex(pattern.shape[:-1]):
        row = [0.0 if j in (0, 2) else pattern[idx][j] for j in range(6)]
        s = sum(row)
        expected[idx] = [v / s for v in row] if s > 0 else [0.0] * 6
    np.testing.assert_allclose(out, expected, atol=1e-12)
    # Query 0 sees only key 0, which is hidden: its row stays zero, not NaN.
    assert np.all(out[..., 0, :] == 0)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[..., 1:, :].sum(-1), 1.0, atol=1e-12)


def test_without_sinks_torch_in_torch_out_and_default_key():
    p = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.6, 0.1, 0.3]])
    out = without_sinks(p)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.25, 0.75]]))
