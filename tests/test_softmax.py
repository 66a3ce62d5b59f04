import math

import numpy as np
import pytest
import torch

from attnviz.attention import causal_mask
from attnviz.softmax import (
    SCALED,
    UNSCALED,
    entropy,
    gradient_demo,
    head_saturation,
    head_variants,
    jacobian_norm,
    log_spaced_dims,
    query_gradient,
    query_gradient_chain_rule,
    random_qk,
    row_stats,
    saturation_sweep,
    saturation_sweeps,
    scale_sweep,
    scores_and_pattern,
    softmax,
    softmax_jacobian,
    valid_keys,
)


# softmax -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_matches_torch_in_float64(axis):
    x = torch.randn(3, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 10
    got = softmax(x, axis=axis)
    torch.testing.assert_close(got, torch.softmax(x, dim=axis), rtol=0, atol=1e-15)
    got_np = softmax(x.numpy(), axis=axis)
    assert isinstance(got_np, np.ndarray) and got_np.dtype == np.float64
    np.testing.assert_allclose(got_np, torch.softmax(x, dim=axis).numpy(), rtol=0, atol=1e-15)


def test_softmax_masked_entries_huge_logits_and_empty_rows():
    x = np.array([[0.0, -np.inf, 1.0], [1000.0, 999.0, -np.inf], [-np.inf, -np.inf, -np.inf]])
    p = softmax(x)
    e = math.exp(1.0)
    np.testing.assert_allclose(p[0], [1 / (1 + e), 0.0, e / (1 + e)], atol=1e-15)
    np.testing.assert_allclose(p[1], [e / (1 + e), 1 / (1 + e), 0.0], atol=1e-15)
    np.testing.assert_array_equal(p[2], [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(softmax(torch.as_tensor(x)).numpy(), p)
    assert softmax(np.array([1, 2, 3])).dtype == np.float64


def test_temperature_divides_the_logits():
    x = torch.randn(6, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    for t in (0.05, 0.5, 1.0, 2.0, 40.0):
        torch.testing.assert_close(softmax(x, temperature=t), torch.softmax(x / t, dim=-1), rtol=0, atol=1e-15)
    torch.testing.assert_close(softmax(x, temperature=1.0), softmax(x))


def test_temperature_limits_and_monotone_entropy():
    x = np.array([0.3, 2.0, -1.0, 1.9])
    np.testing.assert_allclose(softmax(x, temperature=1e-4), [0, 1, 0, 0], atol=1e-12)
    np.testing.assert_allclose(softmax(x, temperature=1e6), np.full(4, 0.25), atol=1e-5)
    # dH/d(1/T) = -Var_p(x) / T <= 0: entropy never decreases as the temperature rises.
    hs = [entropy(softmax(x, temperature=t)) for t in np.geomspace(0.01, 100, 60)]
    assert np.all(np.diff(hs) >= -1e-12)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_temperature_must_be_positive_and_finite(bad):
    with pytest.raises(ValueError):
        softmax(np.zeros(3), temperature=bad)


# entropy -------------------------------------------------------------------------------------------------------

def test_entropy_bounds_and_extremes():
    rng = np.random.default_rng(2)
    for n in (2, 7, 64):
        p = rng.dirichlet(np.full(n, 0.3), size=200)
        h = entropy(p)
        assert h.shape == (200,)
        assert np.all(h >= 0) and np.all(h <= math.log(n) + 1e-12)
        loop = [-sum(x * math.log(x) for x in row if x > 0) for row in p]
        np.testing.assert_allclose(h, loop, rtol=1e-12)
        torch.testing.assert_close(entropy(torch.as_tensor(p)), torch.as_tensor(loop), rtol=1e-12, atol=0)
        assert entropy(np.full(n, 1 / n)) == pytest.approx(math.log(n), abs=1e-12)
        assert entropy(np.eye(n)[0]) == 0.0
    saturated = softmax(rng.standard_normal((50, 32)) * 200)
    h = entropy(saturated)
    assert np.all(np.isfinite(h)) and np.all(h >= 0) and np.all(h <= math.log(32))


# Jacobian ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spread", [0.1, 1.0, 30.0])
def test_jacobian_equals_autograd(spread):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(8, dtype=torch.float64, generator=gen) * spread
    auto = torch.autograd.functional.jacobian(lambda z: torch.softmax(z, dim=-1), x)
    torch.testing.assert_close(softmax_jacobian(softmax(x)), auto, rtol=0, atol=1e-15)
    batch = torch.randn(4, 3, 6, dtype=torch.float64, generator=gen) * spread
    jac = softmax_jacobian(softmax(batch))
    assert jac.shape == (4, 3, 6, 6)
    for idx in np.ndindex(4, 3):
        auto = torch.autograd.functional.jacobian(lambda z: torch.softmax(z, dim=-1), batch[idx])
        torch.testing.assert_close(jac[idx], auto, rtol=0, atol=1e-15)


def test_jacobian_norms_match_matrix_norms_of_autograd_jacobian():
    x = torch.randn(10, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(4)) * 4
    autos = torch.stack([torch.autograd.functional.jacobian(lambda z: torch.softmax(z, dim=-1), row) for row in x])
    p = torch.softmax(x, dim=-1)
    torch.testing.assert_close(jacobian_norm(p), torch.linalg.matrix_norm(autos, ord="fro"), rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(jacobian_norm(p, ord="spectral"), torch.linalg.matrix_norm(autos, ord=2),
                               rtol=1e-10, atol=1e-14)
    n = 16  # uniform p: J = (I - 11^T / n) / n has eigenvalues 1/n (n - 1 times) and 0
    u = np.full(n, 1 / n)
    assert jacobian_norm(u) == pytest.approx(math.sqrt(n - 1) / n, rel=1e-12)
    assert jacobian_norm(u, ord="spectral") == pytest.approx(1 / n, rel=1e-12)
    assert jacobian_norm(np.eye(5)[2]) == 0.0
    with pytest.raises(ValueError):
        jacobian_norm(u, ord="nuclear")


def test_frobenius_norm_is_rms_gradient_for_unit_variance_upstream():
    # E ||J g||^2 = ||J||_F^2 for g with independent unit-variance entries, checked by Monte Carlo.
    p = softmax(np.random.default_rng(5).standard_normal(6) * 2)
    g = np.random.default_rng(6).standard_normal((200_000, 6))
    sq = np.sum((g @ softmax_jacobian(p)) ** 2, axis=1)
    se = sq.std() / math.sqrt(len(sq))
    assert abs(sq.mean() - jacobian_norm(p) ** 2) < 5 * se


# random q, k: Var(q.k) = d_k ----------------------------------------------------------------------------------

@pytest.mark.parametrize("d_k", [1, 4, 16, 64, 256, 1024])
def test_variance_of_dot_product_grows_as_d_k(d_k):
    """Var(q.k) = d_k for N(0, 1) entries. With x = q.k over N independent pairs, the estimator mean(x^2) (the mean
    is known to be 0) has standard error sqrt((E x^4 - d^2) / N), and E x^4 = 3 d^2 + 6 d (sum of d products
    q_i k_i with E = 0, E^2 = 1, E^4 = 9). The check allows 5 standard errors."""
    n = 4000
    q, k = random_qk(n, n, d_k, seed=7)
    x = np.einsum("nd,nd->n", q, k)  # pair i: query i with key i, so the pairs are independent
    se = math.sqrt((3 * d_k**2 + 6 * d_k - d_k**2) / n)
    assert abs(np.mean(x**2) - d_k) < 5 * se
    scaled = x / math.sqrt(d_k)
    assert abs(np.mean(scaled**2) - 1.0) < 5 * se / d_k


def test_random_qk_is_reproducible_and_standard_normal():
    q1, k1 = random_qk(5, 7, 3, seed=11)
    q2, k2 = random_qk(5, 7, 3, seed=11)
    q3, _ = random_qk(5, 7, 3, seed=12)
    assert q1.shape == (5, 3) and k1.shape == (7, 3)
    np.testing.assert_array_equal(q1, q2)
    np.testing.assert_array_equal(k1, k2)
    assert not np.array_equal(q1, q3)


def test_scores_and_pattern_follow_the_formula():
    q, k = random_qk(6, 9, 16, seed=8)
    for scaled, scale in ((True, 0.25), (False, 1.0)):
        for t in (0.5, 1.0, 3.0):
            scores, pattern = scores_and_pattern(q, k, scaled=scaled, temperature=t)
            ref = torch.as_tensor(q) @ torch.as_tensor(k).T * scale / t
            np.testing.assert_allclose(scores, ref.numpy(), rtol=1e-13)
            np.testing.assert_allclose(pattern, torch.softmax(ref, dim=-1).numpy(), atol=1e-15)


# saturation ----------------------------------------------------------------------------------------------------

def test_row_stats_by_hand():
    pattern = np.array([[0.995, 0.005, 0.0], [0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3]])
    stats = row_stats(pattern)
    np.testing.assert_allclose(stats.max_weight, [0.995, 0.5, 1 / 3])
    np.testing.assert_array_equal(stats.saturated, [True, False, False])
    assert stats.saturated_share == pytest.approx(1 / 3)
    np.testing.assert_allclose(stats.entropy[1], 1.5 * math.log(2), rtol=1e-12)
    j = np.diag(pattern[1]) - np.outer(pattern[1], pattern[1])
    np.testing.assert_allclose(stats.jacobian_norm[1], np.sqrt((j**2).sum()), rtol=1e-12)


D_KS = [1, 4, 16, 64, 256, 1024]


@pytest.fixture(scope="module")
def sweep():
    return saturation_sweep(D_KS, n_queries=2000, n_keys=32, seed=0, with_gradient=False)


def test_saturated_share_grows_with_d_k_unscaled(sweep):
    """Each step may not fall by more than 3 binomial standard errors, and the share must rise far above noise."""
    n = 2000
    share = sweep[sweep.variant == UNSCALED].sort_values("d_k").saturated_share.to_numpy()
    se = np.sqrt(np.maximum(share * (1 - share), 1 / n) / n)
    assert np.all(np.diff(share) > -3 * np.hypot(se[1:], se[:-1]))
    assert share[-1] - share[0] > 10 * np.hypot(se[-1], se[0])
    assert share[-1] > 0.5


def test_saturated_share_stays_flat_scaled(sweep):
    n = 2000
    share = sweep[sweep.variant == SCALED].sort_values("d_k").saturated_share.to_numpy()
    pooled = share.mean()
    se = math.sqrt(max(pooled * (1 - pooled), 1 / n) / n)
    assert np.all(np.abs(share - pooled) < 4 * se)
    assert np.all(share < 0.01)


def test_sweep_logit_variance_and_d_k_one(sweep):
    un = sweep[sweep.variant == UNSCALED].sort_values("d_k")
    sc = sweep[sweep.variant == SCALED].sort_values("d_k")
    np.testing.assert_allclose(un.logit_var.to_numpy(), sc.logit_var.to_numpy() * un.d_k.to_numpy(), rtol=1e-12)
    # At d_k = 1 the two variants are the same computation.
    cols = ["max_weight", "entropy", "saturated_share", "jac_p50"]
    np.testing.assert_allclose(un.iloc[0][cols].to_numpy(float), sc.iloc[0][cols].to_numpy(float), rtol=1e-12)
    assert np.all(un.entropy.to_numpy() <= math.log(32) + 1e-12) and np.all(un.entropy.to_numpy() >= 0)


def test_log_spaced_dims():
    dims = log_spaced_dims(1, 1024, per_octave=2)
    assert dims[0] == 1 and dims[-1] == 1024 and dims == sorted(set(dims))
    assert {2**i for i in range(11)} <= set(dims)


# autograd demonstration ----------------------------------------------------------------------------------------

def test_query_gradient_matches_chain_rule_by_hand():
    rng = np.random.default_rng(9)
    q, k, v, g = (rng.standard_normal(s) for s in [(5, 8), (7, 8), (7, 3), (5, 3)])
    for scale in (1 / math.sqrt(8), 1.0, 2.5):
        got = query_gradient(q, k, v, g, scale=scale)
        s = q @ k.T * scale
        p = np.exp(s - s.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        for i in range(5):
            j = np.diag(p[i]) - np.outer(p[i], p[i])
            np.testing.assert_allclose(got[i], scale * k.T @ (j @ (v @ g[i])), rtol=1e-10, atol=1e-13)


def test_chain_rule_gradient_equals_autograd_and_demo_methods_agree():
    rng = np.random.default_rng(13)
    q, k, v, g = (rng.standard_normal(s) for s in [(20, 64), (16, 64), (16, 8), (20, 8)])
    for scale in (1 / 8, 1.0, 0.3):
        np.testing.assert_allclose(query_gradient_chain_rule(q, k, v, g, scale=scale),
                                   query_gradient(q, k, v, g, scale=scale), rtol=1e-9, atol=1e-14)
    a = gradient_demo(256, 24, n_queries=30, seed=3, temperature=0.7)
    b = gradient_demo(256, 24, n_queries=30, seed=3, temperature=0.7, method="chain rule")
    for variant in (SCALED, UNSCALED):
        np.testing.assert_allclose(a[variant], b[variant], rtol=1e-8, atol=1e-12)


def test_sweep_gradient_column_equals_autograd_demo():
    df = saturation_sweep([1, 64, 1024], n_queries=40, n_keys=24, seed=5, temperature=1.5)
    for d_k in (1, 64, 1024):
        demo = gradient_demo(d_k, 24, n_queries=40, seed=5, temperature=1.5)
        for variant in (SCALED, UNSCALED):
            got = df[(df.d_k == d_k) & (df.variant == variant)].grad_q_p50.item()
            assert got == pytest.approx(np.median(demo[variant]), rel=1e-8, abs=1e-12)


def test_sweeps_at_many_temperatures_equal_each_temperatures_own_computation():
    """saturation_sweeps draws each d_k's q and k once for every temperature: each table must equal what that
    temperature's softmax of q·k gives (scores_and_pattern) and autograd's gradient (gradient_demo)."""
    temperatures = [0.5, 1.5, 4.0]
    tables = saturation_sweeps([1, 64, 1024], temperatures, n_queries=40, n_keys=24, seed=5)
    assert len(tables) == len(temperatures)
    for temperature, df in zip(temperatures, tables):
        for d_k in (1, 64, 1024):
            q, k = random_qk(40, 24, d_k, 5)
            demo = gradient_demo(d_k, 24, n_queries=40, seed=5, temperature=temperature)
            for variant, scaled in ((SCALED, True), (UNSCALED, False)):
                row = df[(df.d_k == d_k) & (df.variant == variant)]
                scores, pattern = scores_and_pattern(q, k, scaled=scaled, temperature=temperature)
                assert row.max_weight.item() == pytest.approx(pattern.max(-1).mean(), rel=1e-12)
                assert row.logit_var.item() == pytest.approx(np.var(scores), rel=1e-12)  # the logits / T
                assert row.grad_q_p50.item() == pytest.approx(np.median(demo[variant]), rel=1e-8, abs=1e-12)


def test_gradient_vanishes_unscaled_at_large_d_k():
    big = gradient_demo(1024, 32, n_queries=200, seed=0)
    small = gradient_demo(1, 32, n_queries=200, seed=0)
    np.testing.assert_allclose(small[SCALED], small[UNSCALED])  # the same computation at d_k = 1
    assert np.median(big[UNSCALED]) < 0.05 * np.median(big[SCALED])


# real head -----------------------------------------------------------------------------------------------------

def test_head_variants_from_masked_scores():
    q, k = random_qk(6, 6, 64, seed=10)
    scaling = 1 / 8
    mask = causal_mask(6)
    raw = torch.as_tensor(q @ k.T).masked_fill(~torch.as_tensor(mask), float("-inf"))
    out = head_variants(raw.numpy(), scaling, temperature=2.0)
    np.testing.assert_allclose(out["own scale"], torch.softmax(raw * scaling, -1).numpy(), atol=1e-15)
    np.testing.assert_allclose(out["unscaled"], torch.softmax(raw, -1).numpy(), atol=1e-15)
    np.testing.assert_allclose(out["temperature"], torch.softmax(raw * scaling / 2, -1).numpy(), atol=1e-15)
    np.testing.assert_array_equal(valid_keys(raw.numpy()), np.arange(1, 7))
    float_min = np.where(mask, q @ k.T, np.finfo(np.float32).min)
    np.testing.assert_array_equal(valid_keys(float_min), np.arange(1, 7))


def test_head_variants_keep_an_additive_bias_out_of_the_rescaling():
    """With a bias b added after the scaling (ALiBi), unscaled is softmax(q.k + b), not softmax((q.k s + b) / s),
    and the temperature divides the whole own-scale score. Written out element by element in float64."""
    q, k = random_qk(7, 7, 16, seed=13)
    scaling, t, slope = 0.25, 2.0, 0.5
    bias = slope * np.arange(7.0)  # [key]: BLOOM's ALiBi, slope x key position
    raw = np.where(causal_mask(7), q @ k.T, -np.inf)
    out = head_variants(raw, scaling, t, bias=bias)
    for name, factor, divide in (("own scale", scaling, 1.0), ("unscaled", 1.0, 1.0), ("temperature", scaling, t)):
        for i in range(7):
            z = np.array([(sum(q[i, d] * k[j, d] for d in range(16)) * factor + slope * j) / divide
                          for j in range(i + 1)])
            p = np.exp(z - z.max())
            np.testing.assert_allclose(out[name][i, : i + 1], p / p.sum(), atol=1e-12, err_msg=name)
            assert not out[name][i, i + 1:].any()
    # dividing the scores by the scaling (the bug of issue 14) multiplies the bias by 1 / scaling: not the same
    wrong = softmax(np.where(causal_mask(7), q @ k.T * scaling + bias, -np.inf) / scaling)
    assert np.abs(wrong - out["unscaled"]).max() > 0.05
    # a soft-cap c tanh(x / c) goes on q.k times the factor, before the bias
    capped = head_variants(raw, scaling, t, bias=bias, softcap=3.0)["unscaled"]
    np.testing.assert_allclose(capped, softmax(np.where(causal_mask(7), 3 * np.tanh(q @ k.T / 3) + bias, -np.inf)),
                               atol=1e-14)


def test_scale_sweep_matches_row_stats_and_saturates():
    q, k = random_qk(12, 12, 32, seed=11)
    scaling = 1 / math.sqrt(32)
    raw = np.where(causal_mask(12), q @ k.T, -np.inf)
    df = scale_sweep(raw, [scaling, 1.0, 1e4])
    own = torch.softmax(torch.as_tensor(raw[1:] * scaling), -1).numpy()  # row 0 has a single key and is left out
    assert df.max_weight.iloc[0] == pytest.approx(own.max(-1).mean(), rel=1e-12)
    h = -(own * np.log(np.where(own > 0, own, 1))).sum(-1)
    assert df.entropy.iloc[0] == pytest.approx(h.mean(), rel=1e-12)
    assert df.saturated_share.iloc[-1] == 1.0
    # with a bias, the factor multiplies q.k only: at a tiny factor the bias alone is left
    bias = 0.3 * np.arange(12.0)
    df = scale_sweep(raw, [scaling, 1e-12], bias=bias)
    with_bias = torch.softmax(torch.as_tensor(raw[1:] * scaling + bias), -1).numpy()
    assert df.max_weight.iloc[0] == pytest.approx(with_bias.max(-1).mean(), rel=1e-12)
    alone = torch.softmax(torch.as_tensor(np.where(causal_mask(12), bias, -np.inf)[1:]), -1).numpy()
    assert df.max_weight.iloc[1] == pytest.approx(alone.max(-1).mean(), rel=1e-9)


def test_head_saturation_matches_row_stats_head_by_head():
    rng = np.random.default_rng(12)
    scaling = 1 / math.sqrt(16)
    mask = causal_mask(9)
    raw = np.where(mask, rng.standard_normal((3, 2, 9, 9)) * 12, -np.inf)  # [layer, head, query, key]
    bias = rng.uniform(0, 3, (3, 2, 9))  # [layer, head, key]
    for b in (None, bias):
        shares = head_saturation(raw, scaling, temperature=0.5, bias=b)
        # the same from per-layer generators, as the page passes them
        lazy = head_saturation((r for r in raw), scaling, temperature=0.5, bias=None if b is None else iter(b))
        for name, (factor, divide) in {"own scale": (scaling, 1.0), "unscaled": (1.0, 1.0),
                                       "temperature": (scaling, 0.5)}.items():
            assert shares[name].shape == (3, 2)
            np.testing.assert_array_equal(lazy[name], shares[name])
            for layer, head in np.ndindex(3, 2):
                z = raw[layer, head, 1:] * factor + (0 if b is None else b[layer, head])
                p = torch.softmax(torch.as_tensor(z / divide), -1).numpy()
                assert shares[name][layer, head] == pytest.approx(np.mean(p.max(-1) > 0.99), abs=1e-12)


def _bloom_qk_from_weights(loaded, text: str, layer: int):
    """BLOOM's raw q.k and ALiBi bias for one layer, from the model's own weights in float64: the hidden states
    entering the block (output_hidden_states), its input LayerNorm, the fused query_key_value projection split as
    BLOOM splits it ([head, q|k|v, head_dim] per token), and the ALiBi slopes of Press et al. (2^(-8 h / n) for
    n a power of two) times the key position. Returns (raw [head, n, n] with -inf above the diagonal,
    bias [head, n], scaling 1/sqrt(head_dim))."""
    model = loaded.model
    ids = loaded.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states[layer][0].double()  # [n, d_model]
    block = model.transformer.h[layer]
    ln = block.input_layernorm
    x = torch.nn.functional.layer_norm(hidden, ln.normalized_shape, ln.weight.double(), ln.bias.double(), ln.eps)
    qkv = block.self_attention.query_key_value
    fused = x @ qkv.weight.double().T + qkv.bias.double()  # [n, 3 d_model]
    n, n_heads = ids.shape[1], model.config.n_head
    d = model.config.hidden_size // n_heads
    fused = fused.view(n, n_heads, 3, d)
    q, k = fused[:, :, 0].transpose(0, 1), fused[:, :, 1].transpose(0, 1)  # [head, n, d]
    raw = (q @ k.transpose(-1, -2)).numpy()
    raw = np.where(np.tril(np.ones((n, n), dtype=bool)), raw, -np.inf)
    slopes = np.array([2.0 ** (-8 * (h + 1) / n_heads) for h in range(n_heads)])
    return raw, slopes[:, None] * np.arange(n), 1 / math.sqrt(d)


def test_raw_qk_of_bloom_is_the_model_weights_q_dot_k_without_its_alibi_bias():
    from attnviz.capture import capture_attention
    from attnviz.models import load_model
    from attnviz.softmax import raw_qk

    loaded = load_model("toy-bloom-alibi")
    text = "The cat sat on the mat."
    cap = capture_attention(loaded, text, with_scores=True)
    for layer in cap.layers:
        raw, bias, scaling = _bloom_qk_from_weights(loaded, text, layer)
        got = raw_qk(cap.inputs[layer])
        assert got.dtype == np.float64 and got.shape == raw.shape
        np.testing.assert_array_equal(np.isinf(got), np.isinf(raw))
        finite = np.isfinite(raw[0])  # [query, key]: the causal mask, the same for every head
        np.testing.assert_allclose(got[:, finite], raw[:, finite], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(cap.inputs[layer].key_bias.double().numpy(), bias, rtol=1e-6, atol=1e-6)
        assert cap.inputs[layer].scaling == pytest.approx(scaling)
        # and the model's own scores are q.k * scaling + bias: the bias is not scaled
        np.testing.assert_allclose(cap.scores[cap.index_of(layer)][:, finite],
                                   (raw * scaling + bias[:, None])[:, finite], rtol=1e-4, atol=1e-4)


def test_page_states_the_gradient_it_computes_at_a_temperature():
    """The autograd section's formula is the one its metrics follow: with logits s K q_i / T the chain rule gives
    dL/dq_i = (s / T) K^T J_i V g_i (derived by hand here, J_i = diag(p_i) - p_i p_i^T), not s K^T J_i V g_i."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from attnviz.softmax import _values_and_upstream  # the page's seeded values and upstream gradient

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app_pages" / "softmax.py"),
                           default_timeout=180)
    at.run()
    assert not at.exception, at.exception
    at.session_state["softmax_tab"] = "The gradient that reaches q"  # its tab, opened as a click would
    at.select_slider(key="softmax_temperature").set_value(2.0).run()
    assert not at.exception, at.exception
    said = " ".join(md.value for md in at.markdown)
    n_queries = 256  # the rows the page samples, as its text says:
    assert f"Below, {n_queries} random queries" in said
    assert r"the chain rule it is $\tfrac{s}{T}\,K^\top J_i V g_i$" in said
    d_k, n_keys, seed, t = (at.select_slider(key="softmax_d_k").value, at.slider(key="softmax_n_keys").value,
                            int(at.number_input(key="softmax_seed").value), 2.0)
    metrics = {m.label: m.value for m in at.metric}
    for label, s in (("median ‖∂L/∂q‖, scaled", 1 / math.sqrt(d_k)), ("median ‖∂L/∂q‖, unscaled", 1.0)):
        q, k = random_qk(n_queries, n_keys, d_k, seed)
        v, g = _values_and_upstream(n_queries, n_keys, 16, seed)
        norms = []
        for i in range(len(q)):
            z = (s / t) * (k @ q[i])
            p = np.exp(z - z.max())
            p /= p.sum()
            jac = np.diag(p) - np.outer(p, p)
            norms.append(np.linalg.norm((s / t) * k.T @ (jac @ (v @ g[i]))))
        assert metrics[label] == f"{np.median(norms):.3g}"


# the page's real-model section ---------------------------------------------------------------------------------

def test_page_real_model_section_with_a_toy_model(monkeypatch):
    """The real-model section runs end to end on a toy model (instant), and its caption reports the capture's own
    scaling, which for GPT-2 is 1/sqrt(head_dim). It reads the layers' q and k only: the capture's full score
    array [layer, head, query, key] is never built."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from attnviz.capture import AttentionCapture, capture_attention
    from attnviz.models import load_model

    app = str(Path(__file__).resolve().parent.parent / "app.py")
    at = AppTest.from_file(app, default_timeout=180)
    at.run()
    at.switch_page("app_pages/softmax.py").run()
    assert not at.exception, at.exception
    cap = capture_attention(load_model("toy-gpt2"), at.text_input(key="softmax_text").value, with_scores=True)
    scores = cap.scores  # the reference, built before the page runs

    def no_scores(self):
        raise AssertionError("the page built the capture's whole score array")

    monkeypatch.setattr(AttentionCapture, "scores", property(no_scores))
    at.selectbox(key="softmax_model").set_value("toy-gpt2").run()
    at.button(key="softmax_capture").click().run()
    assert not at.exception, at.exception
    assert len(at.dataframe) == 1
    captions = " ".join(c.value for c in at.caption)
    assert cap.scaling == pytest.approx(1 / math.sqrt(cap.head_dim))
    assert f"head_dim = {cap.head_dim}" in captions
    at.selectbox(key="softmax_head").set_value(1).run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value  # rows: own scale, unscaled, temperature
    # row 0 of a causal model sees one key; a copy, since the capture's arrays are read-only
    raw = torch.tensor(np.array(scores[0, 1]), dtype=torch.float64)[1:]
    for row, logits in zip(range(3), (raw, raw / cap.scaling, raw / 2.0)):
        top = torch.softmax(logits, -1).amax(-1)
        assert table["mean max weight"].iloc[row] == pytest.approx(top.mean().item(), rel=1e-5)
        assert table["saturated rows"].iloc[row] == pytest.approx((top > 0.99).double().mean().item())
    at.select_slider(key="softmax_real_temperature").set_value(0.5).run()
    assert not at.exception, at.exception


def test_page_real_model_sweeps_are_not_recomputed_on_a_rerun(monkeypatch):
    """Changing only the query row reruns the page but not the sweep over scales nor the all-heads grid."""
    from pathlib import Path

    import streamlit as st
    from streamlit.testing.v1 import AppTest

    import attnviz.softmax as sm

    calls = {"scale_sweep": 0, "head_saturation": 0}
    for name in calls:
        original = getattr(sm, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(sm, name, counted)
    from attnviz.ui import PAGES

    st.cache_data.clear()
    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"), default_timeout=180)
    at.run()
    at.switch_page(next(p.script for p in PAGES if p.url_path == "softmax")).run()
    at.selectbox(key="softmax_model").set_value("toy-gpt2").run()
    at.button(key="softmax_capture").click().run()
    assert not at.exception, at.exception
    assert calls == {"scale_sweep": 1, "head_saturation": 1}
    at.selectbox(key="softmax_query").set_value(0).run()
    at.selectbox(key="softmax_query").set_value(1).run()
    assert not at.exception, at.exception
    assert calls == {"scale_sweep": 1, "head_saturation": 1}
    at.selectbox(key="softmax_head").set_value(1).run()  # a new head: a new sweep, the same grid
    assert calls == {"scale_sweep": 2, "head_saturation": 1}
    at.select_slider(key="softmax_real_temperature").set_value(0.5).run()  # the grids show no T: the same grid
    assert not at.exception, at.exception
    assert calls == {"scale_sweep": 2, "head_saturation": 1}
    st.cache_data.clear()


def _plotted(value) -> np.ndarray:
    """A trace's array as plotly serialises it: nested lists, or a typed array {"dtype", "bdata", "shape"}."""
    import base64

    if isinstance(value, dict):
        a = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"])).astype(float)
        return a.reshape([int(x) for x in str(value.get("shape", a.size)).split(",")])
    return np.array([[np.nan if x is None else x for x in row] for row in value] if value and
                    isinstance(value[0], list) else value, dtype=float)


def test_page_real_model_section_keeps_the_alibi_bias_out_of_every_rescaling():
    """Issue 14: on BLOOM (ALiBi) the page divided the whole score by the scaling, multiplying the bias by
    1/scaling (x4 here) in the 'raw q·k' map, the sweep and the grids. Every map, table row, sweep point and grid
    cell shown for toy-bloom-alibi is checked against softmax(q.k * factor + alibi) computed from the model's own
    weights in float64 (_bloom_qk_from_weights)."""
    import json
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from attnviz.models import load_model

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"), default_timeout=180)
    at.run()
    at.switch_page("app_pages/softmax.py").run()
    at.selectbox(key="softmax_model").set_value("toy-bloom-alibi").run()
    at.button(key="softmax_capture").click().run()
    assert not at.exception, at.exception
    head, layer, t = 0, 1, 2.0  # head 0 has the steepest slope, 1/4: the bias it would get wrong most
    at.selectbox(key="softmax_layer").set_value(layer).run()
    at.selectbox(key="softmax_head").set_value(head).run()
    at.select_slider(key="softmax_real_temperature").set_value(t).run()
    assert not at.exception, at.exception
    raw, bias, scaling = _bloom_qk_from_weights(load_model("toy-bloom-alibi"), at.text_input(key="softmax_text").value,
                                                layer)

    def pattern(factor: float, divide: float = 1.0, h: int = head) -> np.ndarray:
        return torch.softmax(torch.as_tensor((raw[h] * factor + bias[h]) / divide), -1).numpy()

    expected = {"Own scale: q·k × 0.25 + b": pattern(scaling), "Unscaled: q·k + b": pattern(1.0),
                f"Own scale ÷ T, T = {t:g}": pattern(scaling, t)}
    figures = [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]
    maps = {t["name"]: t for f in figures for t in f["data"] if t.get("type") == "heatmap" and "name" in t}
    for title, p in expected.items():
        assert title in maps, sorted(maps)
        np.testing.assert_allclose(_plotted(maps[title]["z"]), p, atol=1e-5, err_msg=title)
    table = at.dataframe[0].value
    assert list(table["softmax"]) == list(expected)
    for row, p in enumerate(expected.values()):
        assert table["mean max weight"].iloc[row] == pytest.approx(p[1:].max(-1).mean(), rel=1e-5)
    captions = " ".join(c.value for c in at.caption)
    assert "middle, q·k + b" in captions and "b is kept as the model adds it" in captions
    # the sweep multiplies q.k only; the bias stays: its last point is factor 8, and no temperature marker is drawn
    sweep = next(f for f in figures if f["layout"].get("title", {}).get("text", "").startswith(f"Layer {layer}, "))
    traces = {tr["name"]: tr for tr in sweep["data"]}
    x = _plotted(traces["mean max weight"]["x"])
    assert x[-1] == pytest.approx(8.0)
    assert _plotted(traces["mean max weight"]["y"])[-1] == pytest.approx(pattern(8.0)[1:].max(-1).mean(), rel=1e-5)
    assert [a["text"] for a in sweep["layout"]["annotations"]] == ["own scale", "unscaled"]
    # the grid of every head, unscaled: the share of rows (after the first) with a weight above 0.99
    grid = next(f for f in figures if f["layout"].get("title", {}).get("text") == "Saturated rows per head, unscaled")
    z = _plotted(grid["data"][0]["z"])
    for h in range(raw.shape[0]):
        assert z[layer, h] == pytest.approx(np.mean(pattern(1.0, h=h)[1:].max(-1) > 0.99), abs=1e-12)


def test_each_tab_of_the_random_section_draws_its_own_chart_only():
    """The random-logits section's tabs run only the open tab's code: each tab, opened as a click would, draws its
    one chart (told apart by its title) and none of the others'."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    titles = {"Logits and rows": "d_k (in this chart)", "Every row, not only the mean": "Max weight per row",
              "Against d_k": "Variance of the logits", "The gradient that reaches q": "per query row at d_k"}
    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app_pages" / "softmax.py"),
                           default_timeout=180)
    at.run()
    for label, title in titles.items():
        at.session_state["softmax_tab"] = label
        at.run()
        assert not at.exception, at.exception
        specs = [chart.proto.spec for chart in at.get("plotly_chart")]
        assert len(specs) == 1, (label, len(specs))
        assert title in specs[0], label
        assert not any(other in specs[0] for other in titles.values() if other != title), label
