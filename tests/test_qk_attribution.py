import dataclasses

import numpy as np
import pytest
import torch

from attnviz import qk_attribution as Q
from attnviz.models import load_model

TEXT = "When Mary and John went to the store, John gave a drink to"


def _assert_adds_up(out, rtol=1e-4):
    """The terms and the frequency planes add up to the model's own score (the model computes in float32, the terms
    in float64 from its float32 activations: relative to the largest term)."""
    size = max(1.0, float(np.abs(out.terms).max()))
    assert out.total == pytest.approx(out.score, abs=rtol * size), (out.total, out.score)
    assert float(out.by_frequency.sum()) == pytest.approx(out.score, abs=rtol * size)
    assert out.terms.shape == (len(out.q_labels), len(out.k_labels))
    assert np.abs(out.terms).max() > 1e-3 * abs(out.score)  # not all zero


def _tiny(name, tmp_path):
    from tests.families import build_family

    return load_model(str(build_family(name, tmp_path)))


def _random_biases(loaded, scale=0.3):
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(3)
        for name, p in loaded.model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, scale)
    return loaded


def test_smollm2_terms_add_up_to_its_score(smollm2):
    ids = smollm2.tokenizer(TEXT).input_ids
    out = Q.qk_attribution(smollm2, ids, layer=5, head=3, query=-1, key=3)
    _assert_adds_up(out)
    assert len(out.q_labels) == 1 + 5 * (9 + 2) and out.q_labels[:2] == ["embeddings", "L0H0"]
    assert out.by_frequency.shape == (32,) and out.kv_head == 1  # 9 query heads share 3 KV heads
    assert out.frozen == ("input_layernorm",)
    assert len(out.top(5)) == 5 and abs(out.top(1)[0][2]) == pytest.approx(np.abs(out.terms).max())


@pytest.mark.parametrize("layer", [3, 5])  # a sliding-window layer and a global one
def test_gemma3_terms_add_up_with_its_qk_norm_frozen(gemma3, layer):
    ids = gemma3.tokenizer(TEXT).input_ids
    out = Q.qk_attribution(gemma3, ids, layer=layer, head=2, query=-1, key=4)
    _assert_adds_up(out)
    assert {"q_norm", "k_norm", "input_layernorm", "post_attention_layernorm"} <= set(out.frozen)
    assert out.by_frequency.shape == (128,)


def test_tiny_qwen2_biases_are_parts_and_scores_match_transformers(tmp_path):
    loaded = _random_biases(_tiny("qwen2", tmp_path))
    ids = loaded.tokenizer(TEXT).input_ids
    outs = [Q.qk_attribution(loaded, ids, layer=1, head=3, query=20, key=key) for key in (5, 12)]
    for out in outs:
        _assert_adds_up(out)
        assert out.q_labels[-1] == "q bias" and out.k_labels[-1] == "k bias" and out.kv_head == 1
        assert abs(out.terms[-1, -1]) > 1e-4  # q bias . k bias
    # transformers' own weights: log w[20, 5] - log w[20, 12] is the difference of the two pre-softmax scores
    with torch.no_grad():
        w = loaded.model(input_ids=torch.tensor([ids]), output_attentions=True).attentions[1][0, 3, 20].double()
    assert outs[0].total - outs[1].total == pytest.approx(float(torch.log(w[5] / w[12])), abs=1e-4)


@pytest.mark.parametrize("name", ["qwen3", "olmo2", "gemma3_text"])
def test_tiny_qk_norm_families_add_up(name, tmp_path):
    loaded = _tiny(name, tmp_path)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(1)
        for module_name, p in loaded.model.named_parameters():
            if "norm" in module_name:  # norm weights far from their start: a wrong convention or scale shows
                p.normal_(0.0 if name == "gemma3_text" else 1.0, 0.5)
    out = Q.qk_attribution(loaded, TEXT, layer=1, head=1, query=-1, key=-2)  # within the sliding window of 8
    _assert_adds_up(out)
    assert {"q_norm", "k_norm"} <= set(out.frozen)


def _rotate(x, p, theta):
    """x [d] turned by RoPE at position p, the Llama convention written out: plane (i, i + d/2) by p theta^(-2i/d)."""
    d = x.shape[0]
    angle = p * theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    a, b = x[:d // 2], x[d // 2:]
    return torch.cat([a * torch.cos(angle) - b * torch.sin(angle), b * torch.cos(angle) + a * torch.sin(angle)])


def test_two_terms_equal_a_float64_recomputation():
    loaded = load_model("toy-llama-gqa")
    model, ids = loaded.model, loaded.tokenizer(TEXT).input_ids
    layer, head, kv, query, key = 1, 3, 1, len(ids) - 1, 4
    out = Q.qk_attribution(loaded, ids, layer, head, query, key)
    seen = {}
    blocks = model.model.layers
    hooks = [blocks[layer].input_layernorm.register_forward_pre_hook(lambda m, a: seen.__setitem__("r", a[0][0])),
             blocks[0].self_attn.o_proj.register_forward_pre_hook(lambda m, a: seen.__setitem__("o", a[0][0]))]
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
            embeddings = model.model.embed_tokens(torch.tensor(ids)).double()
    finally:
        for h in hooks:
            h.remove()
    attn, norm, d = blocks[layer].self_attn, blocks[layer].input_layernorm, 16
    r = seen["r"].double()
    gain = norm.weight.double() / torch.sqrt(r.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)  # [n, d_model]
    w_q = attn.q_proj.weight.double()[head * d:(head + 1) * d]
    w_k = attn.k_proj.weight.double()[kv * d:(kv + 1) * d]
    theta = model.config.rope_parameters["rope_theta"]
    k_emb = _rotate(w_k @ (embeddings[key] * gain[key]), key, theta)
    q_emb = _rotate(w_q @ (embeddings[query] * gain[query]), query, theta)
    w_o = blocks[0].self_attn.o_proj.weight.double()[:, d:2 * d]  # head 1 of layer 0
    q_head = _rotate(w_q @ ((w_o @ seen["o"].double()[query, d:2 * d]) * gain[query]), query, theta)
    i, j = out.q_labels.index("L0H1"), out.k_labels.index("embeddings")
    # the model's rotary tables are float32 (angles up to ~60 rad here: ~4e-6 rad off), the terms use them
    assert out.terms[0, j] == pytest.approx(float(q_emb @ k_emb) / d ** 0.5, rel=2e-5)
    assert out.terms[i, j] == pytest.approx(float(q_head @ k_emb) / d ** 0.5, rel=2e-5)
    _assert_adds_up(out)


def test_refusals(tmp_path):
    loaded = load_model("toy-llama-gqa")
    ids = loaded.tokenizer(TEXT).input_ids
    with pytest.raises(Q.QKAttributionError, match="hides key 10 from query 5"):
        Q.qk_attribution(loaded, ids, 1, 0, query=5, key=10)
    with pytest.raises(Q.QKAttributionError, match="Head 4 does not exist"):
        Q.qk_attribution(loaded, ids, 1, 4)
    with pytest.raises(Q.QKAttributionError, match="Key position 99"):
        Q.qk_attribution(loaded, ids, 1, 0, key=99)
    with pytest.raises(Q.QKAttributionError, match="no separate q_proj"):
        Q.qk_attribution(load_model("toy-gpt2"), ids, 1, 0)
    gemma2 = _tiny("gemma2", tmp_path)
    with pytest.raises(Q.QKAttributionError, match="soft-caps its scores"):
        Q.qk_attribution(gemma2, ids, 1, 0, key=-1)
    broken = dataclasses.replace(loaded, model=_scaled_copy(loaded.model))
    with pytest.raises(Q.QKAttributionError, match="does not decompose"):
        Q.qk_attribution(broken, ids, 1, 0)


def _scaled_copy(model):
    """A copy whose layer-0 MLP output is doubled by a hook: the residual stream no longer is the sum of the parts
    attnviz reads, and the check must say so."""
    import copy

    model = copy.deepcopy(model)
    model.model.layers[0].register_forward_hook(lambda m, a, out: out * 2 if torch.is_tensor(out) else
                                                 (out[0] * 2, *out[1:]))
    return model
