"""ModelShape: the facts of a model's configuration that attnviz reads, computed once when the model is loaded.

transformers families spell the same fact several ways (num_attention_heads / n_head / n_heads, hidden_size /
n_embd / d_model, num_key_value_heads / num_kv_heads / multi_query, max_position_embeddings / n_positions). This
module reads them in one place, as TransformerLens' config object does; everything else reads `loaded.shape`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


class ShapeError(ValueError):
    """A configuration does not say one of the facts attnviz needs."""


@dataclass(frozen=True)
class ModelShape:
    """family: config.model_type; layers, heads, kv_heads (GQA/MQA: fewer than heads); head_dim: the width of q
    and k per head (MLA: nope + rope parts); d_model: the residual width; max_positions: the longest input the
    model takes (None: no learned limit, as ALiBi); causal: a decoder; position: "rope", "alibi", "learned",
    "sinusoidal" or "other"; rope_base: RoPE's theta base where position == "rope"; vocab: vocabulary size."""

    family: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    d_model: int
    max_positions: int | None
    causal: bool
    position: str
    rope_base: float | None
    vocab: int

    @property
    def kv_head_of(self) -> list[int]:
        """For each query head, the key/value head it reads."""
        from attnviz.attention import kv_head_of

        return kv_head_of(self.heads, self.kv_heads)

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (1 for MHA, heads for MQA)."""
        return self.heads // self.kv_heads


def _first(config, keys, default=None):
    for key in keys:
        value = getattr(config, key, None)
        if value:
            return value
    return default


def n_heads(config) -> int:
    value = _first(config, ("num_attention_heads", "n_head", "n_heads"))
    if value is None:
        raise ShapeError(f"Cannot tell how many heads {type(config).__name__} has.")
    return int(value)


def hidden_size(config) -> int:
    value = _first(config, ("hidden_size", "n_embd", "d_model", "dim"))
    if value is None:
        raise ShapeError(f"Cannot tell the hidden size of {type(config).__name__}.")
    return int(value)


def n_kv_heads(config) -> int:
    """How many key/value heads the config's attention has."""
    if getattr(config, "multi_query", False) and not getattr(config, "new_decoder_architecture", False):
        return 1  # GPT-BigCode (StarCoder), Falcon-7B: one KV head. Falcon-40B sets both and uses num_kv_heads.
    value = _first(config, ("num_key_value_heads", "num_kv_heads", "n_head_kv"))  # Llama & most; Falcon; Falcon-RW
    return int(value) if value else n_heads(config)


def qk_head_dim(config) -> int:
    """Width of q and k per head: head_dim, or hidden / heads; MLA (DeepSeek-V3) uses nope + rope parts."""
    d = getattr(config, "head_dim", None) or hidden_size(config) // n_heads(config)
    mla = (getattr(config, "qk_nope_head_dim", 0) or 0) + (getattr(config, "qk_rope_head_dim", 0) or 0)
    return int(mla or d)


def position_limit(config) -> int:
    """The longest input: max_position_embeddings / n_positions, or sys.maxsize (ALiBi has no learned limit)."""
    value = _first(config, ("max_position_embeddings", "n_positions"))
    return int(value) if value else sys.maxsize


def model_shape(config, *, causal: bool | None = None, folder=None) -> ModelShape:
    """The ModelShape of a transformers config. causal: whether the model is a decoder (when the caller knows it
    from the model class); folder: the model's folder, where a toy-lab lab.json records its positional scheme."""
    from attnviz.positional import position_scheme, rope_settings

    if causal is None:
        causal = not (getattr(config, "model_type", "") in ("bert", "roberta", "distilbert", "electra")
                      or getattr(config, "is_encoder_decoder", False))
    limit = position_limit(config)
    scheme = position_scheme(config, folder)
    return ModelShape(
        family=str(getattr(config, "model_type", "unknown")), layers=int(_first(
            config, ("num_hidden_layers", "n_layer", "n_layers", "num_layers"), 0)),
        heads=n_heads(config), kv_heads=n_kv_heads(config), head_dim=qk_head_dim(config),
        d_model=hidden_size(config), max_positions=None if limit == sys.maxsize else limit, causal=bool(causal),
        position=scheme, rope_base=rope_settings(config)[1] if scheme == "rope" else None,
        vocab=int(getattr(config, "vocab_size", 0) or 0))
