import copy
import dataclasses

import numpy as np
import pytest
import torch

from attnviz import knockout as ko
from attnviz import logit_attribution as D
from attnviz.models import load_model

TEXT = "When Mary and John went to the store, John gave a drink to"


def _own_difference(model, ids, a, b):
    """logit[a] - logit[b] at the last position, from transformers' own forward pass (float64 of its logits)."""
    with torch.no_grad():
        z = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].double()
    return float(z[a] - z[b])


def _assert_adds_up(loaded, ids, a, b):
    out = D.direct_logit_attribution(loaded, ids, a, b)
    own = _own_difference(loaded.model, ids, a, b)
    parts = [v for _, v in out.terms()]
    assert len(parts) == 2 + loaded.shape.layers * (loaded.shape.heads + 2)
    assert sum(parts) == pytest.approx(out.total, abs=1e-9)
    # float precision: the model computes in float32, the parts in float64 from its float32 activations
    assert out.total == pytest.approx(own, abs=2e-6 * max(1.0, np.abs(parts).sum())), (out.total, own)
    assert np.abs(out.heads).max() > 1e-3 and out.logit_diff == pytest.approx(own, abs=1e-5)
    return out


def _with_random_biases(loaded):
    """A copy whose every bias (GPT-2: attention, MLP, LayerNorms) is drawn at random instead of 0."""
    model = copy.deepcopy(loaded.model)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(2)
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.3)
    return dataclasses.replace(loaded, model=model)


@pytest.mark.parametrize("name", ["toy-llama-gqa", "toy-gpt2"])
def test_parts_add_up_to_the_models_logit_difference_in_toys(name):
    loaded = _with_random_biases(load_model(name))
    ids = loaded.tokenizer(TEXT).input_ids
    out = _assert_adds_up(loaded, ids, ord("M"), ord("J"))
    if name == "toy-gpt2":  # LayerNorm and biases (drawn here, GPT-2 starts them at 0): their parts are not zero
        assert abs(out.final_bias) > 1e-3 and np.abs(out.attn_bias).min() > 1e-3
    assert out.frozen == ("final norm",)


def test_parts_add_up_in_smollm2(smollm2):
    ids = smollm2.tokenizer(TEXT).input_ids
    mary, john = (smollm2.tokenizer(w, add_special_tokens=False).input_ids[0] for w in (" Mary", " John"))
    out = _assert_adds_up(smollm2, ids, mary, john)
    assert out.heads.shape == (30, 9) and out.logit_diff > 0  # SmolLM2 answers Mary


def test_parts_add_up_in_gemma3_with_its_post_norms_frozen(gemma3):
    ids = gemma3.tokenizer(TEXT).input_ids
    mary, john = (gemma3.tokenizer(w, add_special_tokens=False).input_ids[0] for w in (" Mary", " John"))
    out = _assert_adds_up(gemma3, ids, mary, john)
    assert out.heads.shape == (18, 4)
    assert out.frozen == ("post_attention_layernorm", "post_feedforward_layernorm", "final norm")


def _tiny(name, tmp_path):
    from tests.families import build_family

    return load_model(str(build_family(name, tmp_path)))


def test_tiny_gemma3_with_random_norm_weights_adds_up(tmp_path):
    loaded = _tiny("gemma3_text", tmp_path)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(1)
        for module in loaded.model.modules():
            if type(module).__name__ == "Gemma3RMSNorm" and module.weight.shape[0] == 64:
                module.weight.normal_(0.0, 0.5)  # 1 + w far from 1: a wrong convention or scale would show
    _assert_adds_up(loaded, loaded.tokenizer(TEXT).input_ids, ord("M"), ord("J"))


def test_soft_capped_logits_and_blocks_that_add_their_own_residual_are_refused(tmp_path):
    gemma2 = _tiny("gemma2", tmp_path)
    with pytest.raises(D.LogitAttributionError, match="soft-caps its logits"):
        D.direct_logit_attribution(gemma2, gemma2.tokenizer(TEXT).input_ids, 77, 74)
    bloom = load_model("toy-bloom-alibi")  # BLOOM's attention and MLP add the residual inside themselves
    with pytest.raises(D.LogitAttributionError, match="parts add up to"):
        D.direct_logit_attribution(bloom, bloom.tokenizer(TEXT).input_ids, 77, 74)


def _hand_head_attribution(loaded, ids, a, b):
    """[layer, head] each head's share at the last position, recomputed here in float64 from the o_proj inputs and
    the final norm's input read by hooks written here: W_O[:, head] x_head, centred for LayerNorm, times the norm's
    weight over the final residual's RMS (standard deviation), onto W_U[a] - W_U[b]."""
    model, seen = loaded.model, {}
    layers, heads = loaded.shape.layers, loaded.shape.heads
    norm = model.model.norm if hasattr(model, "model") else model.transformer.ln_f
    handles = [ko.output_projection(model, layer).register_forward_pre_hook(
        lambda m, args, layer=layer: seen.__setitem__(layer, args[0][0, -1].double())) for layer in range(layers)]
    handles.append(norm.register_forward_pre_hook(lambda m, args: seen.__setitem__("r", args[0][0, -1].double())))
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    layer_norm = isinstance(norm, torch.nn.LayerNorm)
    centre = (lambda v: v - v.mean()) if layer_norm else (lambda v: v)
    r = centre(seen["r"])
    gain = norm.weight.double() / torch.sqrt(r.pow(2).mean() + (norm.eps if layer_norm else norm.variance_epsilon))
    w_u = model.get_output_embeddings().weight.double()
    u = w_u[a] - w_u[b]
    out = np.zeros((layers, heads))
    for layer in range(layers):
        w = ko.projection_weight(ko.output_projection(model, layer)).double()
        d_v = w.shape[1] // heads
        for h in range(heads):
            cols = slice(h * d_v, (h + 1) * d_v)
            out[layer, h] = float((centre(w[:, cols] @ seen[layer][cols]) * gain) @ u)
    return out


@pytest.mark.parametrize("name", ["toy-llama-gqa", "toy-gpt2"])
def test_each_head_equals_a_float64_recomputation(name):
    loaded = _with_random_biases(load_model(name))
    ids = loaded.tokenizer(TEXT).input_ids
    out = D.direct_logit_attribution(loaded, ids, ord("M"), ord("J"))
    np.testing.assert_allclose(out.heads, _hand_head_attribution(loaded, ids, ord("M"), ord("J")), atol=1e-5, rtol=0)


def test_an_earlier_position_and_bad_tokens():
    loaded = load_model("toy-llama-gqa")
    ids = loaded.tokenizer(TEXT).input_ids
    out = D.direct_logit_attribution(loaded, ids, 10, 20, position=5)
    with torch.no_grad():
        z = loaded.model(input_ids=torch.tensor([ids])).logits[0, 5].double()
    assert out.position == 5 and out.total == pytest.approx(float(z[10] - z[20]), abs=1e-5)
    with pytest.raises(D.LogitAttributionError, match="outside the vocabulary"):
        D.direct_logit_attribution(loaded, ids, 10, 999)
