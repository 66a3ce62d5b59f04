"""A model as attnviz computes with it: its registry entry (ModelSpec) and the loaded model with its tokenizer and
facts (LoadedModel). attnviz.models makes them; they live here, below it, so that code that only wraps a model it
already holds (the toy lab's comparison) needs neither the registry nor the loading. This module imports nothing of
attnviz."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    """One entry of the registry. install_command is the exact command that installs a missing bundled model."""

    name: str
    family: str
    source: str  # "toy", "bundled", "local", "hub" or "lab"
    installed: bool
    install_command: str | None
    description: str


@dataclass
class LoadedModel:
    """A model in eval mode with eager attention, its tokenizer, and the registry entry it came from."""

    model: Any
    tokenizer: Any
    spec: ModelSpec
    shape: Any = None  # attnviz.shape.ModelShape, read once at load: layers, heads, KV heads, head dim, positions...
