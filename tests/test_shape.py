"""attnviz.shape: config facts read once (the per-family checks against what each layer saw are in
test_families.py)."""

from attnviz import shape as S


def test_rope_settings_reads_llama_configs():
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=576, num_attention_heads=9, rope_parameters={"rope_type": "default",
                                                                                  "rope_theta": 100000.0})
    assert S.rope_settings(config) == (64, 100000.0)


def test_position_scheme_of_configs():
    from transformers import BertConfig, BloomConfig, GPT2Config, LlamaConfig

    assert S.position_scheme(BloomConfig()) == "alibi"
    assert S.position_scheme(LlamaConfig()) == "rope"
    assert S.position_scheme(GPT2Config()) == "other"
    assert S.position_scheme(BertConfig()) == "other"


def test_layer_facts_of_configs_without_a_model():
    """Chunked layers (Llama 4's layer_types), a sliding window on every layer (Mistral), per-type RoPE bases and a
    YaRN rescaling, and the summary a page shows."""
    from transformers import Gemma3TextConfig, MistralConfig, Qwen3Config

    chunked = Qwen3Config(num_hidden_layers=3, layer_types=["chunked_attention", "chunked_attention",
                                                            "full_attention"])
    chunked.attention_chunk_size = 8192
    facts = S.model_shape(chunked, causal=True).layer_facts
    want = [("chunked", 8192, "local")] * 2 + [("causal", None, "global")]
    assert [(f.mask, f.window, f.kind) for f in facts] == want
    mistral = S.model_shape(MistralConfig(num_hidden_layers=2, sliding_window=7), causal=True)
    assert [(f.mask, f.window) for f in mistral.layer_facts] == [("sliding", 7)] * 2
    assert mistral.kinds_summary() == ""  # one kind: nothing to tell apart
    gemma = S.model_shape(Gemma3TextConfig(num_hidden_layers=4, sliding_window=5, layer_types=[
        "sliding_attention", "sliding_attention", "full_attention", "sliding_attention"], rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}), causal=True)
    assert [f.rope_base for f in gemma.layer_facts] == [1e4, 1e4, 1e6, 1e4]
    assert gemma.layer_facts[2].rope_type == "linear" and gemma.local_layers == [0, 1, 3]
    assert gemma.kinds_summary() == ("Local layers 0–1, 3 (sliding window 5, RoPE base 10000); global layer 2 "
                                     "(causal, RoPE base 1e+06 (linear))")
    assert gemma.relative_depth() == [0, 1 / 3, 2 / 3, 1]
    encoder = S.model_shape(MistralConfig(num_hidden_layers=1, sliding_window=None), causal=False)
    assert encoder.layer_facts[0].mask == "full" and encoder.layer_kind(0) == "global"


def test_spans():
    assert S.spans([0, 1, 2, 4, 6, 7]) == "0–2, 4, 6–7" and S.spans([5]) == "5" and S.spans([]) == ""


def test_a_layers_heads_are_the_models_whatever_key_holds_them():
    """A config whose only head count is `num_heads` (no alias to num_attention_heads): its softmax layers report
    the heads the model has, not None."""
    from transformers import PretrainedConfig

    config = PretrainedConfig(num_heads=6, hidden_size=48, num_hidden_layers=2)
    assert not hasattr(config, "num_attention_heads")
    shape = S.model_shape(config, causal=True)
    assert shape.heads == 6 and shape.head_dim == 8
    assert [(f.mixer, f.heads, f.state) for f in shape.layer_facts] == [("softmax", 6, None)] * 2


def test_layer_sizes_under_each_familys_keys():
    """Heads and state (numbers carried token to token) from the keys each family spells them with, written out by
    hand: heads x d_k x d_v for a gated delta rule, heads x d_state x head_dim for Mamba2, hidden x (kernel - 1)
    for a short convolution."""
    from types import SimpleNamespace as C

    from tests import mixer_models

    assert S.layer_sizes(C(linear_num_heads=3, linear_head_dim=5), "gated delta rule") == (3, 3 * 5 * 5)
    assert S.layer_sizes(C(linear_num_value_heads=4, linear_key_head_dim=2, linear_value_head_dim=7),
                         "gated delta rule") == (4, 4 * 2 * 7)
    assert S.layer_sizes(C(linear_num_value_heads=4), "gated delta rule") == (4, None)  # no head dims: unknown
    assert S.layer_sizes(C(mamba_num_heads=2, ssm_state_size=3, mamba_head_dim=5), "mamba2") == (2, 30)
    assert S.layer_sizes(C(num_heads=2, state_size=3, head_dim=5), "mamba2") == (2, 30)  # Mamba2's own config
    assert S.layer_sizes(C(n_embd=10, conv_L_cache=4), "conv") == (None, 10 * 3)
    assert S.layer_sizes(C(text_config=C(n_head=3)), "softmax") == (3, None)  # a multimodal config's text part
    assert S.layer_sizes(C(num_attention_heads=3), "mlp") == (None, None)
    # Falcon-H1: attention (4 heads) beside a Mamba2 mixer of 4 heads, d_state 8, head_dim 8 (tests/mixer_models)
    falcon = S.model_shape(mixer_models.configs()["falcon_h1"], causal=True)
    assert [(f.mixer, f.heads, f.state) for f in falcon.layer_facts] == [("softmax + mamba2", 4, 4 * 8 * 8)] * 2
    # Nemotron-H: mamba_num_heads 4, ssm_state_size 8, mamba_head_dim 16; then attention; then an MLP layer
    nemotron = S.model_shape(mixer_models.configs()["nemotron_h"], causal=True)
    assert [(f.mixer, f.heads, f.state) for f in nemotron.layer_facts] == [
        ("mamba2", 4, 4 * 8 * 16), ("softmax", 4, None), ("mlp", None, None)]
