"""attnviz.lab.variants: each config builds its transformers architecture, with the weights it says."""

from __future__ import annotations

import math

import pytest
import torch

from attnviz import lab


@pytest.mark.parametrize("positional, model_type", [("learned", "gpt2"), ("sinusoidal", "gpt2"), ("rope", "llama"),
                                                    ("alibi", "bloom")])
def test_model_architecture_per_positional_scheme(positional, model_type):
    cfg = lab.LabConfig(positional=positional, n_layers=2, n_heads=4, d_model=32)
    model = lab.build_model(cfg)
    assert model.config.model_type == model_type and model.config.vocab_size == 257
    assert model.config._attn_implementation == "eager"
    ids = lab.make_probe(5, batch_size=2)
    out = model(input_ids=ids, output_attentions=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 4, 11, 11)
    same = lab.build_model(cfg)
    other = lab.build_model(lab.LabConfig(positional=positional, d_model=32, seed=1))
    for (name, p), q, r in zip(model.named_parameters(), same.parameters(), other.parameters()):
        assert torch.equal(p, q), name
    assert any(not torch.equal(p, r) for p, r in zip(model.parameters(), other.parameters()))


def test_sinusoidal_positions_are_vaswani_table_and_frozen():
    model = lab.build_model(lab.LabConfig(positional="sinusoidal", d_model=16))
    wpe = model.transformer.wpe.weight
    assert not wpe.requires_grad
    for pos in (0, 1, 7, 200):
        for i in range(8):
            assert wpe[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 16)), abs=1e-6)
            assert wpe[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / 16)), abs=1e-6)
    run = lab.LabRun(lab.LabConfig(positional="sinusoidal", d_model=16, n_heads=2, steps=3))
    before = run.model.transformer.wpe.weight.clone()
    run.run()
    assert torch.equal(run.model.transformer.wpe.weight, before)


def test_config_problems_are_reported_and_refused():
    assert lab.LabConfig().problems() == []
    bad = lab.LabConfig(task="sorting", positional="xpos", steps=lab.MAX_STEPS + 1, d_model=30, n_heads=4,
                        segment_len=40)
    assert len(bad.problems()) == 5
    with pytest.raises(ValueError):
        lab.LabRun(bad)


def _gpt_oss(attention, seed=0):
    return lab.build_model(lab.LabConfig(attention=attention, d_model=32, n_heads=4, seed=seed))


def _probe_ids():
    return torch.tensor([[lab.BOS_ID] + [ord(c) for c in "four score and seven"]])


def test_variants_are_one_gpt_oss_skeleton_differing_only_in_attention():
    models = {v: _gpt_oss(v) for v in lab.VARIANTS}
    for v, m in models.items():
        assert m.config.model_type == "gpt_oss" and m.config.num_local_experts == 1
        assert set(m.config.layer_types) == {"full_attention"}
    sinks = {v: torch.stack([l.self_attn.sinks for l in m.model.layers]) for v, m in models.items()}
    assert torch.all(sinks["softmax"] == float("-inf")) and torch.all(sinks["gated"] == float("-inf"))
    assert torch.all(sinks["off_by_one"] == 0) and torch.all(sinks["learned_sink"] == 0)
    trainable = {v: [l.self_attn.sinks.requires_grad for l in m.model.layers] for v, m in models.items()}
    assert trainable == {"softmax": [False] * 2, "off_by_one": [False] * 2, "learned_sink": [True] * 2,
                         "gated": [False] * 2}
    # every weight they share is drawn the same from the seed
    shared = dict(models["softmax"].named_parameters())
    for v in ("off_by_one", "learned_sink", "gated"):
        for name, p in models[v].named_parameters():
            if not name.endswith(".sinks") and "attnviz_gate" not in name:
                torch.testing.assert_close(p, shared[name], rtol=0, atol=0)


def _scores_by_hand(model, ids, layer):
    """Layer `layer`'s pre-softmax scores [head, n, n] (causal, -inf above the diagonal), from the model's own
    projections and rotary embedding, in float64."""
    from transformers.models.gpt_oss.modeling_gpt_oss import apply_rotary_pos_emb

    inner = model.model
    with torch.no_grad():
        hidden = inner.embed_tokens(ids)
        positions = torch.arange(ids.shape[1])[None]
        rope = inner.rotary_emb(hidden, positions)
        out = model(input_ids=ids, output_hidden_states=True)
        x = inner.layers[layer].input_layernorm(out.hidden_states[layer])
        attn = inner.layers[layer].self_attn
        b, n, _ = x.shape
        q = attn.q_proj(x).view(b, n, -1, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, n, -1, attn.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *rope)
    scores = (q[0].double() @ k[0].double().transpose(-1, -2)) * attn.scaling
    return scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))


@pytest.mark.parametrize("attention, sink", [("softmax", None), ("off_by_one", 0.0)])
def test_off_by_one_is_exp_over_one_plus_the_sum(attention, sink):
    """The pattern transformers' gpt-oss eager attention gives equals exp(x_i) / (1 + sum_j exp(x_j)) for
    off-by-one and the plain softmax for softmax, computed here in float64 from the scores."""
    model = _gpt_oss(attention).eval()
    ids = _probe_ids()
    with torch.no_grad():
        weights = model(input_ids=ids, output_attentions=True).attentions[1][0].double()  # [head, n, n]
    scores = _scores_by_hand(model, ids, 1)
    e = torch.exp(scores)
    want = e / (e.sum(-1, keepdim=True) + (0.0 if sink is None else 1.0))
    torch.testing.assert_close(weights, want, atol=1e-6, rtol=0)


def test_the_gate_multiplies_each_heads_output_by_its_sigmoid():
    """A gated layer's attention output equals o_proj(sigmoid(x W_g + b_g)[h] * (A_h V_h)), computed here from the
    weights, the eager pattern and the value projection."""
    model = _gpt_oss("gated").eval()
    with torch.no_grad():
        for layer in model.model.layers:  # a gate far from 0.5, different per head
            layer.self_attn.attnviz_gate.bias.copy_(torch.tensor([-3.0, -1.0, 1.0, 3.0]))
    ids = _probe_ids()
    seen = {}
    attn = model.model.layers[1].self_attn
    handle = attn.register_forward_hook(lambda m, a, kw, out: seen.update(out=out[0], x=kw["hidden_states"]),
                                        with_kwargs=True)
    try:
        with torch.no_grad():
            weights = model(input_ids=ids, output_attentions=True).attentions[1][0]  # [head, n, n]
    finally:
        handle.remove()
    x = seen["x"][0]                                                             # [n, d]
    v = attn.v_proj(x).view(x.shape[0], -1, attn.head_dim).transpose(0, 1)      # [head, n, d_head]
    heads = weights @ v                                                          # [head, n, d_head]
    gate = torch.sigmoid(x @ attn.attnviz_gate.weight.T + attn.attnviz_gate.bias)  # [n, head]
    o_proj = lambda y: torch.nn.functional.linear(y, attn.o_proj.weight, attn.o_proj.bias)  # noqa: E731 (no hooks)
    want = o_proj((heads * gate.T[..., None]).transpose(0, 1).reshape(x.shape[0], -1))
    torch.testing.assert_close(seen["out"][0], want, atol=1e-5, rtol=0)
    ungated = o_proj(heads.transpose(0, 1).reshape(x.shape[0], -1))
    assert (seen["out"][0] - ungated).abs().max() > 1e-3


def test_only_the_learned_sinks_train():
    runs = {v: lab.LabRun(lab.LabConfig(attention=v, task="text", d_model=32, steps=5, text_len=16))
            for v in lab.VARIANTS}
    before = {v: [l.self_attn.sinks.clone() for l in r.model.model.layers] for v, r in runs.items()}
    for r in runs.values():
        assert r.run().status == "done"
    for v, r in runs.items():
        after = [l.self_attn.sinks for l in r.model.model.layers]
        moved = any(not torch.equal(a, b) for a, b in zip(after, before[v]))
        assert moved == (v == "learned_sink"), v
