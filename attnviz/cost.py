"""What attention costs: KV-cache bytes, FLOPs, parameter counts, and model presets built from config values.

Conventions
- A multiply-add counts as 2 FLOPs, so [m, k] @ [k, n] costs 2 m k n.
- The KV cache holds one key and one value vector of head_dim numbers per layer, KV head and token:
  2 * layers * kv_heads * head_dim * seq_len * batch * bytes_per_value.
- Parameter counts add up weight matrices, biases, norms and embeddings of one architecture description
  (`Architecture`), which `arch_from_config` reads off a transformers config. Presets are config values
  (as in each model's config.json), never totals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from attnviz.errors import AttnvizError
from attnviz.shape import model_shape


class CostError(AttnvizError, ValueError):
    """A cost cannot be counted as asked (a negative size, a family attnviz does not count); the message says why."""


def kv_cache_bytes(*, layers: int, kv_heads: int, head_dim: int, seq_len: int, batch: int = 1,
                   bytes_per_value: int | float = 2) -> int:
    """Bytes to cache keys and values: 2 (K and V) * layers * kv_heads * head_dim * seq_len * batch * bytes.

    bytes_per_value: 2 for fp16/bf16, 4 for fp32, 1 for int8/fp8, 0.5 for 4-bit.
    """
    for name, value in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim),
                        ("seq_len", seq_len), ("batch", batch)):
        if int(value) != value or value < 0:
            raise CostError(f"{name} must be a non-negative integer, got {value!r}")
    if bytes_per_value <= 0:
        raise CostError(f"bytes_per_value must be positive, got {bytes_per_value!r}")
    values = 2 * int(layers) * int(kv_heads) * int(head_dim) * int(seq_len) * int(batch)
    return int(round(values * bytes_per_value))


def attention_flops(*, seq_len: int, d_model: int, causal: bool = False, kv_dim: int | None = None) -> dict:
    """FLOPs of one self-attention layer on seq_len tokens (a multiply-add = 2 FLOPs).

    projections: Q and O are [N, d] @ [d, d] (2 N d^2 each); K and V are [N, d] @ [d, kv_dim] (2 N d kv_dim each),
      so 8 N d^2 for multi-head attention (kv_dim = d) and 4 N d (d + kv_dim) with fewer KV heads.
    attention: Q K^T summed over heads is [N, d] x [d, N] (2 N^2 d), pattern @ V likewise (2 N^2 d): 4 N^2 d.
      With a causal mask only half the (query, key) pairs are needed, so the attention term is halved.
    Softmax, scaling and masking (O(N^2) element-wise work) are left out, as in the usual matmul count.
    Returns {"projections", "attention", "total"}.
    """
    n, d = int(seq_len), int(d_model)
    kv = d if kv_dim is None else int(kv_dim)
    projections = 4 * n * d * (d + kv)
    attention = 4 * n * n * d
    if causal:
        attention //= 2
    return {"projections": projections, "attention": attention, "total": projections + attention}


def crossover_seq_len(*, d_model: int, causal: bool = False, kv_dim: int | None = None) -> float:
    """The N at which the attention matmuls cost as much as the projections.

    4 N d (d + kv_dim) = c 4 N^2 d  =>  N = (d + kv_dim) / c, with c = 1 (or 1/2 when causal):
    N = 2 d for multi-head attention, 4 d when causal.
    """
    kv = d_model if kv_dim is None else kv_dim
    return float(d_model + kv) * (2.0 if causal else 1.0)


@dataclass(frozen=True)
class Architecture:
    """Everything parameter, KV-cache and FLOP counts need to know about a transformer.

    positions: rows of a learned absolute position table (0 for RoPE or ALiBi).
    norm: "layernorm" has a weight and a bias per feature, "rmsnorm" a weight only.
    """

    name: str
    family: str
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    head_dim: int
    d_ff: int
    vocab: int
    positions: int = 0
    token_types: int = 0
    gated_mlp: bool = False
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    norm: str = "layernorm"
    norms_per_layer: int = 2
    embedding_norm: bool = False
    final_norm: bool = True
    lm_head: bool = True
    tied_embeddings: bool = True
    pooler: bool = False
    context: int = 0

    @property
    def variant(self) -> str:
        if self.kv_heads == self.heads:
            return "MHA"
        return "MQA" if self.kv_heads == 1 else "GQA"


def param_counts(arch: Architecture) -> dict[str, int]:
    """Parameters by part, and "total". Each linear map [d_in -> d_out] has d_in d_out weights (+ d_out biases).

    attention per layer: Q [d -> heads hd], K and V [d -> kv_heads hd], O [heads hd -> d].
    mlp per layer: gated (SwiGLU: gate, up, down) 3 d d_ff, else 2 d d_ff.
    norms: norms_per_layer per layer plus a final one; a LayerNorm has 2 d, an RMSNorm d.
    embeddings: vocab d tokens, + positions d, + token types d, + an embedding norm.
    lm_head: vocab d unless tied to the token embedding (then it adds nothing) or absent (encoders).
    pooler: BERT's [d -> d] dense layer with bias.
    """
    d, hd = arch.d_model, arch.head_dim
    q_out, kv_out = arch.heads * hd, arch.kv_heads * hd
    norm_size = 2 * d if arch.norm == "layernorm" else d

    attention = d * q_out + 2 * d * kv_out + q_out * d
    if arch.qkv_bias:
        attention += q_out + 2 * kv_out
    if arch.out_bias:
        attention += d

    if arch.gated_mlp:
        mlp = 3 * d * arch.d_ff + (2 * arch.d_ff + d if arch.mlp_bias else 0)
    else:
        mlp = 2 * d * arch.d_ff + (arch.d_ff + d if arch.mlp_bias else 0)

    embeddings = (arch.vocab + arch.positions + arch.token_types) * d
    if arch.embedding_norm:
        embeddings += norm_size
    norms = arch.layers * arch.norms_per_layer * norm_size + (norm_size if arch.final_norm else 0)
    lm_head = arch.vocab * d if arch.lm_head and not arch.tied_embeddings else 0
    pooler = d * d + d if arch.pooler else 0

    counts = {
        "embeddings": embeddings,
        "attention": arch.layers * attention,
        "mlp": arch.layers * mlp,
        "norms": norms,
        "lm_head": lm_head,
        "pooler": pooler,
    }
    counts["total"] = sum(counts.values())
    return counts


LLAMA_LIKE = ("llama", "mistral", "qwen2")


def arch_from_config(config, name: str | None = None) -> Architecture:
    """Reads an Architecture off a transformers PretrainedConfig, or off config.json values in a dict
    (bert, gpt2, bloom and Llama-like decoders).

    Layers, heads, KV heads, head dim, width, vocabulary and context are the config's ModelShape
    (attnviz.shape.model_shape, which knows each family's spelling); the rest (MLP width, biases, norms, position
    tables) is read here per family. Llama-like (llama, mistral, qwen2, or any config with rms_norm_eps and
    intermediate_size): RMSNorm, gated MLP, RoPE, biases as the config says. Raises ValueError for a model type it
    does not know how to count.
    """
    if isinstance(config, Mapping):
        config = SimpleNamespace(**config)
    mt = getattr(config, "model_type", "")
    name = name or getattr(config, "name_or_path", "") or mt
    shape = model_shape(config)
    d = shape.d_model
    common = dict(name=name, layers=shape.layers, d_model=d, heads=shape.heads, kv_heads=shape.kv_heads,
                  head_dim=shape.head_dim, vocab=shape.vocab, context=shape.max_positions or 0,
                  tied_embeddings=bool(getattr(config, "tie_word_embeddings", True)))
    if mt == "bert":
        if getattr(config, "position_embedding_type", "absolute") != "absolute":
            raise CostError("only BERT with absolute position embeddings is counted")
        return Architecture(
            family="bert", d_ff=int(config.intermediate_size), positions=int(config.max_position_embeddings),
            token_types=int(config.type_vocab_size), qkv_bias=True, out_bias=True, mlp_bias=True, norm="layernorm",
            embedding_norm=True, final_norm=False, lm_head=False, pooler=True, **common)
    if mt == "gpt2":
        return Architecture(
            family="gpt2", d_ff=int(config.n_inner or 4 * d), positions=int(config.n_positions), qkv_bias=True,
            out_bias=True, mlp_bias=True, norm="layernorm", final_norm=True, lm_head=True, **common)
    if mt == "bloom":
        return Architecture(
            family="bloom", d_ff=4 * d, qkv_bias=True, out_bias=True, mlp_bias=True, norm="layernorm",
            embedding_norm=True, final_norm=True, lm_head=True, **common)
    if mt in LLAMA_LIKE or (hasattr(config, "intermediate_size") and hasattr(config, "rms_norm_eps")):
        bias = bool(getattr(config, "attention_bias", False))
        return Architecture(
            family=mt, d_ff=int(config.intermediate_size), gated_mlp=True, qkv_bias=bias or mt == "qwen2",
            out_bias=bias, mlp_bias=bool(getattr(config, "mlp_bias", False)), norm="rmsnorm", final_norm=True,
            lm_head=True, **common)
    raise CostError(f"don't know how to count parameters of model type {mt!r}")


# Config values as in each model's published config (config.json on the Hugging Face hub, or the paper's table).
# model_type picks the transformers config class; every other key is that class's own argument name.
PRESETS: dict[str, dict] = {
    "BERT-base": dict(  # google-bert/bert-base-uncased config.json; Devlin et al. 2019, §3
        model_type="bert", hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        vocab_size=30522, max_position_embeddings=512, type_vocab_size=2),
    "BERT-large": dict(  # google-bert/bert-large-uncased config.json
        model_type="bert", hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
        vocab_size=30522, max_position_embeddings=512, type_vocab_size=2),
    "GPT-2 small": dict(  # openai-community/gpt2 config.json
        model_type="gpt2", n_embd=768, n_layer=12, n_head=12, n_inner=None, vocab_size=50257, n_positions=1024,
        tie_word_embeddings=True),
    "GPT-3 175B": dict(  # Brown et al. 2020, Table 2.1 ("the same model and architecture as GPT-2"), 4x MLP
        model_type="gpt2", n_embd=12288, n_layer=96, n_head=96, n_inner=4 * 12288, vocab_size=50257,
        n_positions=2048, tie_word_embeddings=True),
    "Llama-2-7B": dict(  # meta-llama/Llama-2-7b-hf config.json
        model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
        intermediate_size=11008, vocab_size=32000, max_position_embeddings=4096, tie_word_embeddings=False),
    "Llama-2-70B": dict(  # meta-llama/Llama-2-70b-hf config.json (GQA: 8 KV heads)
        model_type="llama", hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
        intermediate_size=28672, vocab_size=32000, max_position_embeddings=4096, tie_word_embeddings=False),
    "Mistral-7B": dict(  # mistralai/Mistral-7B-v0.1 config.json; Jiang et al. 2023, Table 1
        model_type="mistral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=14336, vocab_size=32000, max_position_embeddings=32768,
        tie_word_embeddings=False),
    "SmolLM2-135M": dict(  # HuggingFaceTB/SmolLM2-135M config.json
        model_type="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
        intermediate_size=1536, vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True),
}


def preset_config(name: str):
    """The transformers PretrainedConfig of a preset, built from its config values."""
    from transformers import AutoConfig

    values = dict(PRESETS[name])
    return AutoConfig.for_model(values.pop("model_type"), **values)


def preset_arch(name: str) -> Architecture:
    """The Architecture of a preset, read off its config values as off any loaded model's config (without
    importing transformers; the tests check both routes give the model transformers builds)."""
    return arch_from_config(PRESETS[name], name=name)


def kv_cache_curve(arch: Architecture, seq_lens, *, batch: int = 1, bytes_per_value: float = 2) -> np.ndarray:
    """kv_cache_bytes of arch at each context length in seq_lens. Returns float64 [len(seq_lens)] (bytes)."""
    return np.array([kv_cache_bytes(layers=arch.layers, kv_heads=arch.kv_heads, head_dim=arch.head_dim,
                                    seq_len=int(n), batch=batch, bytes_per_value=bytes_per_value)
                     for n in seq_lens], dtype=np.float64)


def format_bytes(n: float) -> str:
    """Binary units: 1 KiB = 1024 B, 1 MiB = 1024 KiB, ..."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    value, i = float(n), 0
    while abs(value) >= 1024 and i < len(units) - 1:
        value /= 1024
        i += 1
    return f"{value:.0f} {units[i]}" if i == 0 else f"{value:.2f} {units[i]}"
