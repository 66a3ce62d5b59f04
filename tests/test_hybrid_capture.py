"""The newest families, each a tiny random model saved as a folder and captured as a user's folder is
(attnviz.capture(folder, text)): every softmax layer under its model layer number and equal to transformers' own
output_attentions, every linear mixer's implicit map rebuilding its kernel's output, each layer's kind as the config
names it, the output gate as q_proj makes it, and the layers without an exact map named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnviz
from attnviz.capture import CaptureError
from tests import mixer_models

TEXT = "A hybrid reads: the cat sat, the cat sat."
FAMILIES = ("qwen3_next", "qwen3_5_text", "mamba2", "falcon_h1", "bamba", "nemotron_h", "granitemoehybrid",
            "deepseek_v32", "kimi_linear", "lfm2")
# the kinds each config's layer_types (or, for Mamba2, its model type) name, written out here by hand
KINDS = {"qwen3_next": ("gated delta rule",) * 3 + ("gated softmax",),
         "qwen3_5_text": ("gated delta rule", "gated softmax"), "mamba2": ("mamba2", "mamba2"),
         "falcon_h1": ("softmax + mamba2",) * 2, "bamba": ("mamba2", "softmax"),
         "nemotron_h": ("mamba2", "softmax", "mlp"), "granitemoehybrid": ("mamba2", "softmax"),
         "deepseek_v32": ("indexed", "indexed"), "kimi_linear": ("gated delta rule", "softmax"),
         "lfm2": ("conv", "softmax")}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from attnviz.tokenizer import byte_tokenizer

    root = tmp_path_factory.mktemp("hybrids")
    for name in FAMILIES:
        mixer_models.build(name).save_pretrained(root / name)
        byte_tokenizer().save_pretrained(root / name)
    return root


@pytest.fixture(scope="module")
def captures(folders):
    return {name: attnviz.capture(str(folders / name), TEXT) for name in FAMILIES}


def _reference(folder, ids):
    """transformers' own eager run of the folder's model: (model, output_attentions per softmax layer)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False)
    return model, [a for a in (getattr(out, "attentions", None) or ()) if a is not None]


@pytest.mark.parametrize("name", FAMILIES)
def test_each_layer_is_named_by_its_kind(captures, name):
    cap = captures[name]
    assert tuple(cap.layer_kind(i) for i in range(len(KINDS[name]))) == KINDS[name]
    softmax = [i for i, kind in enumerate(KINDS[name]) if "softmax" in kind or kind == "indexed"]
    assert cap.layers == softmax  # model layer numbers: Qwen3-Next's attention is layer 3


@pytest.mark.parametrize("name", FAMILIES)
def test_softmax_layers_equal_transformers_output_attentions(folders, captures, name):
    cap = captures[name]
    _, attentions = _reference(folders / name, cap.token_ids)
    assert len(attentions) == len(cap.layers)
    for layer, expected in zip(cap.layers, attentions):
        np.testing.assert_allclose(cap.layer_rows(layer), expected[0].numpy(), atol=2e-6)


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5_text", "mamba2", "falcon_h1", "bamba", "nemotron_h",
                                  "granitemoehybrid", "kimi_linear"])
def test_linear_maps_rebuild_their_kernels_output(captures, name):
    cap = captures[name]
    mapped = [i for i, kind in enumerate(KINDS[name]) if kind in ("gated delta rule", "mamba2", "softmax + mamba2")]
    assert cap.linear_layers == mapped
    for layer in mapped:
        record = cap.mixers[layer]
        w = torch.from_numpy(np.stack([cap.head_pattern(layer, h, mixer="linear")
                                       for h in range(cap.layer_heads(layer, "linear"))]))
        rebuilt, output = record.mixed(w), record.output.float()
        assert torch.allclose(rebuilt, output, atol=2e-5 * float(output.abs().max()))
        assert np.array_equal(cap.layer_rows(layer, 3, 7, mixer="linear"), w[:, 3:7].numpy())
        assert cap.layer_heads(layer, "linear") == cap.maps[layer].shape[0] == record.output.shape[1]


def test_counting_a_linear_layers_heads_builds_no_map(folders):
    cap = attnviz.capture(str(folders / "mamba2"), TEXT)
    assert cap.layer_heads(0, "linear") == cap.mixers[0].output.shape[1] and 0 not in cap.maps


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5_text"])
def test_gate_is_sigmoid_of_q_projs_gate_half(folders, captures, name):
    cap = captures[name]
    model, _ = _reference(folders / name, cap.token_ids)
    layer = cap.layers[0]
    attention = model.model.layers[layer].self_attn
    seen = {}
    attention.q_proj.register_forward_hook(lambda _m, _a, out: seen.setdefault("q", out[0]))
    with torch.no_grad():
        model(input_ids=torch.tensor([cap.token_ids]), use_cache=False)
    heads, d = model.config.num_attention_heads, attention.head_dim
    gate = torch.sigmoid(seen["q"].view(-1, heads, 2 * d)[..., d:])  # [query, head, d]: the query's second half
    np.testing.assert_allclose(cap.gate(layer), gate.mean(-1).T.numpy(), atol=1e-6)
    with pytest.raises(CaptureError, match="no output gate"):
        cap.gate(0)


def test_layers_without_an_exact_map_are_named(captures):
    assert "layer 0 (conv)" in captures["lfm2"].skipped_message()
    assert captures["lfm2"].linear_layers == [] and captures["lfm2"].layers == [1]
    assert captures["qwen3_next"].skipped_message() == ""


def test_a_layer_of_an_unmapped_kind_is_refused_by_name_and_select_keeps_linear_layers(folders):
    with pytest.raises(CaptureError, match=r"does not map layer 0 \(conv\) exactly"):
        attnviz.capture(str(folders / "lfm2"), TEXT, layers=[0])
    assert attnviz.capture(str(folders / "lfm2"), TEXT, layers=[0, 1]).layers == [1]  # a range: the conv left out
    cap = attnviz.capture(str(folders / "qwen3_next"), TEXT, layers=[1, -1])
    assert cap.layers == [3] and cap.linear_layers == [1]
    whole = attnviz.capture(str(folders / "qwen3_next"), TEXT)
    narrowed = whole.select([2, 3])
    assert narrowed.layers == [3] and narrowed.linear_layers == [2] and list(narrowed.gates) == [3]
    np.testing.assert_array_equal(narrowed.head_pattern(2, 1), whole.head_pattern(2, 1))
    with pytest.raises(CaptureError):
        narrowed.head_pattern(1, 0)


@pytest.mark.parametrize("name", ["qwen3_next", "mamba2", "kimi_linear"])
def test_long_text_store_builds_map_rows_from_the_records(folders, captures, name):
    """The qk store keeps each linear layer's kernel call and builds the rows asked for a block at a time: equal to
    the pattern store's rows, for every head or some."""
    dense = captures[name]
    long = attnviz.capture(str(folders / name), TEXT, store="qk")
    assert long.maps is None and long.linear_layers == dense.linear_layers
    for layer in dense.linear_layers:
        np.testing.assert_allclose(long.layer_rows(layer, 2, 9, mixer="linear"),
                                   dense.layer_rows(layer, 2, 9, mixer="linear"), atol=1e-6)
        np.testing.assert_allclose(long.layer_rows(layer, 30, 41, heads=[3, 1], mixer="linear"),
                                   dense.layer_rows(layer, 30, 41, mixer="linear")[[3, 1]], atol=1e-6)


@pytest.mark.parametrize("name", ["qwen3_next", "mamba2", "kimi_linear"])
def test_layer_stats_streamed_from_the_record_equal_the_whole_maps(captures, name):
    from attnviz.capture.linear import layer_stats, streams_stats
    from attnviz.mixers.stats import map_stats

    cap = captures[name]
    layer = cap.linear_layers[0]
    assert streams_stats(cap, layer)  # every kind has a row-block form
    got, want = layer_stats(cap, layer), map_stats(cap.layer_rows(layer, mixer="linear"), cap.token_ids)
    for key in ("prev_token", "induction", "distance_profile"):
        np.testing.assert_allclose(got[key], want[key], atol=2e-5)


def test_softmax_only_models_are_unchanged(folders):
    from transformers import LlamaConfig, LlamaForCausalLM

    from attnviz.tokenizer import byte_tokenizer

    folder = folders / "llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=257, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2)).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    cap = attnviz.capture(str(folder), TEXT)
    assert cap.layers == [0, 1] and cap.layer_kinds is None and cap.linear_layers == [] and cap.layer_kind(1) == \
        "softmax"


def test_indexed_attention_keeps_its_selection_under_attnviz(folders, captures):
    """DeepSeek-V3.2 folds its indexer's top-k into the mask only for eager and SDPA; under attnviz's registered
    attention the selection still holds: the loaded model's logits are eager's, and the long-text store's rows
    (from q, k and the folded mask) are the dense pattern's, with keys outside the selection at zero."""
    from transformers import AutoModelForCausalLM

    from attnviz.models import load_model

    dense = captures["deepseek_v32"]
    ids = torch.tensor([dense.token_ids])
    eager = AutoModelForCausalLM.from_pretrained(folders / "deepseek_v32", attn_implementation="eager").eval()
    loaded = load_model(str(folders / "deepseek_v32"))
    with torch.no_grad():
        assert torch.allclose(loaded.model(input_ids=ids).logits, eager(input_ids=ids).logits, atol=1e-5)
    long = attnviz.capture(str(folders / "deepseek_v32"), TEXT, store="qk")
    for layer in dense.layers:
        rows = dense.layer_rows(layer)
        np.testing.assert_allclose(long.layer_rows(layer), rows, atol=2e-6)
        kept = (rows > 0).sum(-1)
        assert kept.max() == 4 and kept[:, 10:].min() == 4  # index_topk = 4: four keys each once past the start


def test_indexed_view_equals_the_indexers_own_selection(folders, captures):
    """The capture's view of an indexed head (from the q, k and folded mask it recorded) against
    tests.indexer_oracle's eager pass, which records the indexer's own top-k and transformers' eager weights."""
    from transformers import AutoModelForCausalLM

    from attnviz.capture.linear import indexed_view
    from tests.indexer_oracle import indexed_selection

    cap = captures["deepseek_v32"]
    model = AutoModelForCausalLM.from_pretrained(folders / "deepseek_v32").eval()
    selections = indexed_selection(model, torch.tensor([cap.token_ids]))
    for layer in cap.layers:
        for head in range(cap.n_heads):
            view, selection = indexed_view(cap, layer, head), selections[layer]
            assert np.array_equal(view.kept, selection.kept.numpy())
            np.testing.assert_allclose(view.pattern, selection.pattern[head].numpy(), atol=2e-6)
            np.testing.assert_allclose(view.dense, selection.dense[head].numpy(), atol=2e-6)
            np.testing.assert_allclose(view.outside, selection.outside[head].numpy(), atol=2e-6)
            assert view.outside.max() > 0.01  # the selection really dropped mass at this length
    with pytest.raises(CaptureError, match="not an indexed"):
        indexed_view(captures["qwen3_next"], 3, 0)


@pytest.mark.parametrize("name", ["qwen3_next", "mamba2"])
@pytest.mark.parametrize("suffix", ["npz", "safetensors"])
def test_capture_files_keep_the_linear_maps_and_kinds(captures, tmp_path, name, suffix):
    from attnviz.capture import load_capture, save_capture

    cap = captures[name]
    path = tmp_path / f"cap.{suffix}"
    cap.save(path)
    back = load_capture(path)
    assert back.layers == cap.layers and back.linear_layers == cap.linear_layers
    assert back.layer_kinds == cap.layer_kinds
    for layer in cap.linear_layers:
        np.testing.assert_array_equal(back.layer_rows(layer, mixer="linear"), cap.layer_rows(layer, mixer="linear"))
    for layer in cap.layers:
        np.testing.assert_array_equal(back.layer_rows(layer), cap.layer_rows(layer))
    if cap.layers:  # an export of some heads is of the softmax layers only
        save_capture(cap, tmp_path / f"head.{suffix}", heads=[0])
        assert load_capture(tmp_path / f"head.{suffix}").linear_layers == []


def test_a_capture_without_softmax_layers_has_no_head_statistics_and_says_so(captures):
    with pytest.raises(CaptureError, match="no softmax attention layer"):
        captures["mamba2"].stats()
    assert len(captures["qwen3_next"].stats()) == 4  # the softmax layer's 4 heads


def test_gated_weights_rows_sum_to_the_mean_gate(captures):
    """Each key's weight times the query's mean gate: a softmax row sums to 1, so a gated row sums to the gate."""
    from attnviz.mixers.gates import gated_weights

    cap = captures["qwen3_next"]
    pattern, gate = cap.layer_rows(3).astype(np.float64), cap.gate(3).astype(np.float64)
    weights = gated_weights(pattern, gate)
    np.testing.assert_allclose(weights.sum(-1), gate, atol=1e-6)
    np.testing.assert_allclose(weights[1, 5, 2], pattern[1, 5, 2] * float(cap.gates[3][1, 5].double().mean()),
                               rtol=1e-6)


def test_store_auto_keeps_q_and_k_for_a_long_text_without_attention(folders, monkeypatch):
    """A model without softmax attention (Mamba2) has nothing to record, so every store serves it: past MAX_TOKENS
    "auto" takes the qk store, whose maps are rebuilt from the record, equal to the pattern store's."""
    import attnviz.capture.run as run

    dense = attnviz.capture(str(folders / "mamba2"), TEXT)
    monkeypatch.setattr(run, "MAX_TOKENS", dense.n_tokens - 1)
    long = attnviz.capture(str(folders / "mamba2"), TEXT)
    assert (dense.store, long.store) == ("pattern", "qk") and long.linear_layers == dense.linear_layers
    for layer in dense.linear_layers:
        np.testing.assert_array_equal(long.layer_rows(layer, mixer="linear"), dense.layer_rows(layer, mixer="linear"))
