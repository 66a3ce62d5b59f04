import numpy as np
import pytest
import torch

from attnviz.models import load_model
from attnviz.norms import NormError, norm_attention

TEXT = "The cat sat on the mat. The cat sat on the mat."


def _by_hand(loaded, text, layer):
    """alpha_ij ||v_j W_O^h|| from the model's weights: the layer's input hidden states (output_hidden_states),
    its layer norm and value projection, transformers' own attention weights (output_attentions), and the head's
    rows of the output projection, all in float64."""
    model = loaded.model
    ids = torch.tensor([loaded.tokenizer(text).input_ids])
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, output_attentions=True, use_cache=False)
    alpha = out.attentions[layer][0].double()  # [head, query, key]
    hidden = out.hidden_states[layer][0]
    family = loaded.shape.family
    if family == "gpt2":
        block = model.transformer.h[layer]
        qkv = block.attn.c_attn(block.ln_1(hidden)).double()  # Conv1D: x @ W + b, W [d, 3d]
        d = qkv.shape[-1] // 3
        v = qkv[:, 2 * d:].reshape(len(hidden), loaded.shape.heads, -1).transpose(0, 1)  # [head, key, d_v]
        w_o = block.attn.c_proj.weight.double()  # [in, out]
        kv_of = range(loaded.shape.heads)
    else:  # llama
        block = model.model.layers[layer]
        v = block.self_attn.v_proj(block.input_layernorm(hidden)).double()
        v = v.reshape(len(hidden), loaded.shape.kv_heads, -1).transpose(0, 1)  # [kv_head, key, d_v]
        w_o = block.self_attn.o_proj.weight.double().T  # [in, out]
        kv_of = [h // loaded.shape.group_size for h in range(loaded.shape.heads)]
    d_v = v.shape[-1]
    f_norm = torch.stack([(v[kv] @ w_o[h * d_v:(h + 1) * d_v]).norm(dim=-1) for h, kv in enumerate(kv_of)])
    return alpha.numpy(), (alpha * f_norm[:, None, :]).numpy(), f_norm.numpy()


@pytest.mark.parametrize("name", ["toy-gpt2", "toy-llama-gqa"])
@pytest.mark.parametrize("layer", [0, 1])
def test_norms_equal_a_hand_computation_from_the_weights(name, layer):
    loaded = load_model(name)
    got = norm_attention(loaded, TEXT, layer)
    alpha, norms, f_norm = _by_hand(loaded, TEXT, layer)
    np.testing.assert_allclose(got.pattern, alpha, atol=1e-6)
    np.testing.assert_allclose(got.value_norms, f_norm, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.norms, norms, rtol=1e-5, atol=1e-6)
    live = norms.sum(-1) > 0  # the toy Llama's BOS embedding is its zero padding row: query 0 adds nothing
    np.testing.assert_allclose(got.shares().sum(-1)[live], 1.0, atol=1e-9)
    assert live.mean() > 0.9


def test_smollm2_sink_takes_weight_but_little_norm(smollm2):
    layer = 20
    got = norm_attention(smollm2, TEXT, layer)
    alpha, norms, _ = _by_hand(smollm2, TEXT, layer)
    np.testing.assert_allclose(got.norms, norms, rtol=1e-4, atol=1e-5)
    # the point of the page: in the heads where token 0 takes most of the weight, it brings less of the output
    sinky = [h for h in range(smollm2.shape.heads) if got.sink_summary(h)["weight"] > 0.5]
    assert sinky, "SmolLM2 has first-token sink heads in its upper layers"
    for h in sinky:
        s = got.sink_summary(h)
        assert s["norm_share"] < s["weight"] and s["value_norm_ratio"] < 1


def test_families_without_values_or_layers_that_do_not_exist_get_a_message():
    with pytest.raises(NormError, match="value vectors"):
        norm_attention(load_model("toy-bloom-alibi"), TEXT, 0)
    with pytest.raises(NormError, match="Layer 5 does not exist"):
        norm_attention(load_model("toy-gpt2"), TEXT, 5)
    with pytest.raises(NormError, match="empty"):
        norm_attention(load_model("toy-gpt2"), "", 0)
