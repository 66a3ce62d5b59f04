"""Tiny random models whose layers are not all softmax attention: Gated DeltaNet (Qwen3-Next, Qwen3.5), Mamba2
(Mamba2, Falcon-H1, Bamba, Nemotron-H, Granite 4), short convolutions (LFM2), an indexer (DeepSeek-V3.2). Built
from configs (nothing downloaded): hidden 32, 2-4 layers, a few heads; Mamba2 chunks of 8 so that a 20-token text
spans several chunks."""

from __future__ import annotations

import torch

_IDS = dict(vocab_size=257, bos_token_id=256, eos_token_id=256, pad_token_id=256, initializer_range=0.2)
_ATTN = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
_DELTA = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
              linear_conv_kernel_dim=4)
_MAMBA = dict(mamba_n_heads=4, mamba_d_state=8, mamba_n_groups=2, mamba_chunk_size=8)


def configs() -> dict:
    import transformers as tf

    return {
        "qwen3_next": tf.Qwen3NextConfig(**_ATTN, **_DELTA, num_hidden_layers=4, num_experts=2,
                                         num_experts_per_tok=1, moe_intermediate_size=16,
                                         shared_expert_intermediate_size=16,
                                         layer_types=["linear_attention"] * 3 + ["full_attention"], **_IDS),
        "qwen3_5_text": tf.Qwen3_5TextConfig(**_ATTN, **_DELTA, num_hidden_layers=2,
                                             layer_types=["linear_attention", "full_attention"], **_IDS),
        "mamba2": tf.Mamba2Config(hidden_size=32, num_hidden_layers=2, num_heads=4, head_dim=16, state_size=8,
                                  n_groups=2, expand=2, chunk_size=8, **_IDS),
        "falcon_h1": tf.FalconH1Config(**_ATTN, num_hidden_layers=2, mamba_d_ssm=32, mamba_d_head=8, **_MAMBA,
                                       **_IDS),
        "bamba": tf.BambaConfig(**{k: v for k, v in _ATTN.items() if k != "head_dim"}, num_hidden_layers=2,
                                mamba_d_head=16, attn_layer_indices=[1], **_MAMBA, **_IDS),
        "nemotron_h": tf.NemotronHConfig(**_ATTN, mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=8,
                                         n_groups=2, chunk_size=8, expand=2,
                                         layers_block_type=["mamba", "attention", "mlp"], n_routed_experts=2,
                                         num_experts_per_tok=1, moe_intermediate_size=16,
                                         moe_shared_expert_intermediate_size=16, **_IDS),
        "granitemoehybrid": tf.GraniteMoeHybridConfig(**{k: v for k, v in _ATTN.items() if k != "head_dim"},
                                                      num_hidden_layers=2, mamba_d_head=16, mamba_expand=2,
                                                      num_local_experts=2, num_experts_per_tok=1,
                                                      shared_intermediate_size=16,
                                                      layer_types=["mamba", "attention"], **_MAMBA, **_IDS),
        "deepseek_v32": tf.DeepseekV32Config(hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                             kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
                                             qk_nope_head_dim=8, v_head_dim=8, index_n_heads=2, index_head_dim=16,
                                             index_topk=4, n_routed_experts=2, num_experts_per_tok=1,
                                             n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
                                             **_IDS),
        # Kimi Delta Attention of 6 heads x 8 channels (transformers' defaults, 32 x 128, made a 12,288-channel
        # convolution), beside MLA softmax attention as small as DeepSeek-V3.2's above
        "kimi_linear": tf.KimiLinearConfig(hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                           linear_num_heads=6, linear_head_dim=8, kv_lora_rank=16,
                                           qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                                           num_experts=2, num_experts_per_token=1,
                                           layer_types=["linear_attention", "full_attention"], **_IDS),
        "lfm2": tf.Lfm2Config(**{k: v for k, v in _ATTN.items() if k != "head_dim"}, num_hidden_layers=2,
                              full_attn_idxs=[1], **_IDS),
    }


def build(name: str, seed: int = 0):
    """The tiny model `name` of configs(), random weights from `seed`, in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(configs()[name]).eval()


def text_ids(n: int = 20, seed: int = 1) -> torch.Tensor:
    """[1, n] random byte ids."""
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(seed))
