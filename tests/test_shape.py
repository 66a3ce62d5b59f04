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
