"""Where a model's attention lives: its attention modules in layer order, its stack of layers, whether a family
dispatches through transformers' attention interface, and whether a layer is causal. Everything else in
attnviz.capture builds on these; this module imports nothing else of attnviz but the stack of layers
(attnviz.mixers.layers)."""

from __future__ import annotations

import sys

import torch

from attnviz.errors import CaptureError
from attnviz.mixers.layers import layer_stack


def attention_modules(model) -> list[torch.nn.Module]:
    """The self-attention module of each layer, in layer order: the modules output_attentions reads.

    Uses the model's own `_can_record_outputs["attentions"]` when it declares one (GPT-2, Llama, BERT in
    transformers 5), else the innermost modules whose class name ends in "Attention" (BLOOM).
    """
    target = None
    for module in model.modules():
        target = (getattr(type(module), "_can_record_outputs", None) or {}).get("attentions")
        if target is not None:
            break
    found = []
    for name, module in model.named_modules():
        if target is None:
            ok = type(module).__name__.endswith("Attention") and "cross" not in name.lower() and not any(
                type(c).__name__.endswith("Attention") for c in module.children())
        elif isinstance(target, type):
            ok = isinstance(module, target)
        else:
            ok = isinstance(module, target.target_class) and (
                target.layer_name is None or name.endswith(target.layer_name))
        if ok:
            found.append(module)
    if not found:
        raise CaptureError(f"No attention modules found in {type(model).__name__}: attnviz cannot read its "
                           "attention weights.")
    return found


def attention_layers(model, modules=None) -> list[int]:
    """The model layer of each attention module (in attention_modules' order): i for the i-th where every layer
    holds one, else the layer of the model's stack that holds it (a hybrid: Qwen3-Next's attention is layer 3 of
    4, after three Gated DeltaNet layers)."""
    modules = attention_modules(model) if modules is None else modules
    try:
        stack = layer_stack(model)
    except ValueError:
        return list(range(len(modules)))
    if len(stack) == len(modules):
        return list(range(len(modules)))
    where: dict[int, int] = {}
    for i, layer in enumerate(stack):
        for sub in layer.modules():
            where.setdefault(id(sub), i)
    numbers = [where.get(id(m)) for m in modules]
    return list(range(len(modules))) if None in numbers else numbers


def numbered_attention(model) -> dict[int, torch.nn.Module]:
    """{model layer: its attention module}; empty for a model with no attention (Mamba2)."""
    try:
        modules = attention_modules(model)
    except CaptureError:
        return {}
    return dict(zip(attention_layers(model, modules), modules))


def decoder_layers(model) -> list[torch.nn.Module]:
    """The model's stack of decoder (or encoder) layers, in order: the longest nn.ModuleList whose every entry holds
    an attention module (Llama's model.layers, GPT-2's transformer.h, BERT's encoder.layer, ...), else (a hybrid,
    whose layers do not all hold attention) the list with one entry per configured layer."""
    try:
        attention = {id(m) for m in attention_modules(model)}
    except CaptureError:  # no attention at all (Mamba2)
        return layer_stack(model)
    best: list = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > len(best) and all(
                any(id(sub) in attention for sub in layer.modules()) for layer in module):
            best = list(module)
    if not best:
        return layer_stack(model)  # a hybrid: some layers hold a linear mixer instead (raises when none is found)
    return best


def uses_interface(module) -> bool:
    """Whether this attention module's family dispatches through transformers' attention interface."""
    return hasattr(sys.modules[type(module).__module__], "ALL_ATTENTION_FUNCTIONS")


def is_causal(model, module) -> bool:
    """Whether this attention module (of this model) is causal: its is_causal flag, else the model class."""
    causal = getattr(module, "is_causal", None)
    if causal is not None:
        return bool(causal)
    return type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))


def input_device(model) -> torch.device:
    """The device the model's input ids go to (its input embeddings')."""
    try:
        return model.get_input_embeddings().weight.device
    except (AttributeError, NotImplementedError):
        return next(model.parameters()).device


def is_language_model(model) -> bool:
    """Whether the model returns next-token logits (a *ForCausalLM / *LMHeadModel with an output embedding)."""
    try:
        return model.get_output_embeddings() is not None and bool(getattr(model.config, "is_decoder", True)
                                                                    or causal_lm_class(model))
    except (AttributeError, NotImplementedError):
        return False


def causal_lm_class(model) -> bool:
    return type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))
