"""Tiny GGUF files written in the tests, the way llama.cpp's converter writes a Llama: the toy-llama-gqa model's
weights (2 layers, 4 query / 2 KV heads) under GGUF's tensor names, q and k rows permuted for llama.cpp's RoPE,
weight matrices in F32 or quantized by gguf.quants, and a byte-level tokenizer with the toy's 257 ids.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType
from gguf.quants import quantize

F32, F16, Q8_0 = GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.Q8_0

_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}
_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(key: str) -> str:
    """GGUF's name of a Llama state-dict key: model.layers.1.self_attn.q_proj.weight -> blk.1.attn_q.weight."""
    if key in _NAMES:
        return _NAMES[key]
    _, _, layer, *module, _ = key.split(".")
    return f"blk.{layer}.{_LAYER['.'.join(module)]}.weight"


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's reordering of q and k rows (convert_hf_to_gguf.py, LlamaModel.permute): each head's two halves
    interleaved, for its RoPE that rotates adjacent pairs. transformers undoes it when it reads the file."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama(path: Path, model, tokenizer, matrices=F32, embeddings=None, arch: str = "llama",
                tokenizer_model: str = "gpt2") -> Path:
    """Writes `model` (a LlamaForCausalLM) as a GGUF file: 2-D weights in `matrices`, the token embeddings in
    `embeddings` (default: `matrices`), 1-D norms in F32, as llama.cpp writes them."""
    cfg = model.config
    writer = GGUFWriter(str(path), arch)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_file_type(LlamaFileType.ALL_F32 if matrices == F32 else LlamaFileType.MOSTLY_Q8_0)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_token_list(tokenizer.convert_ids_to_tokens(list(range(257))))
    writer.add_token_types([1] * 256 + [3])  # the bytes are normal tokens, <bos> a control token
    writer.add_token_scores([0.0] * 257)  # no merges: one token per byte, as the toy's own tokenizer
    writer.add_bos_token_id(256)
    writer.add_eos_token_id(256)
    writer.add_add_bos_token(True)
    for key, value in model.state_dict().items():
        name = gguf_name(key)
        w = value.detach().numpy().astype(np.float32)
        if name.endswith("attn_q.weight"):
            w = permute(w, cfg.num_attention_heads)
        elif name.endswith("attn_k.weight"):
            w = permute(w, cfg.num_key_value_heads)
        kind = (embeddings or matrices) if name == "token_embd.weight" else matrices if w.ndim == 2 else F32
        if kind == F32:
            writer.add_tensor(name, np.ascontiguousarray(w))
        elif kind == F16:
            writer.add_tensor(name, w.astype(np.float16))
        else:
            writer.add_tensor(name, quantize(w, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
