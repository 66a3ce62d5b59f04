"""Each layer's token mixer, named: "softmax", "gated softmax" (a sigmoid gate on each head's output, Qwen3-Next
and Qwen3.5), "gated delta rule" (Gated DeltaNet; Kimi Delta Attention), "mamba2" (SSD), "conv" (LFM2's short
convolutions), "indexed" (DeepSeek-V3.2's top-k selection before MLA). Two more where a model has them:
"softmax + mamba2" (Falcon-H1 runs both side by side in every layer) and "mlp" (a layer with no token mixer,
Nemotron-H's MLP and MoE layers). A layer type attnviz does not know is named "unknown (<its type>)", never guessed.

`layer_kinds` reads the config (its layer_types, by family); `module_kinds` reads the modules each layer holds. The
two are independent readings, and the tests hold them equal."""

from __future__ import annotations

import torch

from attnviz.mixers.layers import layer_stack, n_layers

KINDS = ("softmax", "gated softmax", "gated delta rule", "mamba2", "conv", "indexed", "softmax + mamba2", "mlp")

GATED_FAMILIES = {"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}
DELTA_FAMILIES = GATED_FAMILIES | {"kimi_linear"}
MAMBA2_FAMILIES = {"mamba2", "bamba", "nemotron_h", "granitemoehybrid", "falcon_h1", "zamba2"}
RECURRENT_FAMILIES = {"mamba": "unknown (mamba)", "falcon_mamba": "unknown (mamba)", "rwkv": "unknown (rwkv)"}
_SOFTMAX_TYPES = {"full_attention", "sliding_attention", "chunked_attention", "attention"}


def _kind(family: str, layer_type: str) -> str:
    if layer_type in _SOFTMAX_TYPES:
        return "gated softmax" if family in GATED_FAMILIES else "softmax"
    if layer_type in ("linear_attention", "mamba", "mamba2"):
        if family in DELTA_FAMILIES:
            return "gated delta rule"
        if family in MAMBA2_FAMILIES:
            return "mamba2"
    named = {"hybrid": "softmax + mamba2", "conv": "conv", "indexed_attention": "indexed", "moe": "mlp",
             "mlp": "mlp"}
    return named.get(layer_type, f"unknown ({layer_type})")


def layer_kinds(config) -> tuple[str, ...]:
    """Each decoder layer's kind, from the config alone (a multimodal config's text_config where it has one)."""
    config = getattr(config, "text_config", None) or config
    family = str(getattr(config, "model_type", ""))
    count = n_layers(config)
    if family in RECURRENT_FAMILIES:
        return (RECURRENT_FAMILIES[family],) * count
    if family == "mamba2":  # every layer a Mamba2 mixer, no layer_types
        return ("mamba2",) * count
    try:
        types = getattr(config, "layer_types", None)
    except (AttributeError, TypeError):
        types = None
    if not types or len(types) != count:
        return ("softmax",) * count
    return tuple(_kind(family, str(t)) for t in types)


def has_output_gate(attention: torch.nn.Module) -> bool:
    """Whether a softmax attention module gates each head's output (Qwen3-Next's q_proj makes the query and the
    gate: twice heads x head_dim outputs)."""
    config, q_proj = getattr(attention, "config", None), getattr(attention, "q_proj", None)
    heads, head_dim = getattr(config, "num_attention_heads", None), getattr(attention, "head_dim", None)
    return isinstance(q_proj, torch.nn.Linear) and bool(heads and head_dim) and \
        q_proj.out_features == 2 * heads * head_dim


def _module_kind(module: torch.nn.Module) -> str | None:
    name = type(module).__name__
    if "DeltaNet" in name or "DeltaAttention" in name:
        return "gated delta rule"
    if hasattr(module, "A_log") and ("Mamba" in name or "Mixer" in name):
        return "mamba2"
    if "ShortConv" in name:
        return "conv"
    if name.endswith("Attention"):
        if any("Indexer" in type(m).__name__ for m in module.modules()):
            return "indexed"
        return "gated softmax" if has_output_gate(module) else "softmax"
    return None


def module_kinds(model) -> tuple[str, ...]:
    """Each decoder layer's kind, from the token-mixing modules the layer holds."""
    kinds = []
    for layer in layer_stack(model):
        found = [k for k in (_module_kind(m) for m in layer.modules()) if k is not None]
        found = sorted(set(found), key=KINDS.index)
        kinds.append(" + ".join(found) if found else "mlp")
    return tuple(kinds)
