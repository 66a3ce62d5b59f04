"""A model's stack of decoder layers, found without assuming every layer has attention (a Mamba2 model has none)."""

from __future__ import annotations

import torch


def n_layers(config) -> int:
    """The number of decoder layers: len(layer_types) where the config lists them, else num_hidden_layers."""
    types = _types(config)
    return len(types) if types else int(getattr(config, "num_hidden_layers", 0) or 0)


def _types(config):
    try:
        types = getattr(config, "layer_types", None)
    except (AttributeError, TypeError):
        return None
    return list(types) if types else None


def layer_stack(model) -> list[torch.nn.Module]:
    """The first nn.ModuleList, in module order, with one entry per decoder layer (model.layers, backbone.layers)."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    count = n_layers(config) if config is not None else 0
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count and count:
            return list(module)
    raise ValueError(f"{type(model).__name__}: no stack of {count} decoder layers found")
