"""attnviz.mixers: the implicit attention maps of gated delta rule and Mamba2 layers, checked against a float64
reading of their definitions and against transformers' own reference kernels on tiny random models."""

from __future__ import annotations

import pytest
import torch

from attnviz.mixers.delta import apply_map, delta_rule_map, delta_rule_map_naive
from attnviz.mixers.record import mixer_records, record_mixers
from attnviz.mixers.records import DeltaRuleRecord, MixerError, SsdRecord
from attnviz.mixers.ssd import apply_ssd, ssd_map, ssd_map_naive
from tests import mixer_models

# The maps are built in float32 from the kernel's float32 inputs; a rebuilt output may differ from the kernel's by
# float32 rounding of sums over a few dozen tokens: 2e-5 of the output's largest magnitude.
REL32 = 2e-5


def _close(got, want, rel=REL32):
    err = (got.double() - want.double()).abs().max().item()
    scale = want.double().abs().max().item()
    assert err <= rel * scale, (err, scale)


def _delta_inputs(n=23, k_heads=2, v_heads=4, dk=8, dv=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(n, k_heads, dk, generator=gen), torch.randn(n, k_heads, dk, generator=gen)
    v = torch.randn(n, v_heads, dv, generator=gen)
    g = -2 * torch.rand(n, v_heads, generator=gen)
    beta = torch.rand(n, v_heads, generator=gen)
    return q, k, v, g, beta


@pytest.mark.parametrize("chunk", [1, 4, 7, 64])
@pytest.mark.parametrize("l2norm", [True, False])
def test_delta_map_chunkwise_equals_definition(chunk, l2norm):
    q, k, _, g, beta = _delta_inputs()
    want = delta_rule_map_naive(q, k, g, beta, l2norm=l2norm)
    got = delta_rule_map(q, k, g, beta, l2norm=l2norm, chunk=chunk, dtype=torch.float64)
    assert torch.allclose(got, want, rtol=0, atol=1e-12)
    assert torch.all(got.triu(1) == 0)  # causal: no weight on later keys
    assert (want < 0).any()  # a signed map, not a probability


def test_delta_definition_equals_transformers_recurrent_kernel():
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule

    q, k, v, g, beta = _delta_inputs(n=17)
    want, _ = torch_recurrent_gated_delta_rule(q[None], k[None], v[None], g=g[None], beta=beta[None],
                                               use_qk_l2norm_in_kernel=True)
    got = apply_map(delta_rule_map_naive(q, k, g, beta), v.double())
    _close(got, want[0], rel=1e-6)  # the kernel runs in float32; the definition in float64


@pytest.mark.parametrize("name, layers", [("qwen3_next", [0, 1, 2]), ("qwen3_5_text", [0])])
def test_delta_records_rebuild_the_kernel_output(name, layers):
    model = mixer_models.build(name)
    ids = mixer_models.text_ids(70)  # two chunks of the kernel's 64
    records = mixer_records(model, ids)
    assert sorted(records) == layers
    for record in records.values():
        assert isinstance(record, DeltaRuleRecord) and record.l2norm
        w = record.implicit_map(chunk=16)
        assert w.shape == (4, 70, 70)
        _close(record.mixed(w), record.output)
        _close(record.mixed(record.implicit_map(dtype=torch.float64)), record.output)


def test_recording_leaves_the_model_unchanged():
    model = mixer_models.build("qwen3_next")
    ids = mixer_models.text_ids()
    with torch.no_grad():
        before = model(ids, use_cache=False).logits
        with record_mixers(model) as records:
            during = model(ids, use_cache=False).logits
        after = model(ids, use_cache=False).logits
    assert len(records) == 3
    assert torch.equal(before, during) and torch.equal(before, after)
    import transformers.models.qwen3_next.modeling_qwen3_next as source
    assert not hasattr(source.torch_chunk_gated_delta_rule, "attnviz_original")


def test_one_text_at_a_time():
    model = mixer_models.build("mamba2")
    with pytest.raises(MixerError):
        mixer_records(model, torch.zeros(2, 5, dtype=torch.long))


def _ssd_inputs(n=21, heads=4, groups=2, state=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    dt = torch.randn(n, heads, generator=gen)
    A = -torch.rand(heads, generator=gen) * 3
    B, C = torch.randn(n, groups, state, generator=gen), torch.randn(n, groups, state, generator=gen)
    return dt, A, B, C, torch.randn(heads, generator=gen)


@pytest.mark.parametrize("limit", [(0.0, float("inf")), (0.05, 0.5)])
def test_ssd_map_equals_recurrence(limit):
    dt, A, B, C, bias = _ssd_inputs()
    options = dict(dt_bias=bias, dt_softplus=True, dt_limit=limit)
    want = ssd_map_naive(dt, A, B, C, **options)
    got = ssd_map(dt, A, B, C, dtype=torch.float64, **options)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-14)
    assert torch.all(got.triu(1) == 0) and (want < 0).any()


def test_ssd_recurrence_equals_transformers_scan():
    from transformers.models.mamba2.modeling_mamba2 import mamba2_chunk_scan

    dt, A, B, C, bias = _ssd_inputs(n=19)
    x = torch.randn(19, 4, 3, generator=torch.Generator().manual_seed(5))
    D = torch.randn(4)
    want = mamba2_chunk_scan(x[None], dt[None], A, B[None], C[None], chunk_size=8, D=D, dt_bias=bias,
                             dt_softplus=True)
    got = apply_ssd(ssd_map_naive(dt, A, B, C, dt_bias=bias, dt_softplus=True), x.double(), D.double())
    _close(got, want[0], rel=1e-6)


@pytest.mark.parametrize("name, layers", [("mamba2", [0, 1]), ("falcon_h1", [0, 1]), ("bamba", [0])])
def test_ssd_records_rebuild_the_scan_output(name, layers):
    model = mixer_models.build(name)
    records = mixer_records(model, mixer_models.text_ids(20))
    assert sorted(records) == layers
    for record in records.values():
        assert isinstance(record, SsdRecord) and record.dt_softplus and record.D is not None
        w = record.implicit_map()
        assert w.shape == (record.x.shape[1], 20, 20)
        _close(record.mixed(w), record.output)
        # the skip term is outside the map: the map alone misses exactly D x
        _close(record.mixed(w) - record.skip(), record.output - record.skip())
        assert record.skip().abs().max() > 0


KINDS = {
    "qwen3_next": ("gated delta rule",) * 3 + ("gated softmax",),
    "qwen3_5_text": ("gated delta rule", "gated softmax"),
    "mamba2": ("mamba2", "mamba2"),
    "falcon_h1": ("softmax + mamba2",) * 2,
    "bamba": ("mamba2", "softmax"),
    "nemotron_h": ("mamba2", "softmax", "mlp"),
    "granitemoehybrid": ("mamba2", "softmax"),
    "deepseek_v32": ("indexed", "indexed"),
    "kimi_linear": ("gated delta rule", "softmax"),
    "lfm2": ("conv", "softmax"),
}


@pytest.mark.parametrize("name", sorted(KINDS))
def test_layer_kinds_from_the_config_and_from_the_modules(name):
    from attnviz.mixers.kinds import layer_kinds, module_kinds

    model = mixer_models.build(name)
    assert layer_kinds(model.config) == KINDS[name]
    assert module_kinds(model) == KINDS[name]


def test_layer_kinds_of_plain_and_unknown_families():
    import transformers as tf

    from attnviz.mixers.kinds import layer_kinds

    llama = tf.LlamaConfig(num_hidden_layers=3)
    assert layer_kinds(llama) == ("softmax",) * 3
    gemma = tf.Gemma3TextConfig(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    assert layer_kinds(gemma) == ("softmax", "softmax")  # masks differ, the mixer does not
    assert layer_kinds(tf.MambaConfig(num_hidden_layers=2)) == ("unknown (mamba)",) * 2  # never called softmax
    odd = tf.LlamaConfig(num_hidden_layers=2)
    odd.layer_types = ["full_attention", "retention"]
    assert layer_kinds(odd) == ("softmax", "unknown (retention)")


def test_layer_facts_carry_the_mixer():
    from attnviz.shape import model_shape

    shape = model_shape(mixer_models.configs()["qwen3_next"], causal=True)
    assert [f.mixer for f in shape.layer_facts] == list(KINDS["qwen3_next"])
    assert shape.layer_facts[0].describe() == "gated delta rule"
    assert shape.layer_facts[3].describe().startswith("gated softmax, causal")
    assert shape.kinds_summary() == "Gated delta rule layers 0–2; gated softmax layer 3 (causal, RoPE base 10000)"
    # heads and state: 4 value heads, each a 8 x 8 state (linear_key_head_dim x linear_value_head_dim); attention
    # heads 4 with a cache that grows (no fixed state)
    assert (shape.layer_facts[0].heads, shape.layer_facts[0].state) == (4, 4 * 8 * 8)
    assert (shape.layer_facts[3].heads, shape.layer_facts[3].state) == (4, None)
    assert shape.layer_mark(3) == "gated"  # the Heads grid's mark beside the layer number
    assert [model_shape(mixer_models.configs()[name], causal=True).layer_mark(1) for name in
            ("falcon_h1", "deepseek_v32", "lfm2")] == ["+SSM", "top-k", "G"]
    mamba = model_shape(mixer_models.configs()["mamba2"], causal=True)  # 4 heads, d_state 8, head_dim 16
    assert [(f.mixer, f.heads, f.state) for f in mamba.layer_facts] == [("mamba2", 4, 4 * 8 * 16)] * 2
    lfm2 = model_shape(mixer_models.configs()["lfm2"], causal=True)  # hidden 32, conv_L_cache 3
    assert (lfm2.layer_facts[0].mixer, lfm2.layer_facts[0].state) == ("conv", 32 * 2)
    import transformers as tf
    assert {f.mixer for f in model_shape(tf.LlamaConfig(num_hidden_layers=2), causal=True).layer_facts} == {"softmax"}


@pytest.mark.parametrize("name, layers", [("nemotron_h", [0]), ("granitemoehybrid", [0])])
def test_more_mamba2_hybrids_rebuild_the_scan_output(name, layers):
    model = mixer_models.build(name)
    records = mixer_records(model, mixer_models.text_ids(20))
    assert sorted(records) == layers
    for record in records.values():
        _close(record.mixed(record.implicit_map()), record.output)


def test_layers_without_a_known_kernel_get_no_record():
    # LFM2's short convolutions call no kernel whose map attnviz builds: no record rather than a wrong map
    assert mixer_records(mixer_models.build("lfm2"), mixer_models.text_ids(12)) == {}


def test_gates_equal_a_hand_computation_from_the_weights():
    from attnviz.mixers.gates import gate_map, gate_stats, record_gates

    model = mixer_models.build("qwen3_next")
    ids = mixer_models.text_ids(15)
    with record_gates(model) as gates, torch.no_grad():
        hidden = model(ids, use_cache=False, output_hidden_states=True).hidden_states
    assert sorted(gates) == [3]
    layer = model.model.layers[3]
    heads, head_dim = model.config.num_attention_heads, model.config.head_dim
    with torch.no_grad():
        x = layer.input_layernorm(hidden[3][0]).double()  # [N, d]: what the attention reads
        q = x @ layer.self_attn.q_proj.weight.double().T  # [N, heads x 2 x head_dim]
    want = torch.sigmoid(q.view(15, heads, 2 * head_dim)[:, :, head_dim:]).transpose(0, 1)
    assert gates[3].shape == (heads, 15, head_dim)
    _close(gates[3], want, rel=1e-5)
    _close(gate_map(gates[3]), want.mean(-1), rel=1e-5)
    stats = gate_stats(gates[3])
    _close(stats.mean, want.mean(dim=(1, 2)), rel=1e-5)
    share = torch.tensor([(want[h] < 0.1).double().mean().item() for h in range(heads)])
    assert torch.equal(stats.sparse.double(), share)
    assert 0 < share.max() < 1  # the random gates are neither all open nor all shut


def test_the_gate_is_what_the_layer_multiplies_by(monkeypatch):
    import transformers.models.qwen3_next.modeling_qwen3_next as source

    from attnviz.mixers.gates import record_gates

    model = mixer_models.build("qwen3_next")
    model.set_attn_implementation("eager")
    seen = {}
    eager = source.eager_attention_forward

    def softmax_output(*args, **kwargs):
        out, weights = eager(*args, **kwargs)
        seen["ungated"] = out[0].detach()  # [N, head, head_dim]
        return out, weights

    monkeypatch.setattr(source, "eager_attention_forward", softmax_output)
    attention = model.model.layers[3].self_attn
    attention.o_proj.register_forward_pre_hook(lambda _m, args: seen.setdefault("o_in", args[0][0].detach()))
    with record_gates(model) as gates, torch.no_grad():
        model(mixer_models.text_ids(15), use_cache=False)
    gated = seen["ungated"] * gates[3].transpose(0, 1)  # [N, head, head_dim]
    _close(gated.reshape(15, -1), seen["o_in"], rel=1e-6)
    assert not torch.allclose(seen["ungated"].reshape(15, -1), seen["o_in"], rtol=1e-2)  # the gate matters


def test_map_stats_on_maps_with_known_answers():
    import numpy as np

    from attnviz.mixers.stats import map_stats

    n = 12
    prev = np.zeros((1, n, n))
    prev[0, 0, 0] = 2.0
    prev[0, np.arange(1, n), np.arange(n - 1)] = -3.0  # all weight, negative, on the previous token
    tokens = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10]
    induction = np.zeros((1, n, n))
    induction[0, np.arange(n), np.arange(n)] = 1.0
    for q in range(6, n):
        induction[0, q] = 0.0
        induction[0, q, q - 5] = -0.5  # the token after the earlier copy of q's own token
        induction[0, q, q] = 0.5
    got_prev, got_ind = map_stats(prev, tokens), map_stats(induction, tokens)
    assert got_prev["prev_token"][0] == 1.0 and got_prev["half_mass_distance"][0] == 1
    assert got_ind["induction"][0] == 0.5  # half of each row's absolute weight on its target
    assert got_prev["distance_profile"].shape == (1, n)


def test_map_stats_of_a_recorded_layer_by_hand():
    import numpy as np

    from attnviz.mixers.stats import map_stats

    ids = mixer_models.text_ids(16)
    record = mixer_records(mixer_models.build("mamba2"), ids)[0]
    w = record.implicit_map(dtype=torch.float64).numpy()
    got = map_stats(w, ids[0].tolist())
    for h in range(w.shape[0]):
        a = [[abs(w[h, t, s]) / sum(abs(w[h, t, j]) for j in range(16)) for s in range(16)] for t in range(16)]
        assert np.isclose(got["prev_token"][h], sum(a[t][t - 1] for t in range(1, 16)) / 15, rtol=1e-12)
        for r in (0, 3, 15):
            assert np.isclose(got["distance_profile"][h, r], sum(a[t][t - r] for t in range(r, 16)) / (16 - r))


@pytest.mark.parametrize("size", [1, 2, 3, 5, 16, 17, 40, 128])
def test_unit_lower_inverse(size):
    from attnviz.mixers.delta import unit_lower_inverse

    a = (torch.randn(3, size, size, dtype=torch.float64, generator=torch.Generator().manual_seed(size)) * 0.2)
    a = a.tril(-1)
    got = unit_lower_inverse(a)
    assert torch.allclose(got @ (torch.eye(size, dtype=torch.float64) + a), torch.eye(size, dtype=torch.float64),
                          atol=1e-12)


def test_delta_map_with_strong_decay_keeps_its_digits():
    # a head that forgets within a few dozen tokens: its far keys' weights fall under 1e-30 and are set to 0 (they
    # would be subnormal floats); every other weight is the definition's
    q, k, _, g, beta = _delta_inputs(n=90)
    g = g * 10  # up to -20 per token
    want = delta_rule_map_naive(q, k, g, beta)
    got = delta_rule_map(q, k, g, beta, chunk=16)
    _close(got, want)
    assert (got[:, 80:, :10] == 0).all()


@pytest.mark.parametrize("name, mapped, skipped", [
    ("qwen3_next", [0, 1, 2], {}), ("falcon_h1", [0, 1], {}), ("nemotron_h", [0], {}),
    ("lfm2", [], {0: "conv"}), ("kimi_linear", [0], {}), ("deepseek_v32", [], {})])
def test_implicit_maps_name_what_they_skip(name, mapped, skipped):
    from attnviz.mixers.maps import implicit_maps

    found = implicit_maps(mixer_models.build(name), mixer_models.text_ids(12))
    assert sorted(found.maps) == mapped and found.skipped == skipped
    for layer, w in found.maps.items():
        _close(found.records[layer].mixed(w), found.records[layer].output)
    message = found.message()
    assert (message == "") == (not skipped)
    for layer, kind in skipped.items():
        assert f"layer {layer} ({kind})" in message


def test_a_cached_step_is_not_recorded():
    model = mixer_models.build("qwen3_next")
    ids = mixer_models.text_ids(10)
    with record_mixers(model) as records, torch.no_grad():
        first = model(ids[:, :6], use_cache=True)
        assert sorted(records) == [0, 1, 2]
        model(ids[:, 6:], past_key_values=first.past_key_values, use_cache=True)  # starts from the carried state
    assert records == {}  # the cached call has no exact map, and the earlier one is not passed off as its map
    with pytest.raises(MixerError):
        from attnviz.mixers.records import record_of
        record_of("torch_chunk_gated_delta_rule", 0, {"initial_state": torch.zeros(1)}, torch.zeros(1))
