"""Making a model capturable: loaded with attn_implementation="attnviz" (the family's own eager attention, plus
recording; attnviz.capture.recording) where its family dispatches through transformers' attention interface, eager
otherwise; and lending a model someone else holds for one capture, then putting it back as it was."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from attnviz.capture.modules import numbered_attention, uses_interface
from attnviz.capture.rebuilt import REBUILT
from attnviz.capture.recording import ATTN_IMPLEMENTATION, register


def prepare_model(model) -> None:
    """Makes a freshly loaded model capturable: families that dispatch through the attention interface get
    attn_implementation="attnviz" (the family's eager attention, plus recording); the others keep eager."""
    register()
    modules = list(numbered_attention(model).values())
    if not modules:  # no softmax attention (Mamba2): nothing to record through the interface
        return
    implementation = ATTN_IMPLEMENTATION if uses_interface(modules[0]) else "eager"
    for config in _configs(model):
        config._attn_implementation = implementation


def _configs(model) -> list:
    """Every config of the model that carries an attention implementation, each parent before its sub-configs (the
    order in which setting them one by one leaves each with its own value)."""
    found: dict[int, object] = {}

    def add(config) -> None:
        if config is None or id(config) in found or not hasattr(config, "_attn_implementation"):
            return
        found[id(config)] = config
        for sub in ("text_config", "vision_config", *getattr(config, "sub_configs", {})):
            add(getattr(config, sub, None))

    add(model.config)
    for module in model.modules():
        add(getattr(module, "config", None))
    return list(found.values())


@contextlib.contextmanager
def borrowed(model) -> Iterator[None]:
    """A model someone else holds, made capturable for the block only (prepare_model) and in eval mode; afterwards
    every config's attention implementation and every module's training flag are what they were."""
    implementations = [(config, config._attn_implementation) for config in _configs(model)]
    training = [(module, module.training) for module in model.modules()]
    try:
        prepare_model(model)
        model.eval()
        yield
    finally:
        for config, implementation in implementations:
            config._attn_implementation = implementation
        for module, mode in training:
            module.training = mode


def records_inputs(model, module=None) -> bool:
    """Whether a capture of this model records q and k (scores, the long-text store): families that dispatch
    through the attention interface, and those whose q and k are rebuilt by hooks (BLOOM, Falcon, GPT-J).
    module: the model's first attention module, when the caller has it at hand."""
    if module is None:
        modules = list(numbered_attention(model).values())
        if not modules:
            return True  # no softmax attention: nothing of it to record, every store serves
        module = modules[0]
    return (getattr(model.config, "_attn_implementation", None) == ATTN_IMPLEMENTATION and uses_interface(module)) \
        or type(module).__name__ in REBUILT
