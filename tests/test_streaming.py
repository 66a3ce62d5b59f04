"""attnviz.streaming: StreamingLLM's eviction experiment, one masked pass against the literal rolling cache and
the model's own loss."""

import math

import numpy as np
import pytest
import torch

from attnviz import streaming, streaming_pass
from attnviz.streaming import (cache_positions, perplexity, rolling_cache_token_losses, rolling_mean,
                               streaming_experiment, streaming_token_losses, window_mask)


def test_window_mask_and_cache_positions_match_the_definition():
    n, w, s = 11, 4, 2
    mask = window_mask(n, w, s)
    for t in range(n):
        for j in range(n):
            assert mask[t, j] == (j <= t and (t - j < w or j < s))
    np.testing.assert_array_equal(window_mask(n, None), np.tril(np.ones((n, n), dtype=bool)))
    # A cache of s + w slots: a query sits at its text position until the cache is full, then in the last slot.
    assert list(cache_positions(n, w, s)) == [min(t, s + w - 1) for t in range(n)]


def test_rolling_mean():
    v = np.array([1.0, 3.0, 5.0, 7.0])
    np.testing.assert_allclose(rolling_mean(v, 2), [1.0, 2.0, 4.0, 6.0])


@pytest.fixture(scope="module")
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         rope_theta=100.0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper attention than the default init, so positions matter
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
            layer.self_attn.k_proj.weight.mul_(8.0)
    return model


def _hf_token_losses(model, ids):
    """Per-token cross-entropy from the model's own forward (transformers' attention and RoPE)."""
    with torch.no_grad():
        out = model(ids[None], labels=ids[None])
    per_token = torch.nn.functional.cross_entropy(out.logits[0, :-1].double(), ids[1:], reduction="none")
    return per_token.numpy(), out.loss.item()


def test_full_attention_equals_the_models_own_loss(tiny_llama):
    ids = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(1))
    ours = streaming_token_losses(tiny_llama, ids)
    theirs, mean_loss = _hf_token_losses(tiny_llama, ids)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert ours.mean() == pytest.approx(mean_loss, abs=1e-5)
    # A window longer than the text evicts nothing: the same numbers.
    np.testing.assert_allclose(streaming_token_losses(tiny_llama, ids, window=64, n_sinks=4), theirs, atol=1e-5)


@pytest.mark.parametrize("n_sinks", [0, 2])
def test_one_masked_pass_equals_the_rolling_cache(tiny_llama, n_sinks):
    ids = torch.randint(0, 64, (30,), generator=torch.Generator().manual_seed(2))
    rolling = rolling_cache_token_losses(tiny_llama, ids, window=5, n_sinks=n_sinks)
    for chunk in (4, 7, 256):  # chunking is an implementation detail: any size gives the same losses
        one_pass = streaming_token_losses(tiny_llama, ids, window=5, n_sinks=n_sinks, query_chunk=chunk)
        np.testing.assert_allclose(one_pass, rolling, atol=1e-5)
    original = streaming_token_losses(tiny_llama, ids, window=5, n_sinks=n_sinks, positions="original")
    if n_sinks == 0:
        np.testing.assert_allclose(original, rolling, atol=1e-5)  # RoPE is relative: nothing moves
    else:
        # The sinks' distance differs once the cache is full (t > n_sinks + window - 1), and only then.
        full = n_sinks + 5
        np.testing.assert_allclose(original[:full - 1], rolling[:full - 1], atol=1e-5)
        assert np.abs(original[full:] - rolling[full:]).max() > 1e-3


def test_rolling_cache_without_eviction_is_full_attention(tiny_llama):
    ids = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(3))
    theirs, _ = _hf_token_losses(tiny_llama, ids)
    np.testing.assert_allclose(rolling_cache_token_losses(tiny_llama, ids, window=12), theirs, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_gemma3():
    """Gemma 3's shape in small: sliding layers (window 6, RoPE base 10) around a full one (base 1000), 4 query heads
    on 1 KV head, QK-norm and the norms around each block."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    rope = {"full_attention": {"rope_type": "default", "rope_theta": 1000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}}
    config = Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=8, query_pre_attn_scalar=8,
                              sliding_window=6, layer_types=["sliding_attention", "full_attention",
                                                             "sliding_attention"],
                              max_position_embeddings=128, rope_parameters=rope, attn_implementation="eager")
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():  # QK-norm undoes any scaling of q_proj: sharpen through the norms' weights
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.fill_(2.0)
            layer.self_attn.k_norm.weight.fill_(2.0)
    return model


def test_gemma3_full_attention_equals_the_models_own_loss(tiny_gemma3):
    """Past the sliding window (30 tokens, window 6): the one pass's sliding rule, per-kind RoPE and norms against
    transformers' own Gemma 3; the rolling cache without eviction likewise."""
    ids = torch.randint(0, 64, (30,), generator=torch.Generator().manual_seed(5))
    theirs, _ = _hf_token_losses(tiny_gemma3, ids)
    np.testing.assert_allclose(streaming_token_losses(tiny_gemma3, ids), theirs, atol=1e-5)
    np.testing.assert_allclose(streaming_token_losses(tiny_gemma3, ids, query_chunk=4), theirs, atol=1e-5)
    np.testing.assert_allclose(rolling_cache_token_losses(tiny_gemma3, ids, window=30), theirs, atol=1e-5)
    assert tiny_gemma3.model.layers[0].self_attn.sliding_window == 6
    # A StreamingLLM window holding the whole text evicts nothing: the sliding layers keep their own rule.
    np.testing.assert_allclose(streaming_token_losses(tiny_gemma3, ids, window=30, n_sinks=2), theirs, atol=1e-5)


@pytest.mark.parametrize("window, n_sinks", [(4, 0), (4, 2), (9, 2), (3, 4)])
def test_gemma3_one_masked_pass_equals_the_rolling_cache(tiny_gemma3, window, n_sinks):
    """Windows inside and beyond the sliding layers' 6: with 9 + 2 slots a sliding layer loses the sinks once the
    query's slot is 6 or more past them, in both computations."""
    ids = torch.randint(0, 64, (24,), generator=torch.Generator().manual_seed(6))
    rolling = rolling_cache_token_losses(tiny_gemma3, ids, window=window, n_sinks=n_sinks)
    for chunk in (5, 256):
        one_pass = streaming_token_losses(tiny_gemma3, ids, window=window, n_sinks=n_sinks, query_chunk=chunk)
        np.testing.assert_allclose(one_pass, rolling, atol=1e-5)


def test_window_mask_on_a_sliding_layer_matches_the_definition():
    """Loops over the rule in the module docstring: in the cache, a window key is t - j slots behind the query, a
    sink p_t - j (p_t = min(t, s + w - 1)) or t - j with positions="original"; a sliding layer reads under L."""
    n, w, s, layer = 14, 5, 2, 6
    for positions in ("cache", "original"):
        mask = window_mask(n, w, s, layer_window=layer, positions=positions)
        for t in range(n):
            slot = min(t, s + w - 1) if positions == "cache" else t
            for j in range(n):
                in_window = t - w < j <= t
                behind = t - j if in_window else slot - j
                assert mask[t, j] == ((in_window or j < s) and j <= t and behind < layer), (positions, t, j)
    full = window_mask(n, None, layer_window=layer)
    assert all(full[t, j] == (0 <= t - j < layer) for t in range(n) for j in range(n))


def test_experiment_rejects_impossible_sizes(tiny_llama):
    with pytest.raises(ValueError):
        streaming_experiment(tiny_llama, torch.tensor([1]), window=4)
    with pytest.raises(ValueError):
        streaming_experiment(tiny_llama, torch.arange(10), window=0)


def test_perplexity_is_exp_mean_loss():
    assert perplexity([1.0, 2.0, 3.0]) == pytest.approx(math.exp(2.0))


def test_shipped_text_is_long_enough_and_sourced(smollm2):
    text = streaming.shipped_text()
    assert len(smollm2.tokenizer(text)["input_ids"]) >= 2000
    readme = (streaming.STREAMING_TEXT.parent / "README.md").read_text()
    assert "public domain" in readme.lower() and streaming.STREAMING_TEXT.name in readme


def test_smollm2_eviction_experiment_on_a_short_text(smollm2):
    ids = torch.as_tensor(smollm2.tokenizer(streaming.shipped_text())["input_ids"][:120])
    result = streaming_experiment(smollm2.model, ids, window=16, n_sinks=4)
    full, window_only, with_sinks = (result.perplexity[name] for name in streaming.SETTINGS)
    assert all(math.isfinite(p) and p > 1 for p in (full, window_only, with_sinks))
    assert window_only != pytest.approx(with_sinks, rel=1e-3)
    assert window_only > with_sinks  # StreamingLLM's finding; on this text the gap is large
    theirs, mean_loss = _hf_token_losses(smollm2.model, ids)
    np.testing.assert_allclose(result.losses[streaming.SETTINGS[0]], theirs, atol=1e-4)
    assert math.log(full) == pytest.approx(mean_loss, abs=1e-4)
    # Before anything is evicted (the first `window` tokens) the three settings read the same keys.
    for name in streaming.SETTINGS[1:]:
        np.testing.assert_allclose(result.losses[name][:15], theirs[:15], atol=1e-4)


def _result(full, window_only, with_sinks, *, window=256, n_sinks=4, n=2000):
    """A StreamingResult whose per-token losses are constant, so each perplexity is exactly the one asked for."""
    losses = {name: np.full(n - 1, math.log(p))
              for name, p in zip(streaming.SETTINGS, (full, window_only, with_sinks))}
    return streaming.StreamingResult.from_losses(window, n_sinks, losses)


def test_describe_experiment_says_what_the_numbers_show():
    r = _result(20.0, 50.0, 20.5)
    assert r.perplexity[streaming.SETTINGS[1]] == pytest.approx(50.0)
    said = streaming.describe_experiment(r, "M")
    assert "20.00" in said and "50.00" in said and "20.50" in said and "2.50×" in said
    assert "StreamingLLM's finding holds" in said and "98%" in said  # (50 - 20.5) / (50 - 20) by hand
    assert "edges out" in streaming.describe_experiment(_result(20.0, 50.0, 19.9))
    assert "barely hurts" in streaming.describe_experiment(_result(20.0, 20.5, 20.2))
    assert "50%" in streaming.describe_experiment(_result(20.0, 40.0, 30.0))
    assert "does not repair" in streaming.describe_experiment(_result(20.0, 40.0, 41.0))
    assert "nothing is evicted" in streaming.describe_experiment(_result(20.0, 20.0, 20.0, window=4096))
    assert "no sink tokens" in streaming.describe_experiment(_result(20.0, 40.0, 40.0, n_sinks=0))


def test_page_runs_the_experiment_on_a_short_text(monkeypatch, smollm2):
    """The button path of app_pages/sinks.py, on the first ~100 tokens of the shipped text so it stays quick."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    short = streaming.shipped_text()[:450]
    monkeypatch.setattr(streaming, "shipped_text", lambda: short)
    page = Path(__file__).resolve().parent.parent / "app_pages" / "sinks.py"
    at = AppTest.from_file(str(page), default_timeout=300)
    at.run()
    assert not at.exception, at.exception
    at.select_slider(key="sinks_window").set_value(32)
    at.button(key="sinks_run").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    labels = [m.label for m in at.metric]
    assert [f"({abc}) {name}: perplexity" for abc, name in zip("abc", streaming.SETTINGS)] == labels
    said = " ".join(md.value for md in at.markdown)
    assert "What SmolLM2 shows" in said and "window of 32" in said


def test_experiment_refuses_a_model_it_cannot_run():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=16, n_positions=32)).eval()
    with pytest.raises(ValueError, match="Llama"):
        streaming_token_losses(gpt2, torch.arange(8), window=4)




def test_the_models_rope_rotation_equals_attnviz_positional_apply_rope(tiny_llama):
    """The single pass and the rolling cache rotate with the model's own rotary embedding; that rotation is the
    RoFormer one that attnviz.positional.apply_rope computes in float64 from the base alone."""
    from attnviz.positional import apply_rope

    x = torch.randn(1, 4, 10, 8, generator=torch.Generator().manual_seed(4))  # [b, head, n, d_head]
    positions = torch.tensor([[0, 3, 1, 7, 2, 9, 5, 4, 8, 6]])
    cos, sin = tiny_llama.model.rotary_emb(x, positions)
    ours = streaming_pass.rotate(x, cos, sin)
    theirs = apply_rope(x.double(), positions[0].double(), base=100.0)
    torch.testing.assert_close(ours.double(), theirs, atol=1e-5, rtol=0)
