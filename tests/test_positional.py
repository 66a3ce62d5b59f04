"""attnviz.positional against independent references: float64 loops over the papers' formulas, transformers' own
Llama RoPE, BLOOM ALiBi and XLM sinusoidal code, and a tiny BLOOM model whose content scores are switched off."""

from __future__ import annotations

import cmath
import math

import numpy as np
import pytest
import torch

from attnviz import distance as D
from attnviz import positional as P
from attnviz import shape as S

RNG = np.random.default_rng(0)


# ---------------------------------------------------------------- sinusoidal


def _pe_loop(n, d, base=10000.0):
    """Vaswani et al. 2017 §3.5 written out with math.sin / math.cos."""
    pe = np.zeros((n, d))
    for p in range(n):
        for i in range(d // 2):
            pe[p, 2 * i] = math.sin(p / base ** (2 * i / d))
            pe[p, 2 * i + 1] = math.cos(p / base ** (2 * i / d))
    return pe


@pytest.mark.parametrize("n,d,base", [(50, 16, 10000.0), (7, 2, 100.0), (33, 64, 500.0)])
def test_sinusoidal_encoding_matches_the_paper_formula(n, d, base):
    np.testing.assert_allclose(P.sinusoidal_encoding(n, d, base), _pe_loop(n, d, base), rtol=0, atol=1e-13)


def test_sinusoidal_encoding_matches_transformers_xlm():
    from transformers.models.xlm.modeling_xlm import create_sinusoidal_embeddings

    out = create_sinusoidal_embeddings(128, 32, torch.empty(128, 32))
    np.testing.assert_allclose(P.sinusoidal_encoding(128, 32), out.numpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("k", [0, 1, 5, 37, -12, 2.5])
def test_pe_shift_is_a_fixed_rotation(k):
    d = 24
    pe = _pe_loop(200, d)
    m = P.sinusoidal_shift_matrix(k, d)
    np.testing.assert_allclose(m @ m.T, np.eye(d), atol=1e-14)  # a rotation: orthogonal
    assert np.linalg.det(m) == pytest.approx(1.0, abs=1e-12)
    # the same matrix maps PE_p to PE_(p+k) for every p: compare with the formula evaluated at p + k directly
    p = np.arange(20, 120)
    shifted = np.array([[f(pp + k) for f in _pair_funcs(d)] for pp in p])
    np.testing.assert_allclose(pe[p] @ m.T, shifted, rtol=0, atol=1e-12)
    if float(k).is_integer():
        np.testing.assert_allclose(pe[p] @ m.T, pe[p + int(k)], rtol=0, atol=1e-12)


def _pair_funcs(d, base=10000.0):
    out = []
    for i in range(d // 2):
        w = base ** (-2 * i / d)
        out += [lambda x, w=w: math.sin(x * w), lambda x, w=w: math.cos(x * w)]
    return out


def test_sinusoidal_dot_depends_on_offset_only():
    d = 32
    pe = _pe_loop(300, d)
    ks = np.arange(0, 100)
    expected = P.sinusoidal_dot(ks, d)
    for p in (0, 17, 150):
        np.testing.assert_allclose(np.einsum("d,kd->k", pe[p], pe[p + ks]), expected, atol=1e-12)
    assert expected[0] == pytest.approx(d / 2)  # sin^2 + cos^2 per pair


# ---------------------------------------------------------------- RoPE


def _rope_loop(x, positions, base=10000.0):
    """The paper's adjacent-pair rotation (RoFormer eq. 34) with complex numbers, one pair at a time."""
    n, d = x.shape
    out = np.zeros_like(x)
    for t in range(n):
        for i in range(d // 2):
            z = complex(x[t, 2 * i], x[t, 2 * i + 1]) * cmath.exp(1j * positions[t] * base ** (-2 * i / d))
            out[t, 2 * i], out[t, 2 * i + 1] = z.real, z.imag
    return out


def test_rope_frequencies_formula():
    d = 64
    expected = [10000.0 ** (-2 * i / d) for i in range(d // 2)]
    np.testing.assert_allclose(P.rope_frequencies(d), expected, rtol=1e-15)


def test_apply_rope_interleaved_matches_complex_rotation():
    x = RNG.standard_normal((12, 16))
    pos = RNG.integers(-50, 500, size=12).astype(float)
    np.testing.assert_allclose(P.apply_rope(x, pos, interleaved=True), _rope_loop(x, pos), rtol=0, atol=1e-12)


@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rope_equals_rotation_matrix(interleaved):
    x = RNG.standard_normal((5, 3, 32))
    out = P.apply_rope(x, np.arange(3) * 11.0, base=500.0, interleaved=interleaved)
    for t in range(3):
        r = P.rope_rotation_matrix(11.0 * t, 32, 500.0, interleaved=interleaved)
        np.testing.assert_allclose(out[:, t], x[:, t] @ r.T, atol=1e-13)
        np.testing.assert_allclose(r @ r.T, np.eye(32), atol=1e-14)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_relative_position_identity(interleaved):
    """<R_m q, R_n k> = <q, R_(n-m) k> (RoFormer eq. 16), to float64 precision."""
    d = 64
    q, k = RNG.standard_normal((2, d))
    for m, n in [(0, 0), (3, 10), (100, 7), (-5, 2048), (4096, 4100)]:
        left = P.apply_rope(q[None], [m], interleaved=interleaved)[0] @ P.apply_rope(k[None], [n],
                                                                                   interleaved=interleaved)[0]
        right = q @ P.apply_rope(k[None], [n - m], interleaved=interleaved)[0]
        assert left == pytest.approx(right, rel=1e-12, abs=1e-12)
        r_m = P.rope_rotation_matrix(m, d, interleaved=interleaved)
        r_n = P.rope_rotation_matrix(n, d, interleaved=interleaved)
        np.testing.assert_allclose(r_m.T @ r_n, P.rope_rotation_matrix(n - m, d, interleaved=interleaved),
                                   atol=1e-12)
    r = np.array([0.0, 1.0, 9.0, 250.0])
    expected = [P.apply_rope(q[None], [p])[0] @ P.apply_rope(k[None], [p - rr])[0] for p, rr in zip([5, 50, 9, 999], r)]
    np.testing.assert_allclose(P.rope_score(q, k, r), expected, atol=1e-11)


def test_interleaved_and_rotate_half_agree_under_the_permutation():
    d = 16
    perm = P.interleaved_to_half_permutation(d)
    assert sorted(perm) == list(range(d))
    x = RNG.standard_normal((2, 9, d))
    pos = np.arange(9) * 13.0
    np.testing.assert_allclose(P.apply_rope(x[..., perm], pos), P.apply_rope(x, pos, interleaved=True)[..., perm],
                               rtol=0, atol=1e-14)
    inv = np.argsort(perm)
    np.testing.assert_allclose(P.apply_rope(x[..., perm], pos)[..., inv], P.apply_rope(x, pos, interleaved=True),
                               rtol=0, atol=1e-14)
    # and on the rotation matrices: P R_half P^T = R_interleaved, with P the permutation matrix
    pm = np.eye(d)[perm]
    np.testing.assert_allclose(pm.T @ P.rope_rotation_matrix(7.0, d) @ pm,
                               P.rope_rotation_matrix(7.0, d, interleaved=True), atol=1e-15)


def test_permutation_is_what_transformers_does_to_gguf_llama_q_and_k():
    """llama.cpp stores W_q, W_k for the paper's interleaved pairs; transformers' GGUF loader reorders their rows for
    rotate_half. Its reorder is our permutation, head by head, and RoPE then gives the same scores either way."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    n_head, d, hidden = 3, 8, 12
    w_gguf = RNG.standard_normal((n_head * d, hidden))
    processor = LlamaTensorProcessor(config={"num_attention_heads": n_head, "num_key_value_heads": n_head})
    w_hf = processor.process(w_gguf.copy(), "blk.0.attn_q.weight").weights
    perm = P.interleaved_to_half_permutation(d)
    np.testing.assert_array_equal(w_hf.reshape(n_head, d, hidden), w_gguf.reshape(n_head, d, hidden)[:, perm])
    x = RNG.standard_normal((5, hidden))  # 5 tokens
    q_gguf = (x @ w_gguf.T).reshape(5, n_head, d).transpose(1, 0, 2)  # [head, n, d]
    q_hf = (x @ w_hf.T).reshape(5, n_head, d).transpose(1, 0, 2)
    pos = np.arange(5) * 3.0
    paper, hf = P.apply_rope(q_gguf, pos, interleaved=True), P.apply_rope(q_hf, pos)
    np.testing.assert_allclose(hf, paper[..., perm], atol=1e-13)
    np.testing.assert_allclose(hf @ hf.transpose(0, 2, 1), paper @ paper.transpose(0, 2, 1), atol=1e-12)


@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rope_preserves_norms(interleaved):
    x = RNG.standard_normal((3, 4, 40, 64))
    out = P.apply_rope(x, RNG.uniform(-1e4, 1e4, size=40), interleaved=interleaved)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-13)
    assert not np.allclose(out, x)


def test_apply_rope_keeps_type_and_dtype():
    x = torch.randn(2, 5, 8)
    out = P.apply_rope(x)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == x.shape
    torch.testing.assert_close(out[:, 0], x[:, 0])  # position 0 is the identity
    assert isinstance(P.apply_rope(x.numpy()), np.ndarray)


def test_apply_rope_matches_transformers_llama():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    base, d = 100000.0, 64
    config = LlamaConfig(hidden_size=3 * d, num_attention_heads=3, head_dim=d, max_position_embeddings=2048,
                         rope_parameters={"rope_type": "default", "rope_theta": base})
    rotary = LlamaRotaryEmbedding(config)
    torch.manual_seed(0)
    q = torch.randn(2, 3, 50, d)  # [batch, head, n, d]
    k = torch.randn(2, 3, 50, d)
    position_ids = torch.stack([torch.arange(50), torch.arange(50) * 13 + 100])  # [batch, n]
    cos, sin = rotary(q, position_ids)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
    pos = position_ids[:, None, :]  # [batch, 1, n] broadcasts over heads
    torch.testing.assert_close(P.apply_rope(q, pos, base=base), q_ref, rtol=0, atol=2e-4)
    torch.testing.assert_close(P.apply_rope(k, pos, base=base), k_ref, rtol=0, atol=2e-4)
    # away from float32 angle rounding (small positions) the two agree to float32 precision
    torch.testing.assert_close(P.apply_rope(q[0], pos[0], base=base), q_ref[0], rtol=0, atol=1e-5)


# ---------------------------------------------------------------- context scaling


def test_linear_scaling_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=32, max_position_embeddings=64,
                         rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0})
    inv_freq, _ = ROPE_INIT_FUNCTIONS["linear"](config)
    np.testing.assert_allclose(P.scaled_rope_frequencies(32, scaling="linear", factor=4.0), inv_freq.numpy(),
                               rtol=1e-6)
    # position interpolation: position 4p after scaling is position p before
    x = RNG.standard_normal((1, 32))
    np.testing.assert_allclose(P.apply_rope(x, [40.0], scaling="linear", factor=4.0), P.apply_rope(x, [10.0]),
                               atol=1e-13)


def test_ntk_scaling_matches_transformers_dynamic_ntk_and_its_defining_property():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    # transformers' dynamic NTK with factor 1 at seq_len = 4 x max_position_embeddings is static NTK with factor 4
    config = LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=32, max_position_embeddings=64,
                         rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 1.0})
    inv_freq, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=256)
    ntk = P.scaled_rope_frequencies(32, scaling="ntk", factor=4.0)
    np.testing.assert_allclose(ntk, inv_freq.numpy(), rtol=1e-6)
    plain = P.rope_frequencies(32)
    assert ntk[0] == plain[0] == 1.0  # the fastest pair keeps its frequency
    assert ntk[-1] == pytest.approx(plain[-1] / 4.0, rel=1e-12)  # the slowest is interpolated by the full factor


# ---------------------------------------------------------------- RoFormer decay bound


def _bound_loop(r, d, base=10000.0):
    """(1/(d/2)) sum_{j=1}^{d/2} |sum_{k=0}^{j-1} e^(i r theta_k)|, theta_k = base^(-2k/d) (RoFormer §3.4.3)."""
    total = 0.0
    for j in range(1, d // 2 + 1):
        total += abs(sum(cmath.exp(1j * r * base ** (-2 * kk / d)) for kk in range(j)))
    return total / (d // 2)


def test_decay_bound_matches_the_formula():
    r = np.array([0.0, 1.0, 2.5, 10.0, 63.0, 250.0])
    for d, base in [(128, 10000.0), (64, 100000.0), (8, 10.0)]:
        np.testing.assert_allclose(P.rope_decay_bound(r, d, base), [_bound_loop(x, d, base) for x in r], rtol=1e-12)


@pytest.mark.parametrize("d", [2, 4, 64, 128, 256])
def test_decay_bound_at_distance_zero(d):
    # every S_j = j at r = 0 (j terms of e^0 = 1), and the mean of 1 .. d/2 is (d/2 + 1)/2
    assert P.rope_decay_bound([0.0], d)[0] == pytest.approx((d / 2 + 1) / 2, rel=1e-15)


def test_decay_bound_bounds_the_score_through_abel_summation():
    """The paper's step: sum_i h_i e^(i r theta_i) = -sum_i S_(i+1) (h_(i+1) - h_i), so |score| is at most
    max_i |h_(i+1) - h_i| * (d/2) * bound(r). Checked with the real RoPE score of random q, k."""
    d = 32
    r = np.arange(0, 300, 7.0)
    s = P.rope_partial_sums(r, d)  # [r, d/2]
    for _ in range(5):
        q, k = RNG.standard_normal((2, d))
        h = np.append(q[0::2] + 1j * q[1::2], 0) * np.conj(np.append(k[0::2] + 1j * k[1::2], 0))  # h_(d/2) = 0
        direct = (h[:-1] * np.exp(1j * r[:, None] * P.rope_frequencies(d))).sum(-1)
        np.testing.assert_allclose(-(s * np.diff(h)).sum(-1), direct, atol=1e-10)
        # Re(direct) is the RoPE score of the interleaved layout with key at 0 and query at r... up to sign of r:
        score = [P.apply_rope(q[None], [rr], interleaved=True)[0] @ P.apply_rope(k[None], [0.0], interleaved=True)[0]
                 for rr in r]
        np.testing.assert_allclose(direct.real, score, atol=1e-10)
        bound = np.abs(np.diff(h)).max() * (d / 2) * P.rope_decay_bound(r, d)
        assert np.all(np.abs(direct) <= bound + 1e-9)


# ---------------------------------------------------------------- ALiBi


def _slopes_reference(n):
    """ofirpress/attention_with_linear_biases, fairseq/models/transformer.py, get_slopes, verbatim logic."""
    def get_slopes_power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        ratio = start
        return [start * ratio ** i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest_power_of_2) + _slopes_reference(2 * closest_power_of_2)[0::2][
        : n - closest_power_of_2]


def test_alibi_slopes_match_transformers_bloom_for_1_to_64_heads():
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    length = 6
    for n in range(1, 65):
        # build_alibi_tensor(attention_mask [batch, seq], num_heads, dtype) -> [batch * heads, 1, seq] = slope * j
        alibi = build_alibi_tensor(torch.ones(1, length), n, torch.float32).reshape(n, length).double().numpy()
        slopes = P.alibi_slopes(n)
        assert slopes.shape == (n,)
        np.testing.assert_allclose(alibi, slopes[:, None] * np.arange(length), rtol=1e-6, atol=0)
        np.testing.assert_allclose(slopes, _slopes_reference(n), rtol=1e-15)


def test_alibi_slopes_of_the_paper_for_8_heads():
    np.testing.assert_allclose(P.alibi_slopes(8), [2.0 ** -(i + 1) for i in range(8)], rtol=1e-15)


def test_alibi_bias_shape_values_and_softmax_equivalence_with_bloom():
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    h, n = 6, 9
    bias = P.alibi_bias(h, n)
    assert bias.shape == (h, n, n)
    slopes = P.alibi_slopes(h)
    for i in range(n):
        for j in range(n):
            if j > i:
                assert np.all(np.isneginf(bias[:, i, j]))
            else:
                np.testing.assert_allclose(bias[:, i, j], -slopes * (i - j), rtol=1e-15)
    # BLOOM adds +slope * j instead of -slope * (i - j): the same softmax per row (shift invariance)
    scores = RNG.standard_normal((h, n, n))
    bloom = build_alibi_tensor(torch.ones(1, n), h, torch.float64).reshape(h, 1, n).numpy()
    causal = np.tril(np.ones((n, n), dtype=bool))
    ref = np.where(causal, scores + bloom, -np.inf)
    ref = np.exp(ref - ref.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    np.testing.assert_allclose(P.alibi_pattern(h, n, scores), ref, atol=1e-6)  # BLOOM's slopes are float32


def test_alibi_bias_with_a_cache_and_non_causal():
    bias = P.alibi_bias(4, 3, 7)  # 3 new queries at positions 4, 5, 6 over 7 keys
    slopes = P.alibi_slopes(4)
    np.testing.assert_allclose(bias[:, 0, :5], -slopes[:, None] * np.array([4, 3, 2, 1, 0]))
    assert np.all(np.isneginf(bias[:, 0, 5:]))
    sym = P.alibi_bias(4, 5, causal=False)
    np.testing.assert_allclose(sym, np.transpose(sym, (0, 2, 1)))
    np.testing.assert_allclose(sym[:, 1, 4], -3 * slopes)
    with pytest.raises(ValueError):
        P.alibi_bias(4, 5, 3)
    with pytest.raises(ValueError):
        P.alibi_slopes(0)


# ---------------------------------------------------------------- attention against distance


@pytest.mark.parametrize("heads,n,skip", [(1, 5, 0), (12, 40, 0), (8, 30, 1), (3, 17, 4)])
def test_alibi_by_distance_closed_form_equals_the_pattern_average(heads, n, skip):
    np.testing.assert_allclose(P.alibi_by_distance(heads, n, exclude_keys=skip),
                               D.attention_by_distance(P.alibi_pattern(heads, n), exclude_keys=skip), rtol=1e-12)


def test_tiny_bloom_without_content_follows_the_alibi_theory():
    """A BLOOM whose query/key projections are zero attends by ALiBi alone: its measured attention against
    distance must be the ALiBi-only prediction, layer by layer."""
    from transformers import BloomConfig, BloomModel

    config = BloomConfig(vocab_size=50, hidden_size=24, n_layer=2, n_head=6, attn_implementation="eager")
    model = BloomModel(config).eval()
    with torch.no_grad():
        for block in model.h:
            w = block.self_attention.query_key_value
            # fused [heads, (q, k, v), head_dim] rows: zero q and k rows
            rows = w.weight.view(6, 3, 4, 24)
            rows[:, :2] = 0
            w.bias.view(6, 3, 4)[:, :2] = 0
        out = model(torch.randint(0, 50, (1, 12)), output_attentions=True)
    pattern = torch.stack(out.attentions)[:, 0].double().numpy()  # [layer, head, query, key]
    theory = D.attention_by_distance(P.alibi_pattern(6, 12))
    measured = D.attention_by_distance(pattern)
    for layer in range(2):
        np.testing.assert_allclose(measured[layer], theory, atol=1e-6)
    assert not np.allclose(theory, D.uniform_causal_by_distance(12))


def test_compare_schemes_against_direct_computation():
    from attnviz.attention import scaled_dot_product_attention

    d, n, base, slope = 16, 20, 1000.0, 0.25
    q, k = RNG.standard_normal((2, d))
    out = P.compare_schemes(q, k, n, base=base, alibi_slope=slope)
    keys = np.tile(k, (n, 1))  # the same key at every position j, distance n-1-j
    rev = slice(None, None, -1)  # position order -> distance order
    pe = _pe_loop(n, d, base)
    pos = np.arange(n, dtype=float)
    cases = {
        "no position": (q[None], keys, None),
        "sinusoidal": ((q + pe[n - 1])[None], keys + pe, None),
        "RoPE": (P.apply_rope(q[None], [n - 1.0], base=base), P.apply_rope(keys, pos, base=base), None),
        "ALiBi": (q[None], keys, -slope * (n - 1 - pos)[None]),
    }
    for name, (qq, kk, bias) in cases.items():
        _, weights = scaled_dot_product_attention(qq, kk, kk, bias=bias)
        np.testing.assert_allclose(P.softmax_over_distance(out[name]), weights[0][rev], atol=1e-12, err_msg=name)
        np.testing.assert_allclose(out[name], (qq @ kk.T / math.sqrt(d) + (0 if bias is None else bias))[0][rev],
                                   atol=1e-12, err_msg=name)


# ---------------------------------------------------------------- page


def _values(y) -> np.ndarray:
    """A trace's y as plotly serialises it: a list, or a typed array {"dtype", "bdata" (base64)}."""
    import base64

    if isinstance(y, dict):
        return np.frombuffer(base64.b64decode(y["bdata"]), dtype=np.dtype(y["dtype"])).astype(float)
    return np.asarray(y, dtype=float)


def _page():
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"), default_timeout=180)
    at.run()
    at.switch_page("app_pages/positional.py").run()
    assert not at.exception, at.exception
    return at


def test_page_every_section_runs_and_the_shown_identities_hold():
    at = _page()
    sections = at.radio(key="pos_section").options
    assert len(sections) == 5
    for name in sections:
        at.radio(key="pos_section").set_value(name).run()
        assert not at.exception, f"{name}: {at.exception}"
        if name != "Measured on models":
            assert at.get("plotly_chart"), f"{name} shows no chart"
    at.radio(key="pos_section").set_value("Sinusoidal").run()
    at.slider(key="pos_sin_k").set_value(-37).run()
    shown = " ".join(m.value for m in at.markdown)
    assert "|M_k PE_p − PE_(p+k)|" in shown
    errors = [float(x) for x in __import__("re").findall(r"= \*\*([0-9.e+-]+)\*\*", shown)]
    assert len(errors) == 2 and max(errors) < 1e-12
    at.radio(key="pos_section").set_value("RoPE").run()
    at.slider(key="pos_rope_m").set_value(150).run()
    table = at.dataframe[0].value
    assert table["value"].iloc[0] == pytest.approx(table["value"].iloc[1], abs=1e-10)
    assert table["value"].iloc[0] == pytest.approx(table["value"].iloc[2], abs=1e-10)
    at.radio(key="pos_section").set_value("ALiBi").run()
    at.slider(key="pos_alibi_heads").set_value(64).run()
    at.slider(key="pos_alibi_head").set_value(63).run()
    at.slider(key="pos_alibi_heads").set_value(3).run()  # the chosen head must follow the smaller range
    assert not at.exception, at.exception
    assert at.slider(key="pos_alibi_head").value == 2


def test_page_measures_a_toy_bloom_beside_the_alibi_theory():
    """The page's 'Measured on models' tab, driven through AppTest: its per-layer lines are what an independent
    capture of the same text gives, a per-layer loop over the captured pattern."""
    import json

    from attnviz.capture import capture_attention
    from attnviz.models import load_model

    at = _page()
    at.radio(key="pos_section").set_value("Measured on models").run()
    assert not at.exception, at.exception
    n_charts = len(at.get("plotly_chart"))
    at.selectbox(key="pos_meas_model").set_value("toy-bloom-alibi").run()
    at.button(key="pos_meas_go").click().run()
    assert not at.exception, at.exception
    charts = at.get("plotly_chart")
    assert len(charts) == n_charts + 1
    traces = {t["name"]: t for t in json.loads(charts[-1].proto.spec)["data"]}
    text = at.text_area(key="pos_meas_text").value
    pattern = capture_attention(load_model("toy-bloom-alibi"), text).pattern  # [layer, head, query, key]
    n = pattern.shape[-1]
    for layer in range(pattern.shape[0]):
        expected = [np.mean([pattern[layer, h, i, i - r] for h in range(pattern.shape[1]) for i in range(r, n)])
                    for r in range(0, n, 37)]
        np.testing.assert_allclose(_values(traces[f"layer {layer}"]["y"])[::37], expected, rtol=1e-5)
    theory = _values(traces["ALiBi alone (theory)"]["y"])
    assert theory.shape == (n,) and theory[0] > theory[1] > theory[-1]
    at.toggle(key="pos_meas_skip").set_value(True).run()
    assert not at.exception, at.exception


@pytest.mark.slow
def test_page_measures_a_bidirectional_encoder_in_both_directions(minilm):
    """Issue 14: on minilm-l6 (a bidirectional BERT encoder) the page measured backward distances only and its
    caption spoke of a dotted line it did not draw. Now: signed distances from -(n - 1) to n - 1, each layer's
    line equal to BERT's attention rebuilt from its own weights in float64 (hidden states entering the layer,
    its query and key projections, softmax(q k^T / sqrt(d)), no mask) averaged by signed distance in a loop, and
    the dotted line the caption names is drawn: 1/n, uniform over all keys."""
    import json

    at = _page()
    at.radio(key="pos_section").set_value("Measured on models").run()
    at.selectbox(key="pos_meas_model").set_value("minilm-l6").run()
    at.button(key="pos_meas_go").click().run()
    assert not at.exception, at.exception
    spec = json.loads(at.get("plotly_chart")[-1].proto.spec)
    traces = {t["name"]: t for t in spec["data"]}
    text = at.text_area(key="pos_meas_text").value
    ids = minilm.tokenizer(text, return_tensors="pt")["input_ids"]
    n = ids.shape[1]
    bert = minilm.model
    with torch.no_grad():
        hidden = bert(ids, output_hidden_states=True).hidden_states  # hidden[l]: what layer l reads
    heads = bert.config.num_attention_heads
    d = bert.config.hidden_size // heads
    distances = np.arange(-(n - 1), n)
    np.testing.assert_array_equal(_values(traces["layer 0"]["x"]), distances)
    for layer in (0, len(bert.encoder.layer) - 1):
        attn = bert.encoder.layer[layer].attention.self
        h = hidden[layer][0].double()
        q = (h @ attn.query.weight.double().T + attn.query.bias.double()).view(n, heads, d).transpose(0, 1)
        k = (h @ attn.key.weight.double().T + attn.key.bias.double()).view(n, heads, d).transpose(0, 1)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), -1).numpy()  # [head, query, key]
        shown = _values(traces[f"layer {layer}"]["y"])
        for r in (-(n - 1), -20, -3, -1, 0, 1, 2, 9, n - 1):
            expected = np.mean([a[hh, i, i - r] for hh in range(heads) for i in range(n) if 0 <= i - r < n])
            assert shown[r + n - 1] == pytest.approx(expected, rel=1e-4), (layer, r)
    baseline = traces["uniform over all keys (no position)"]
    assert baseline["line"]["dash"] == "dot"
    np.testing.assert_allclose(_values(baseline["y"]), np.full(2 * n - 1, 1 / n))
    shown_text = " ".join(c.value for c in at.caption) + " ".join(m.value for m in at.markdown)
    for word, dash in (("dotted", "dot"), ("dashed", "dash")):  # every line a caption names is drawn
        if f"the {word} " in shown_text:
            assert any(t.get("line", {}).get("dash") == dash for t in spec["data"]), word
    assert "negative distances" in shown_text and "within 8 tokens either side" in shown_text
    assert "keys after the query are left out" not in shown_text
    at.toggle(key="pos_meas_skip").set_value(True).run()
    assert not at.exception, at.exception


@pytest.mark.slow
def test_apply_rope_reproduces_smollm2_layer0_attention(smollm2):
    """Rebuild smollm2-135m's first-layer pattern from its own projections with apply_rope and rope_settings,
    and compare it with the pattern captured from the model's eager forward pass."""
    from attnviz.capture import capture_attention

    capture = capture_attention(smollm2, "The cat sat on the mat, and then the dog sat on the cat.", layers=[0])
    model = smollm2.model.model
    config = smollm2.model.config
    d_head, base = S.rope_settings(config)
    assert (d_head, base) == (64, 100000.0)
    ids = torch.tensor([capture.token_ids])
    n = ids.shape[1]
    attn = model.layers[0].self_attn
    with torch.no_grad():
        h = model.layers[0].input_layernorm(model.embed_tokens(ids)).double()
        q = (h @ attn.q_proj.weight.double().T).view(1, n, -1, d_head).transpose(1, 2)  # [1, 9, n, 64]
        k = (h @ attn.k_proj.weight.double().T).view(1, n, -1, d_head).transpose(1, 2)  # [1, 3, n, 64]
    q, k = P.apply_rope(q, base=base), P.apply_rope(k, base=base)
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # GQA: query head h reads KV head h // 3
    scores = (q @ k.transpose(-1, -2) / math.sqrt(d_head))[0]
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    np.testing.assert_allclose(torch.softmax(scores, -1).numpy(), capture.pattern[0], atol=2e-4)



# ---------------------------------------------------------------- toy-lab models: learned or sinusoidal


@pytest.fixture(scope="module")
def lab_models(tmp_path_factory):
    """Two tiny toy-lab GPT-2s, trained 2 steps and saved to a temporary ATTNVIZ_CACHE_DIR: "pos-sinusoidal" with
    sinusoidal positions, "pos-learned" with learned ones. Their configs are the same; only lab.json tells them
    apart."""
    from attnviz.lab import LabConfig, LabRun

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNVIZ_CACHE_DIR", str(tmp_path_factory.mktemp("attnviz-cache")))
        for name, positional in (("pos-sinusoidal", "sinusoidal"), ("pos-learned", "learned")):
            run = LabRun(LabConfig(task="copy", positional=positional, steps=2, batch_size=4, segment_len=3,
                                   n_letters=4, n_layers=1, n_heads=2, d_model=16, eval_every=1))
            assert run.run().step == 2
            run.save(name)
        yield


def test_position_scheme_of_lab_models_reads_lab_json(lab_models, tmp_path):
    import json

    from transformers import GPT2Config, LlamaConfig

    from attnviz.models import lab_positional, load_model

    sin, learned = load_model("lab/pos-sinusoidal"), load_model("lab/pos-learned")
    # the configs cannot tell them apart...
    assert S.position_scheme(sin.model.config) == S.position_scheme(learned.model.config) == "other"
    # ...the weights show which is which: the sinusoidal table of Vaswani et al., written out with math.sin/cos
    wpe_sin = sin.model.transformer.wpe.weight.detach().double().numpy()
    np.testing.assert_allclose(wpe_sin, _pe_loop(wpe_sin.shape[0], wpe_sin.shape[1]), atol=1e-6)
    wpe_learned = learned.model.transformer.wpe.weight.detach().double().numpy()
    assert np.abs(wpe_learned - _pe_loop(*wpe_learned.shape)).max() > 0.5
    # ...and so does lab.json, which the model-aware functions read
    assert sin.shape.position == "sinusoidal"  # read once at load, from the folder's lab.json
    assert learned.shape.position == "learned"
    assert load_model("toy-gpt2").shape.position == "other"  # no folder, no lab.json
    # a local folder holding lab.json counts too; a missing or broken lab.json changes nothing
    assert lab_positional(tmp_path) is None and S.position_scheme(GPT2Config(), None) == "other"
    (tmp_path / "lab.json").write_text("{not json")
    assert lab_positional(tmp_path) is None
    (tmp_path / "lab.json").write_text(json.dumps({"config": {"positional": "sinusoidal"}}))
    assert lab_positional(tmp_path) == "sinusoidal"
    assert S.position_scheme(GPT2Config(), lab_positional(tmp_path)) == "sinusoidal"
    assert S.position_scheme(LlamaConfig(), "sinusoidal") == "rope"  # the config wins when it names RoPE


def test_page_measures_a_sinusoidal_lab_model_without_rope_or_alibi_theory(lab_models):
    """The 'Measured on models' tab on a sinusoidal toy-lab model: it says the positions are sinusoidal and added
    to the input, draws no RoPE or ALiBi curve, and its per-layer lines are what the model's own
    output_attentions give, averaged by distance in a loop."""
    import json

    from attnviz.models import load_model

    at = _page()
    at.radio(key="pos_section").set_value("Measured on models").run()
    at.selectbox(key="pos_meas_model").set_value("lab/pos-sinusoidal").run()
    text = "abcd=abcd abca"
    at.text_area(key="pos_meas_text").set_value(text).run()
    at.button(key="pos_meas_go").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    captions = " ".join(c.value for c in at.caption)
    assert "How lab/pos-sinusoidal encodes position: sinusoidal" in captions
    assert "no theory curve is drawn" in captions and "RoFormer bound for" not in captions
    traces = {t["name"]: t for t in json.loads(at.get("plotly_chart")[-1].proto.spec)["data"]}
    assert not any("ALiBi" in name or "RoFormer" in name for name in traces), list(traces)
    loaded = load_model("lab/pos-sinusoidal")
    ids = loaded.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        attentions = loaded.model(ids, output_attentions=True).attentions  # per layer [1, head, query, key]
    n = ids.shape[1]
    for layer, a in enumerate(attentions):
        a = a[0].double().numpy()
        expected = [np.mean([a[h, i, i - r] for h in range(a.shape[0]) for i in range(r, n)]) for r in range(n)]
        np.testing.assert_allclose(_values(traces[f"layer {layer}"]["y"]), expected, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- the identities the page shows


@pytest.mark.parametrize("p,k", [(10, 5), (120, 5), (3, -12), (0, 2.5)])
def test_shift_identity_against_the_paper_formula_by_loop(p, k):
    d = 16
    mapped, direct, err = P.shift_identity(p, k, d, 10000.0)
    for i in range(d // 2):  # PE(p + k) written out with math.sin / math.cos, negative positions included
        assert direct[2 * i] == pytest.approx(math.sin((p + k) / 10000.0 ** (2 * i / d)), abs=1e-12)
        assert direct[2 * i + 1] == pytest.approx(math.cos((p + k) / 10000.0 ** (2 * i / d)), abs=1e-12)
    np.testing.assert_allclose(mapped, direct, atol=1e-12)
    assert err == pytest.approx(float(np.abs(mapped - direct).max())) and err < 1e-12


def test_rope_identity_by_complex_numbers():
    """RoFormer's form: pair i is the complex number x_2i + i x_2i+1, rotated by e^(i m theta_i); the score is
    Re sum_i (q_i e^(i m theta_i)) conj(k_i e^(i n theta_i))."""
    rng = np.random.default_rng(5)
    q, k = rng.standard_normal((2, 12))
    m, n, base = 7, 30, 500.0
    theta = [base ** (-2 * i / 12) for i in range(6)]

    def score(a, b):
        return sum((complex(q[2 * i], q[2 * i + 1]) * cmath.exp(1j * a * theta[i]) *
                    (complex(k[2 * i], k[2 * i + 1]) * cmath.exp(1j * b * theta[i])).conjugate()).real
                   for i in range(6))

    out = P.rope_identity(q, k, m, n, base)
    assert out["rotated"] == pytest.approx(score(m, n), abs=1e-12)
    assert out["relative"] == pytest.approx(score(0, n - m), abs=1e-12)
    assert out["shifted"] == pytest.approx(score(m + 1000, n + 1000), abs=1e-9)
    assert out["plain"] == pytest.approx(float(q @ k), abs=1e-12)
    assert out["norm_rotated_q"] == pytest.approx(out["norm_q"], abs=1e-12)


def test_layouts_agree_and_would_not_without_the_permutation():
    x = np.random.default_rng(2).standard_normal((3, 8))
    assert P.layouts_agree(x, 17, 100.0) < 1e-12
    # without the reordering the two layouts differ: the check can fail
    assert np.abs(P.apply_rope(x, [17], 100.0) - P.apply_rope(x, [17], 100.0, interleaved=True)).max() > 0.1


def test_each_rope_tab_draws_its_own_chart_only():
    """The RoPE section's tabs run only the open tab's code: each tab, opened as a click would, draws its one chart
    (told apart by its title) and none of the others'."""
    titles = {"Rotation and the identity": "R_m q", "Long-term decay": "relative upper bound",
              "Two layouts of the same rotation": "rotate_half"}
    at = _page()
    at.radio(key="pos_section").set_value("RoPE").run()
    for label, title in titles.items():
        at.session_state["pos_rope_tab"] = label
        at.run()
        assert not at.exception, at.exception
        specs = [chart.proto.spec for chart in at.get("plotly_chart")]
        assert len(specs) == 1 and title in specs[0], (label, len(specs))
        assert not any(other in specs[0] for other in titles.values() if other != title), label


@pytest.mark.parametrize("m", [0, 3, 100, 200])
def test_the_rope_charts_position_sliders_span_the_window_around_m_and_draw_apply_rope_there(m):
    """The page's two RoPE charts carry 2 ROPE_REACH + 1 consecutive positions around m (shifted in at the ends),
    drawn at m; each stop of the rotation chart draws the q pair that apply_rope gives at that position."""
    from attnviz.figures import instant
    from attnviz.ui import positional as ui_pos

    positions, bases, reach = tuple(range(201)), (100.0, 10000.0), ui_pos.ROPE_REACH
    start = min(max(m - reach, 0), 200 - 2 * reach)
    window = list(range(start, start + 2 * reach + 1))
    assert ui_pos.rope_window(positions, m) == window
    rotation = ui_pos.rope_rotation_chart.__wrapped__(16, 10000.0, 2, 5, m, 10, positions, bases)
    layouts = ui_pos.rope_layouts_chart.__wrapped__(8, 10000.0, m, positions)
    for fig in (rotation, layouts):
        steps = fig.layout.sliders[0].steps
        assert [s.label for s in steps] == [str(p) for p in window]
        assert fig.layout.sliders[0].active == window.index(m)
    q, _ = ui_pos.rope_qk(16, 5)
    fig = instant.figure_dict(rotation)
    for i, p in enumerate(window):
        state = instant.drawn(fig, [(0, i), (1, bases.index(10000.0))])
        arrow = next(t for t in state["data"] if t.get("name") == f"R_m q (m = {p})" and instant.shown(t))
        tip = P.apply_rope(q[None], [p], 10000.0, interleaved=True)[0, 4:6]
        np.testing.assert_allclose(instant.array(arrow["x"]), [0.0, tip[0]], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(instant.array(arrow["y"]), [0.0, tip[1]], rtol=1e-12, atol=1e-15)


def test_a_rope_control_moved_builds_its_next_charts_in_the_background(monkeypatch):
    """After d_head moved up to 64, the rotation charts of d_head 128 then 32 are built (the pair clamped where it
    does not fit, as the page clamps it); after m moved down, m - 1 then m + 1; nothing on a first run or when
    nothing moved."""
    from attnviz.ui import positional as ui_pos

    asked = []
    monkeypatch.setattr(ui_pos.ui, "build_in_background", lambda cached, calls, name: asked.append((cached, calls)))
    bases, positions, dims = (100.0, 10000.0), tuple(range(201)), [8, 16, 32, 64, 128]
    now = {"d_head": 64, "base": 10000.0, "pair": 20, "seed": 0, "m": 3, "n": 10}
    ui_pos.prefetch_rotation(now, {**now, "d_head": 32}, dims, bases, positions)
    assert asked[-1][0] is ui_pos.rope_rotation_chart
    assert asked[-1][1] == [(128, 10000.0, 20, 0, 3, 10, positions, bases), (32, 10000.0, 15, 0, 3, 10, positions,
                                                                               bases)]
    ui_pos.prefetch_rotation(now, {**now, "m": 4}, dims, bases, positions)
    assert [call[4] for call in asked[-1][1]] == [2, 4]
    ui_pos.prefetch_rotation({**now, "m": 200}, {**now, "m": 199}, dims, bases, positions)  # the slider's end
    assert [call[4] for call in asked[-1][1]] == [199]
    asked.clear()
    ui_pos.prefetch_rotation(now, None, dims, bases, positions)
    assert asked == []
    ui_pos.prefetch_rotation(now, now, dims, bases, positions)
    assert asked[-1][1] == []


def test_a_sinusoid_or_compare_control_moved_builds_its_next_charts_in_the_background(monkeypatch):
    """The Sinusoidal and Compare sections' charts one step either way of the control just moved, as argument tuples
    in the cached functions' own order (a tuple out of order would build another setting's chart); nothing on a
    first run."""
    from attnviz.ui import positional as ui_pos

    asked = []
    monkeypatch.setattr(ui_pos.ui, "build_in_background", lambda cached, calls, name: asked.append((cached, calls)))
    d_models, slopes = (8, 16, 32, 64), (0.5, 0.25, 0.125)
    now = {"n_pos": 100, "d_model": 64, "base": 10000.0}
    steps = {"n_pos": list(range(8, 513, 4)), "d_model": list(d_models), "base": [100.0, 10000.0]}
    ui_pos.prefetch_sinusoid(now, {**now, "n_pos": 96}, steps, d_models)
    assert asked[-1] == (ui_pos.sinusoid_charts, [(104, 64, 10000.0, d_models), (96, 64, 10000.0, d_models)])
    cmp = {"d": 64, "n": 128, "base": 10000.0, "slope": 0.25, "seed": 3, "same": True}
    cmp_steps = {"d": [32, 64, 128], "n": list(range(8, 1025, 8)), "base": [10000.0], "slope": list(slopes),
                 "seed": (0, 10_000)}
    ui_pos.prefetch_compare(cmp, {**cmp, "seed": 4}, cmp_steps, slopes)
    assert asked[-1] == (ui_pos.compare_chart, [(64, 128, 10000.0, 0.25, 2, True, slopes),
                                                (64, 128, 10000.0, 0.25, 4, True, slopes)])
    asked.clear()
    ui_pos.prefetch_sinusoid(now, None, steps, d_models)
    ui_pos.prefetch_compare(cmp, None, cmp_steps, slopes)
    assert asked == []
