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


# ---------------------------------------------------------------- how position enters

SCHEMES = ("rope", "alibi", "learned", "sinusoidal", "other")


def position_scheme(config, folder=None) -> str:
    """How a transformers config encodes position: "alibi" (BLOOM, or an `alibi` flag as in MPT/Falcon), "rope"
    (a RoPE base in the config, as in Llama, Mistral, Qwen) or "other" (learned absolute, sinusoidal, none).

    folder: the model's folder, if it has one. A toy-lab folder (one holding lab.json, see attnviz.lab) says which
    of "learned" or "sinusoidal" its GPT-2 uses: both are GPT2LMHeadModel with the same config, the sinusoidal one
    with its position table wpe set to the Vaswani et al. encoding and frozen, which only lab.json records. Either
    way the positions are added to the token embeddings. The config decides whenever it says RoPE or ALiBi.
    """
    if getattr(config, "model_type", None) == "bloom" or getattr(config, "alibi", False) is True:
        return "alibi"
    if _rope_theta(config) is not None or getattr(config, "rotary_dim", None):  # GPT-J: rotary_dim, base 10,000
        return "rope"
    lab = lab_positional(folder) if folder is not None else None
    return lab if lab in ("learned", "sinusoidal") else "other"


def lab_positional(folder) -> str | None:
    """The positional scheme a toy-lab folder's lab.json records (config.positional: "learned", "sinusoidal",
    "rope" or "alibi"), or None when the folder has no readable lab.json or it names no known scheme."""
    import json
    from pathlib import Path

    from attnviz.lab.storage import LAB_FILE  # here: the lab package imports transformers' model classes (~3 s)

    try:
        info = json.loads((Path(folder) / LAB_FILE).read_text(encoding="utf-8"))
        scheme = info["config"]["positional"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return scheme if scheme in ("learned", "sinusoidal", "rope", "alibi") else None


def rope_settings(config) -> tuple[int, float]:
    """(d_head, base) of a transformers config that uses RoPE (Llama-style: rope_parameters or rope_theta)."""
    d_head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(d_head), float(_rope_theta(config) or 10000.0)


def _rope_theta(config) -> float | None:
    """The RoPE base of a config: rope_parameters["rope_theta"] (recent transformers), per layer type as Gemma 3
    writes it ({"full_attention": {...}, "sliding_attention": {...}}: the full-attention layers' base), or the
    older rope_theta attribute; None when the config names none."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict):
        if "rope_theta" in params:
            return float(params["rope_theta"])
        nested = params.get("full_attention") or next((v for v in params.values() if isinstance(v, dict)), None)
        if isinstance(nested, dict) and "rope_theta" in nested:
            return float(nested["rope_theta"])
    base = getattr(config, "rope_theta", None)
    return float(base) if base else None
