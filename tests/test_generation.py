import dataclasses

import numpy as np
import pytest
import torch

from attnviz import generation as gen
from attnviz.cost import kv_cache_bytes
from attnviz.models import load_model

PROMPT = "The cat sat on the mat. The cat"


def _whole_text_pattern(model, ids):
    """transformers' own attentions (output_attentions) of one forward pass over the whole generated text, no
    cache: [layer, head, query, key]."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False, output_attentions=True)
    return np.stack([a[0].float().numpy() for a in out.attentions])


@pytest.mark.parametrize("name", ["toy-gpt2", "toy-llama-gqa", "toy-bloom-alibi"])
@pytest.mark.parametrize("temperature", [0.0, 1.3])
def test_rows_during_generation_equal_one_forward_pass_over_the_whole_text(name, temperature):
    loaded = load_model(name)
    out = gen.generate(loaded, PROMPT, 12, temperature=temperature, seed=3, stop_at_eos=False)
    assert out.n_generated == 12 and len(out.token_ids) == out.n_prompt + 12
    whole = _whole_text_pattern(loaded.model, out.token_ids)
    for i, step in enumerate(out.steps):
        assert step.position == out.n_prompt - 1 + i
        np.testing.assert_allclose(step.rows, whole[:, :, step.position, :step.position + 1], atol=1e-5, rtol=0)
        np.testing.assert_allclose(step.rows.sum(-1), 1.0, atol=1e-5)


def test_smollm2_rows_during_generation_equal_the_whole_text_pass(smollm2):
    out = gen.generate(smollm2, "The capital of France is", 6)
    whole = _whole_text_pattern(smollm2.model, out.token_ids)
    for step in out.steps:
        np.testing.assert_allclose(step.rows, whole[:, :, step.position, :step.position + 1], atol=1e-5, rtol=0)


def test_greedy_picks_the_argmax_of_the_model_on_the_text_so_far_and_top_k_is_its_softmax():
    loaded = load_model("toy-gpt2")
    out = gen.generate(loaded, PROMPT, 6, k=4)
    with torch.no_grad():
        logits = loaded.model(input_ids=torch.tensor([out.token_ids]), use_cache=False).logits[0].double()
    for i, step in enumerate(out.steps):
        p = torch.softmax(logits[step.position], -1)
        assert step.chosen == out.token_ids[out.n_prompt + i] == int(p.argmax())
        order = torch.argsort(p, descending=True)[:4]
        assert list(step.top_ids) == order.tolist()
        np.testing.assert_allclose(step.top_probs, p[order].numpy(), atol=1e-6)
        assert step.chosen_prob == pytest.approx(float(p[step.chosen]), abs=1e-6)


def test_sampling_is_reproducible_with_a_seed_and_differs_across_seeds():
    loaded = load_model("toy-gpt2")
    a = gen.generate(loaded, PROMPT, 16, temperature=2.0, seed=1, stop_at_eos=False)
    b = gen.generate(loaded, PROMPT, 16, temperature=2.0, seed=1, stop_at_eos=False)
    c = gen.generate(loaded, PROMPT, 16, temperature=2.0, seed=2, stop_at_eos=False)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_cache_grows_by_one_token_a_step_with_the_size_the_cost_formula_gives():
    loaded = load_model("toy-llama-gqa")
    out = gen.generate(loaded, PROMPT, 5, stop_at_eos=False)
    s = loaded.shape
    for i, step in enumerate(out.steps):
        assert step.cache_tokens == out.n_prompt + i
        assert step.cache_bytes == kv_cache_bytes(layers=s.layers, kv_heads=s.kv_heads, head_dim=s.head_dim,
                                                  seq_len=step.cache_tokens, bytes_per_value=4)


class _OneToken:
    """A tokenizer that turns any prompt into its last token only (the toys' own add a BOS token)."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __call__(self, text, **kwargs):
        out = self._tokenizer(text, **kwargs)
        out["input_ids"] = out["input_ids"][-1:]
        return out

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def test_a_one_token_prompt_and_stopping():
    loaded = load_model("toy-gpt2")
    one = _OneToken(loaded.tokenizer)
    out = gen.generate(dataclasses.replace(loaded, tokenizer=one), "a", 4, stop_at_eos=False)
    assert out.n_prompt == 1 and out.n_generated == 4  # no cache to fill before the first step
    whole = _whole_text_pattern(loaded.model, out.token_ids)
    np.testing.assert_allclose(out.steps[-1].rows, whole[:, :, 3, :4], atol=1e-5, rtol=0)
    calls = []
    stopped = gen.generate(loaded, PROMPT, 10, should_stop=lambda: len(calls) >= 3, on_step=calls.append,
                           stop_at_eos=False)
    assert stopped.ended == "stopped" and stopped.n_generated == 3


@pytest.mark.parametrize("prompt, n, message", [("", 4, "empty"), ("   ", 4, "empty"), (PROMPT, 0, "between 1 and 64"),
                                                (PROMPT, 10_000, "between 1 and 64")])
def test_bad_settings_get_a_message(prompt, n, message):
    with pytest.raises(gen.GenerationError, match=message):
        gen.generate(load_model("toy-gpt2"), prompt, n)


def test_negative_temperature_and_too_long_prompt_and_encoder_get_a_message(minilm):
    loaded = load_model("toy-gpt2")
    with pytest.raises(gen.GenerationError, match="temperature"):
        gen.generate(loaded, PROMPT, 4, temperature=-1)
    with pytest.raises(gen.GenerationError, match="Shorten the prompt"):
        gen.generate(loaded, "word " * 3000, 4)
    with pytest.raises(gen.GenerationError, match="encoder"):
        gen.generate(minilm, PROMPT, 4)
