"""Tiny randomly initialised models of many transformers families, saved as a user's model folder would be.

build_family(name, root) writes root/<name>/ with safetensors weights, config.json and the byte tokenizer of
attnviz.tokenizer, so that attnviz.models.load_model(str(folder)) loads it exactly as it loads a user's folder.
Every model has 2 layers, a hidden size of 32-64 and a handful of heads; GQA (fewer KV heads than query heads)
wherever the family has it. Weights are drawn from a fixed seed. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import torch

SEED = 0
SLIDING_WINDOW = 8  # smaller than the test text, so that sliding-window layers really mask

# vocabulary: the 257 ids of attnviz.tokenizer.byte_tokenizer (256 bytes and <bos> = 256)
_IDS = dict(vocab_size=257, bos_token_id=256, eos_token_id=256, pad_token_id=256)
# a larger initializer range than the usual 0.02, so that random heads are not all uniform
_INIT = dict(initializer_range=0.2)
_LLAMA_LIKE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=512, **_IDS, **_INIT)
_ENCODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=512, type_vocab_size=2, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, vocab_size=257, pad_token_id=256, **_INIT)
_SLIDING_FULL = ["sliding_attention", "full_attention"]


def _configs() -> dict[str, tuple[str, object]]:
    """name -> ("causal" or "encoder", config)."""
    import transformers as tf

    return {
        "llama": ("causal", tf.LlamaConfig(**_LLAMA_LIKE)),
        "mistral": ("causal", tf.MistralConfig(**_LLAMA_LIKE, sliding_window=SLIDING_WINDOW)),
        "qwen2": ("causal", tf.Qwen2Config(**_LLAMA_LIKE)),
        "qwen3": ("causal", tf.Qwen3Config(**_LLAMA_LIKE, head_dim=24)),
        "gemma": ("causal", tf.GemmaConfig(**_LLAMA_LIKE, head_dim=8)),
        "gemma2": ("causal", tf.Gemma2Config(**_LLAMA_LIKE, head_dim=16, query_pre_attn_scalar=16,
                                             attn_logit_softcapping=3.0, final_logit_softcapping=30.0,
                                             sliding_window=SLIDING_WINDOW, layer_types=_SLIDING_FULL)),
        "gemma3_text": ("causal", tf.Gemma3TextConfig(**_LLAMA_LIKE, head_dim=16, query_pre_attn_scalar=16,
                                                      sliding_window=SLIDING_WINDOW, layer_types=_SLIDING_FULL)),
        "gpt_neox": ("causal", tf.GPTNeoXConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                                num_attention_heads=4, max_position_embeddings=512,
                                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                 "partial_rotary_factor": 0.5},
                                                **_IDS, **_INIT)),
        "opt": ("causal", tf.OPTConfig(hidden_size=64, ffn_dim=96, num_hidden_layers=2, num_attention_heads=4,
                                       max_position_embeddings=512, word_embed_proj_dim=64, dropout=0.0,
                                       init_std=0.2, **_IDS)),
        # Falcon-40B's layout: the new decoder architecture, multi_query=True and num_kv_heads KV heads (GQA)
        "falcon": ("causal", tf.FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                             num_kv_heads=2, new_decoder_architecture=True, multi_query=True,
                                             max_position_embeddings=512, **_IDS, **_INIT)),
        # Falcon-7B's layout: the old decoder, one KV head (multi_query), attention and MLP in parallel
        "falcon_mqa": ("causal", tf.FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                 new_decoder_architecture=False, multi_query=True,
                                                 parallel_attn=True, max_position_embeddings=512, **_IDS, **_INIT)),
        # Falcon-RW's layout: ALiBi instead of RoPE, one KV head per head, sequential attention and MLP, biases
        "falcon_alibi": ("causal", tf.FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                   new_decoder_architecture=False, multi_query=False,
                                                   parallel_attn=False, alibi=True, bias=True,
                                                   max_position_embeddings=512, **_IDS, **_INIT)),
        "gpt_oss": ("causal", tf.GptOssConfig(**{**_LLAMA_LIKE, "intermediate_size": 32}, head_dim=16,
                                              num_local_experts=2, num_experts_per_tok=1,
                                              sliding_window=SLIDING_WINDOW, layer_types=_SLIDING_FULL,
                                              rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                               "beta_fast": 32.0, "beta_slow": 1.0,
                                                               "truncate": False, "rope_theta": 150000.0,
                                                               "original_max_position_embeddings": 128})),
        "olmo2": ("causal", tf.Olmo2Config(**_LLAMA_LIKE)),
        "stablelm": ("causal", tf.StableLmConfig(**_LLAMA_LIKE, use_qkv_bias=True)),
        "granite": ("causal", tf.GraniteConfig(**_LLAMA_LIKE, attention_multiplier=0.3, embedding_multiplier=2.0,
                                               residual_multiplier=0.5, logits_scaling=2.0)),
        "cohere": ("causal", tf.CohereConfig(**_LLAMA_LIKE, use_qk_norm=True)),
        "gptj": ("causal", tf.GPTJConfig(n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_inner=96,
                                         n_positions=512, **_IDS, **_INIT)),
        "gpt_bigcode": ("causal", tf.GPTBigCodeConfig(n_embd=64, n_layer=2, n_head=4, n_inner=96, n_positions=512,
                                                      multi_query=True, **_IDS, **_INIT)),
        "deepseek_v3": ("causal", tf.DeepseekV3Config(
            hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8,
            qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
            first_k_dense_replace=1, max_position_embeddings=512, **_IDS, **_INIT,
            # YaRN with mscale_all_dim: the attention's scaling is not 1/sqrt(d) (DeepSeek's softmax_scale)
            rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                             "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                             "rope_theta": 10000.0})),
        "gpt2": ("causal", tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=512, **_IDS, **_INIT)),
        "bloom": ("causal", tf.BloomConfig(hidden_size=64, n_layer=2, n_head=4, **_IDS, **_INIT)),
        "bert": ("encoder", tf.BertConfig(**_ENCODER)),
        "roberta": ("encoder", tf.RobertaConfig(**_ENCODER)),
        "distilbert": ("encoder", tf.DistilBertConfig(dim=32, hidden_dim=64, n_layers=2, n_heads=4, dropout=0.0,
                                                       attention_dropout=0.0, max_position_embeddings=512,
                                                       vocab_size=257, pad_token_id=256, **_INIT)),
        "electra": ("encoder", tf.ElectraConfig(**_ENCODER, embedding_size=24)),
    }


FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "gpt_neox", "opt", "falcon",
            "gpt_oss", "olmo2", "stablelm", "granite", "cohere", "gptj", "gpt_bigcode", "deepseek_v3", "gpt2",
            "bloom", "bert", "roberta", "distilbert", "electra")
# more layouts of one family, checked as the families are: name -> the family (its config's model_type)
LAYOUTS = {"falcon_mqa": "falcon", "falcon_alibi": "falcon"}
CHECKED = FAMILIES + tuple(LAYOUTS)
ENCODERS = ("bert", "roberta", "distilbert", "electra")
# the key/value heads of each family's tiny model (4 query heads everywhere): GQA 2 where the family has it, MQA 1
KV_HEADS = {name: 4 for name in CHECKED} | {name: 2 for name in (
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "falcon", "gpt_oss", "olmo2", "stablelm",
    "granite", "cohere")} | {"gpt_bigcode": 1, "falcon_mqa": 1, "falcon_alibi": 4}


def build_family(name: str, root: Path) -> Path:
    """Builds family `name`'s tiny model (fixed seed) and saves it, with the byte tokenizer, in root/name."""
    from transformers import AutoModel, AutoModelForCausalLM

    from attnviz.tokenizer import byte_tokenizer

    kind, config = _configs()[name]
    auto = AutoModel if kind == "encoder" else AutoModelForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = auto.from_config(config, attn_implementation="eager", dtype=torch.float32)
        with torch.no_grad():
            for module_name, param in model.named_parameters():
                if module_name.endswith("sinks"):  # learned sink logits large enough to take a visible share
                    param.copy_(torch.randn_like(param) * 2.0)
    folder = Path(root) / name
    model.save_pretrained(folder, safe_serialization=True)
    byte_tokenizer().save_pretrained(folder)
    return folder
