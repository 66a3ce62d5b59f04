"""The model a caller hands in, in any form capture takes it, as the LoadedModel attnviz computes with: a registry
name, a folder, a .gguf file or a cached hub id (loaded by attnviz.models.load_model), an attnviz LoadedModel (used
as it is), or a transformers model object with its tokenizer, lent for the block (loading.borrowed) and put back as
it was: the same attention implementation in every config, the same training flags, so the same outputs.

Every entry point that takes `model` goes through lent(): attnviz.capture, attnviz.corpus_run and the experiments'
front door (attnviz.front)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from attnviz.capture.loading import borrowed
from attnviz.capture.modules import CaptureError
from attnviz.models import LoadedModel, ModelSpec, load_model, shape_of

OBJECT_DESCRIPTION = "a model object lent by its owner"


@contextlib.contextmanager
def lent(model, tokenizer=None, *, usage: str = "attnviz.capture(model, text, tokenizer=tokenizer)",
         error: type[Exception] = CaptureError, kernels: bool = False) -> Iterator:
    """The LoadedModel for `model` while the block runs (module docstring). A model object is in eval mode and
    capturable inside the block only, and its ModelShape is read once here.

    usage: the call shown to someone who hands a model object without its tokenizer. error: the class each refusal
    raises (an attnviz.AttnvizError). kernels: import attnviz.kernels first, which chooses Triton's backend before
    a model imports triton.language (for callers that may run the kernels)."""
    if kernels:
        import attnviz.kernels  # noqa: F401  (deferred: Triton's backend is chosen only by callers that need it)

    if isinstance(model, (str, os.PathLike)):
        if tokenizer is not None:
            raise error("tokenizer= goes with a model object: a model given by name brings its own.")
        yield load_model(os.fspath(model))
    elif isinstance(model, LoadedModel):
        yield model
    elif isinstance(model, torch.nn.Module) and hasattr(model, "config"):
        if tokenizer is None:
            raise error(f"A model object needs its tokenizer: {usage}.")
        name = getattr(model.config, "name_or_path", "") or type(model).__name__
        spec = ModelSpec(name, getattr(model.config, "model_type", ""), "object", True, None, OBJECT_DESCRIPTION)
        with borrowed(model):
            yield LoadedModel(model=model, tokenizer=tokenizer, spec=spec, shape=shape_of(model, spec))
    else:
        raise error("model must be a model name, a folder, a .gguf file or a transformers model object.")
