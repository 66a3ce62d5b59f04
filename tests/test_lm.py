"""attnviz.lm: next-token loss and top-k against transformers' own loss and a per-position loop."""

import math

import numpy as np
import pytest
import torch

from attnviz.lm import NotALanguageModel, next_token_logits, token_losses, top_k
from attnviz.models import load_model


def test_token_losses_mean_is_transformers_own_loss():
    loaded = load_model("toy-llama-gqa")
    ids = loaded.tokenizer("The cat sat on the mat. The cat sat.", return_tensors="pt").input_ids
    logits = next_token_logits(loaded.model, ids[0])
    losses = token_losses(logits[0], ids[0])
    with torch.no_grad():
        reference = loaded.model(input_ids=ids, labels=ids).loss.item()  # transformers shifts and averages
    assert losses.shape == (ids.shape[1] - 1,)
    assert losses.mean() == pytest.approx(reference, rel=1e-5)


def test_top_k_and_the_actual_token_by_a_loop():
    rng = np.random.default_rng(0)
    logits = torch.tensor(rng.normal(size=(6, 11)) * 3)
    ids = torch.tensor([3, 1, 4, 1, 5, 9])
    out = top_k(logits, ids, k=3)
    for t in range(6):
        z = logits[t].numpy()
        p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        order = sorted(range(11), key=lambda i: -p[i])
        assert list(out.ids[t]) == order[:3]
        np.testing.assert_allclose(out.probs[t], p[order[:3]], rtol=1e-12)
        if t < 5:
            assert out.actual_prob[t] == pytest.approx(p[ids[t + 1]], rel=1e-12)
            assert out.actual_rank[t] == order.index(int(ids[t + 1]))
            assert token_losses(logits, ids)[t] == pytest.approx(-math.log(p[ids[t + 1]]), rel=1e-12)


def test_an_encoder_predicts_no_next_token():
    loaded = load_model("toy-gpt2")
    assert next_token_logits(loaded.model, [1, 2, 3]).shape[:2] == (1, 3)
    from transformers import BertConfig, BertModel

    bert = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                vocab_size=50)).eval()
    with pytest.raises(NotALanguageModel):
        next_token_logits(bert, [1, 2, 3])
