"""attnviz.distance: attention against query-key distance, dense and read from a capture a block at a time."""

import numpy as np
import pytest

from attnviz import distance as D

RNG = np.random.default_rng(0)


def test_attention_by_distance_against_a_loop():
    pattern = RNG.random((2, 3, 6, 8))  # [layer, head, query, key], queries are the last 6 of 8 positions
    out = D.attention_by_distance(pattern)
    per_head = D.attention_by_distance(pattern, per_head=True)
    assert out.shape == (2, 6) and per_head.shape == (2, 3, 6)
    for layer in range(2):
        for r in range(6):
            vals = [pattern[layer, h, i, i + 2 - r] for h in range(3) for i in range(r, 6)]
            assert out[layer, r] == pytest.approx(np.mean(vals))
    np.testing.assert_allclose(per_head.mean(axis=1), out)
    assert D.attention_by_distance(pattern, max_distance=2).shape == (2, 3)
    np.testing.assert_allclose(D.attention_by_distance(pattern[0]), out[0])
    skipped = D.attention_by_distance(pattern, exclude_keys=3)  # keys 0..2 left out: queries see keys 3..7
    assert skipped.shape == (2, 5)
    for r in range(5):
        vals = [pattern[0, h, i, i + 2 - r] for h in range(3) for i in range(6) if i + 2 - r >= 3 and i >= r]
        assert skipped[0, r] == pytest.approx(np.mean(vals))
    with pytest.raises(ValueError):
        D.attention_by_distance(pattern, exclude_keys=8)


@pytest.mark.parametrize("n_query,n_key,skip", [(6, 6, 0), (6, 6, 2), (5, 8, 0), (5, 8, 3), (1, 4, 1)])
def test_attention_by_signed_distance_against_a_loop(n_query, n_key, skip):
    """Both directions, r = query position - key position in [-(n_query - 1), n_key - 1]: a loop over every
    (head, query, key) pair, grouped by r; its r >= 0 half is attention_by_distance's."""
    pattern = RNG.random((2, 3, n_query, n_key))
    offset = n_key - n_query  # query i sits at position i + offset
    distances, out = D.attention_by_signed_distance(pattern, exclude_keys=skip)
    _, per_head = D.attention_by_signed_distance(pattern, per_head=True, exclude_keys=skip)
    assert distances.tolist() == list(range(-(n_query - 1), n_key))
    assert out.shape == (2, len(distances)) and per_head.shape == (2, 3, len(distances))
    for layer in range(2):
        for index, r in enumerate(distances):
            vals = [pattern[layer, h, i, j] for h in range(3) for i in range(n_query) for j in range(skip, n_key)
                    if i + offset - j == r]
            if vals:
                assert out[layer, index] == pytest.approx(np.mean(vals), rel=1e-12)
            else:
                assert np.isnan(out[layer, index])
    np.testing.assert_allclose(per_head.mean(axis=1), out)
    np.testing.assert_allclose(D.attention_by_signed_distance(pattern[0], exclude_keys=skip)[1], out[0])
    if n_query == n_key:  # a capture's pattern: the r >= 0 half is attention_by_distance
        back = D.attention_by_distance(pattern, exclude_keys=skip)
        np.testing.assert_allclose(out[:, distances >= 0][:, : back.shape[1]], back, rtol=1e-12)


@pytest.mark.parametrize("n,skip", [(1, 0), (7, 0), (7, 1), (12, 5)])
def test_uniform_bidirectional_baseline_is_flat(n, skip):
    uniform = np.full((1, n, n), 1.0 / n)  # every query spreads its weight evenly over all n keys
    distances, expected = D.attention_by_signed_distance(uniform, exclude_keys=skip)
    got_distances, got = D.uniform_bidirectional_by_distance(n, exclude_keys=skip)
    np.testing.assert_array_equal(got_distances, distances)
    np.testing.assert_allclose(got, expected, rtol=1e-12)  # NaN where no pair is left, in both
    assert np.nanmax(got) == np.nanmin(got) == pytest.approx(1 / n)


def test_uniform_causal_baseline():
    n = 10
    pattern = np.array([[1 / (i + 1) if j <= i else 0.0 for j in range(n)] for i in range(n)])
    np.testing.assert_allclose(D.uniform_causal_pattern(n), pattern)
    np.testing.assert_allclose(D.uniform_causal_by_distance(n), D.attention_by_distance(pattern[None]))
    assert D.uniform_causal_by_distance(n)[-1] == pytest.approx(1 / n)
    for skip in (1, 3):
        np.testing.assert_allclose(D.uniform_causal_by_distance(n, exclude_keys=skip),
                                   D.attention_by_distance(pattern[None], exclude_keys=skip))


def test_uniform_window_baseline():
    """Under a sliding window w each query spreads 1/min(i+1, w) over its last keys: the loop's pattern, measured."""
    n, w = 12, 4
    pattern = np.array([[1 / min(i + 1, w) if i - w < j <= i else 0.0 for j in range(n)] for i in range(n)])
    for skip in (0, 2):
        np.testing.assert_allclose(D.uniform_causal_by_distance(n, exclude_keys=skip, window=w),
                                   D.attention_by_distance(pattern[None], exclude_keys=skip), atol=1e-15)


def test_measured_profile_draws_each_layer_kind_against_its_own_theory(tmp_path):
    """A Gemma 3 with a sliding layer (window 8, RoPE base 1e4) and a full one (base 1e6): each layer is grouped by
    its kind, each mask gets its own position-free baseline (the uniform pattern under transformers' mask, as the
    capture recorded it) and each base its own RoFormer bound, from the config's per-type rope_parameters."""
    from attnviz import positional as P
    from attnviz.capture import capture_attention
    from attnviz.models import load_model
    from tests.families import build_family

    loaded = load_model(str(build_family("gemma3_text", tmp_path)))
    config = loaded.model.config
    cap = capture_attention(loaded, "The cat sat on the mat and the dog too, by the door of the house.")
    prof = D.measured_profile(cap, loaded.shape)
    window, n = config.sliding_window, cap.n_tokens
    assert config.layer_types == ["sliding_attention", "full_attention"] and n > 2 * window
    assert prof.groups == [f"sliding window {window}, RoPE base 10000", "causal, RoPE base 1e+06"]
    names = (f"uniform over the last {window} keys (no position)", "uniform causal (no position)")
    for layer, name in enumerate(names):
        visible = cap.inputs[layer].mask.rows(0, n).astype(float)
        uniform = visible / visible.sum(1, keepdims=True)
        np.testing.assert_allclose(prof.baselines[name], D.attention_by_distance(uniform[None]), atol=1e-12)
        assert prof.curve_groups[name] == prof.groups[layer]
    assert len(prof.relative) == 2
    for layer, kind in enumerate(config.layer_types):
        base = config.rope_parameters[kind]["rope_theta"]
        bound = P.rope_decay_bound(prof.distances, config.head_dim, base)
        (name,) = [name for name in prof.relative if f"base {base:g} " in name]
        np.testing.assert_allclose(prof.relative[name], bound / bound[0])
        assert prof.curve_groups[name] == prof.groups[layer]
    assert (prof.per_layer[0, window:] == 0).all() and (prof.per_layer[1, window:] > 0).all()


@pytest.mark.parametrize("name,text", [
    ("toy-llama-gqa", "The cat sat on the mat. The cat sat on the mat. A dog ran past the gate."),
    ("toy-bloom-alibi", "Seven silver swans swam south; seven more swam north."),
    ("minilm-l6", "An encoder sees both sides of every token in this sentence."),
])
@pytest.mark.parametrize("skip", [0, 2])
def test_capture_by_distance_equals_the_dense_averages_in_both_stores(name, text, skip):
    """Read a block of rows at a time (block sizes that do not divide n, and one larger than n), from the dense
    store and from q and k alone, the averages equal those of the whole [layer, head, query, key] pattern."""
    from attnviz.capture import capture_attention, records_inputs
    from attnviz.models import load_model

    loaded = load_model(name)
    dense = capture_attention(loaded, text)
    stores = [dense] + ([capture_attention(loaded, text, store="qk")] if records_inputs(loaded.model) else [])
    want = D.attention_by_distance(dense.pattern, per_head=True, exclude_keys=skip)
    want_r, want_signed = D.attention_by_signed_distance(dense.pattern, per_head=True, exclude_keys=skip)
    for cap in stores:
        for block in (5, 7, 1000):
            got = D.capture_by_distance(cap, per_head=True, exclude_keys=skip, block=block)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
            r, signed = D.capture_by_distance(cap, signed=True, per_head=True, exclude_keys=skip, block=block)
            np.testing.assert_array_equal(r, want_r)
            np.testing.assert_allclose(signed, want_signed, rtol=1e-5, atol=1e-7)  # NaN where no pair, in both
        np.testing.assert_allclose(D.capture_by_distance(cap, exclude_keys=skip), want.mean(axis=1), rtol=1e-5,
                                   atol=1e-7)


def test_measured_profile_picks_the_theory_of_the_scheme():
    """ALiBi's closed form for BLOOM (the heads' own slopes), RoPE's bound for Llama with the model's head_dim and
    base over its value at 0, none for GPT-2; the locality is the per-head weight within 8 tokens back."""
    from attnviz import positional as P
    from attnviz.capture import capture_attention
    from attnviz.models import load_model

    text = "one two three four five six seven eight nine ten eleven twelve"
    bloom = load_model("toy-bloom-alibi")
    cap = capture_attention(bloom, text)
    prof = D.measured_profile(cap, bloom.shape)
    np.testing.assert_allclose(prof.theory, P.alibi_by_distance(bloom.model.config.n_head, cap.n_tokens))
    assert prof.relative == {}
    per_head = D.attention_by_distance(cap.pattern, per_head=True)
    np.testing.assert_allclose(prof.near, per_head[..., 1:9].sum(-1), rtol=1e-6)
    llama = load_model("toy-llama-gqa")
    cap = capture_attention(llama, text)
    prof = D.measured_profile(cap, llama.shape, exclude_keys=1)
    d = llama.model.config.hidden_size // llama.model.config.num_attention_heads
    base = llama.model.config.rope_parameters["rope_theta"]
    bound = P.rope_decay_bound(prof.distances, d, base)
    (relative,) = prof.relative.values()
    np.testing.assert_allclose(relative, bound / bound[0])
    assert prof.theory is None and "RoFormer" in prof.theory_note
    np.testing.assert_allclose(prof.per_layer, D.attention_by_distance(cap.pattern, exclude_keys=1), rtol=1e-6)
    # the locality counts every key, whatever is left out of the curves
    np.testing.assert_allclose(prof.near, D.attention_by_distance(cap.pattern, per_head=True)[..., 1:9].sum(-1),
                               rtol=1e-6)
    gpt2 = load_model("toy-gpt2")
    prof = D.measured_profile(capture_attention(gpt2, text), gpt2.shape)
    assert prof.theory is None and prof.relative == {} and "not RoPE or ALiBi" in prof.theory_note
