"""attnviz.massive: the layer outputs against transformers' hidden states, the top values against loops, and the
intervention against one done by hand (the layers run one by one with the hidden state edited in between, and a
copy of the model whose layer edits its own output)."""

from __future__ import annotations

import copy
import threading

import numpy as np
import pytest
import torch

from attnviz import massive
from attnviz.models import load_model

TEXT = "The cat sat on the mat. The dog sat on the log."


@pytest.fixture(scope="module")
def llama():
    return load_model("toy-llama-gqa")


def _ids(loaded, text=TEXT):
    return torch.as_tensor(loaded.tokenizer(text)["input_ids"])


def test_layer_outputs_are_transformers_hidden_states(llama):
    ids = _ids(llama)
    ours = massive.layer_outputs(llama.model, ids)
    with torch.no_grad():
        theirs = llama.model(input_ids=ids[None], output_hidden_states=True).hidden_states
    assert ours.shape == (2, len(ids), 64)
    # transformers' last entry is after the final norm; every earlier one is a layer's raw output
    np.testing.assert_allclose(ours[0], theirs[1][0].numpy(), atol=1e-6)
    np.testing.assert_allclose(llama.model.model.norm(torch.tensor(ours[-1])).numpy(), theirs[-1][0].numpy(),
                               atol=1e-5)


def test_top_activations_match_a_loop():
    rng = np.random.default_rng(0)
    h = rng.normal(size=(3, 7, 11))
    h[1, 0, 4] = -500.0
    h[1, 3, 9] = 200.0
    top = massive.top_activations(h, k=3)
    for layer in range(3):
        cells = sorted(((abs(h[layer, t, d]), t, d) for t in range(7) for d in range(11)), reverse=True)[:3]
        assert [(a.token, a.dim) for a in top[layer]] == [(t, d) for _, t, d in cells]
        assert [a.value for a in top[layer]] == [h[layer, t, d] for _, t, d in cells]
    assert (top[1][0].token, top[1][0].dim, top[1][0].value) == (0, 4, -500.0)


def test_first_massive_layer_follows_sun_et_al_thresholds():
    h = np.ones((4, 5, 6))
    h[2, 0, 1] = 999.0   # 999 x the median: not yet
    h[3, 0, 1] = 1001.0
    assert massive.first_massive_layer(h) == 3
    assert massive.first_massive_layer(np.full((2, 3, 3), 1e-3)) is None
    small = np.full((2, 3, 3), 1e-3)
    small[1, 0, 0] = 50.0  # 50,000 x the median but under 100 in magnitude
    assert massive.first_massive_layer(small) is None


def test_mean_at_is_the_mean_over_texts_and_edit_for_checks_its_input():
    rng = np.random.default_rng(1)
    hiddens = [rng.normal(size=(2, n, 4)) for n in (5, 3, 6)]
    means = massive.mean_at(hiddens, 1, 4, [0, 3])  # the 3-token text has no token 4: left out
    for dim, value in zip((0, 3), means):
        assert value == pytest.approx((hiddens[0][1, 4, dim] + hiddens[2][1, 4, dim]) / 2)
    h = hiddens[0]
    assert massive.edit_for(h, 1, 2, [0, 3], "mean", means).values == means
    assert massive.edit_for(h, 0, 0, [1], "zero").values == (0.0,)
    with pytest.raises(ValueError):
        massive.mean_at(hiddens, 1, 9, [0])
    with pytest.raises(ValueError):
        massive.edit_for(h, 2, 0, [1], "zero")
    with pytest.raises(ValueError):
        massive.edit_for(h, 0, 0, [1], "half")
    with pytest.raises(ValueError):
        massive.edit_for(h, 0, 0, [1, 2], "mean", means=(1.0,))


def _losses_by_hand(model, ids, edit=None):
    """Llama's layers called one by one, a causal mask made here, the hidden state edited between two layers;
    float64 next-token cross-entropy from the final norm and the LM head."""
    inner = model.model
    n = len(ids)
    with torch.no_grad():
        h = inner.embed_tokens(ids[None])
        positions = torch.arange(n)[None]
        rope = inner.rotary_emb(h, positions)
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        for i, layer in enumerate(inner.layers):
            out = layer(h, attention_mask=mask, position_embeddings=rope, position_ids=positions)
            h = (out[0] if isinstance(out, tuple) else out).clone()
            if edit is not None and i == edit.layer:
                for dim, value in zip(edit.dims, edit.values):
                    h[0, edit.token, dim] = value
        logits = model.lm_head(inner.norm(h))[0].double()
    logp = torch.log_softmax(logits[:-1], dim=-1)
    return -logp[torch.arange(n - 1), ids[1:]].numpy()


class _EditsItsOutput(torch.nn.Module):
    def __init__(self, layer, edit):
        super().__init__()
        self.layer, self.edit = layer, edit

    def forward(self, *args, **kwargs):
        out = self.layer(*args, **kwargs)
        h = (out[0] if isinstance(out, tuple) else out).clone()
        for dim, value in zip(self.edit.dims, self.edit.values):
            h[:, self.edit.token, dim] = value
        return (h, *out[1:]) if isinstance(out, tuple) else h


def _sink_mass_by_hand(model, ids):
    """Mean over heads of (1 / (n - 1)) sum_{t >= 1} A[t, 0], from output_attentions, by loops."""
    with torch.no_grad():
        attentions = model(input_ids=ids[None], output_attentions=True).attentions
    out = []
    for a in attentions:
        a = a[0].double().numpy()
        out.append(np.mean([sum(a[h, t, 0] for t in range(1, a.shape[1])) / (a.shape[1] - 1)
                            for h in range(a.shape[0])]))
    return np.array(out)


@pytest.mark.parametrize("mode", massive.MODES)
def test_intervention_equals_one_done_by_hand(llama, mode):
    ids = _ids(llama)
    hidden = massive.layer_outputs(llama.model, ids)
    top = massive.top_activations(hidden, k=3)[0]
    dims = sorted({a.dim for a in top})
    others = [massive.layer_outputs(llama.model, _ids(llama, t)) for t in
              ("A bird in the hand is worth two in the bush, they say.", "Two roads diverged in a yellow wood, and I")]
    edit = massive.edit_for(hidden, 0, top[0].token, dims, mode, massive.mean_at(others, 0, top[0].token, dims))
    result = massive.intervention(llama, TEXT, edit)
    np.testing.assert_allclose(result.losses, _losses_by_hand(llama.model, ids), atol=1e-5)
    np.testing.assert_allclose(result.edited_losses, _losses_by_hand(llama.model, ids, edit), atol=1e-5)
    assert np.abs(result.edited_losses - result.losses).max() > 1e-4  # the edit does something
    assert result.edited_perplexity == pytest.approx(float(np.exp(result.edited_losses.mean())))
    # the sink mass, from a copy of the model whose layer edits its own output
    twin = copy.deepcopy(llama.model)
    twin.model.layers[edit.layer] = _EditsItsOutput(twin.model.layers[edit.layer], edit)
    np.testing.assert_allclose(result.sink_mass, _sink_mass_by_hand(llama.model, ids), atol=1e-5)
    np.testing.assert_allclose(result.edited_sink_mass, _sink_mass_by_hand(twin, ids), atol=1e-5)


def test_an_edit_touches_only_its_own_thread(llama):
    ids = _ids(llama)
    plain = massive.layer_outputs(llama.model, ids)
    edit = massive.Edit(layer=0, token=1, dims=(1, 2), values=(0.0, 0.0))
    seen = {}
    inside = threading.Event()
    done = threading.Event()

    def other():
        inside.wait(10)
        seen["other"] = massive.layer_outputs(llama.model, ids)
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with massive.edited(llama.model, edit):
        inside.set()
        done.wait(30)
        seen["mine"] = massive.layer_outputs(llama.model, ids)
    thread.join()
    np.testing.assert_array_equal(seen["other"], plain)
    assert np.all(seen["mine"][0, 1, [1, 2]] == 0.0) and not np.any(plain[0, 1, [1, 2]] == 0.0)
    np.testing.assert_array_equal(massive.layer_outputs(llama.model, ids), plain)  # hooks gone afterwards
    assert massive._HOOKS.users(llama.model) == 0 and massive._HOOKS.installed(llama.model) == 0


def test_decoder_layers_of_other_families():
    assert len(massive.decoder_layers(load_model("toy-gpt2").model)) == 2
    assert len(massive.decoder_layers(load_model("toy-bloom-alibi").model)) == 2


def test_smollm2_massive_activations_reproduce_sun_et_al(smollm2):
    """Sun et al.: a few dimensions of the first token grow to thousands of times the median; zeroing them at
    that token wrecks the model and its sinks, setting them to their mean over other texts changes little."""
    text = "Four score and seven years ago our fathers brought forth on this continent, a new nation."
    hidden = massive.layer_outputs(smollm2.model, _ids(smollm2, text))
    layer = massive.first_massive_layer(hidden)
    assert layer is not None and layer < 20
    top = massive.top_activations(hidden, k=1)
    assert all(top[l][0].token == 0 for l in range(layer, len(hidden) - 1))
    dims = np.argsort(-np.abs(hidden[layer, 0]))[:3].tolist()
    others = [massive.layer_outputs(smollm2.model, _ids(smollm2, t)) for t in
              ("We hold these truths to be self-evident.", "With malice toward none, with charity for all.")]
    zero = massive.intervention(smollm2, text, massive.edit_for(hidden, layer, 0, dims, "zero"))
    mean = massive.intervention(smollm2, text, massive.edit_for(hidden, layer, 0, dims, "mean",
                                                                massive.mean_at(others, layer, 0, dims)))
    assert zero.edited_perplexity > 100 * zero.perplexity
    assert mean.edited_perplexity < 1.2 * mean.perplexity


def test_the_intervention_reads_the_same_sink_mass_from_q_and_k_as_from_the_dense_capture():
    """store="qk" (any length) streams each layer's sink mass; on a short text it equals the dense store's, and the
    losses are the same forward pass either way."""
    from attnviz.models import load_model

    loaded = load_model("toy-llama-gqa")
    text = "The cat sat on the mat. The dog sat on the log."
    hidden = massive.layer_outputs(loaded.model, loaded.tokenizer(text)["input_ids"])
    dims = np.argsort(-np.abs(hidden[0, 3]), kind="stable")[:8].tolist()
    edit = massive.edit_for(hidden, 0, 3, dims, "zero")
    dense = massive.intervention(loaded, text, edit)
    streamed = massive.intervention(loaded, text, edit, store="qk")
    np.testing.assert_allclose(streamed.sink_mass, dense.sink_mass, atol=1e-6)
    np.testing.assert_allclose(streamed.edited_sink_mass, dense.edited_sink_mass, atol=1e-6)
    np.testing.assert_allclose(streamed.edited_losses, dense.edited_losses, atol=1e-6)
    assert np.abs(dense.edited_sink_mass - dense.sink_mass).max() > 1e-4  # the edit changes what it measures
