"""Capture: what every attention layer of a transformers model saw while it ran (q, k after RoPE, the mask rule,
scaling, soft-cap, ALiBi bias, learned sinks, values), and every head's pattern and scores computed from it exactly.

The package, from the bottom up (no module imports one above it):
  modules    where a model's attention lives: its attention modules, its stack of layers, causal or not
  hooks      forward hooks shared by every session on one cached model
  recording  the function registered in transformers' attention interface, the hooks of the other families, the
             per-thread recorder they report to, mask rules named without building an N x N mask
  loading    making a model capturable (attn_implementation="attnviz"), lending a model object and putting it back
  lending    the model a caller hands in (name, folder, GGUF file, LoadedModel or model object) as a LoadedModel
  words      tokens cut into words, and attention merged into words (Clark et al. 2019) and over sets of queries
  store      AttentionCapture (both stores, one API; by_words, span_attention) and from_attentions
  run        capture_attention: the checks, the forward pass under a recorder, the capture assembled once
  files      capture files (npz / safetensors), written and read a block of rows at a time

The front door for a notebook or a script is capture() below; the package itself is callable, so
attnviz.capture(model, text, ...) is capture(model, text, ...): a model by name, folder or GGUF file, or a
transformers model object that is lent back unchanged.
"""

from __future__ import annotations

import sys
import types


from attnviz.capture.files import load_capture, save_capture
from attnviz.capture.hooks import SharedHooks
from attnviz.capture.lending import lent
from attnviz.capture.loading import borrowed, prepare_model, records_inputs
from attnviz.capture.modules import (CaptureError, attention_modules, decoder_layers, input_device, is_causal,
                                     uses_interface)
from attnviz.capture.masks import named_rule
from attnviz.capture.recording import ATTN_IMPLEMENTATION, Recorder, recording, recording_forward, wanted_layers
from attnviz.capture.run import (MAX_CAPTURE_BYTES, MAX_TOKENS, STORES, DuringForward, capture_attention, choose_store,
                                 inputs_bytes, pattern_bytes)
from attnviz.capture.store import AttentionCapture, from_attentions

__all__ = ["ATTN_IMPLEMENTATION", "MAX_CAPTURE_BYTES", "MAX_TOKENS", "STORES", "AttentionCapture", "CaptureError",
           "DuringForward", "Recorder", "SharedHooks", "attention_modules", "borrowed", "capture", "capture_attention",
           "choose_store",
           "decoder_layers", "from_attentions", "input_device", "inputs_bytes", "is_causal", "lent", "load_capture",
           "named_rule", "pattern_bytes", "prepare_model", "records_inputs", "recording", "recording_forward",
           "save_capture", "uses_interface", "wanted_layers"]


def capture(model, text: str, *, tokenizer=None, layers=None, store: str = "auto") -> AttentionCapture:
    """The front door, also called as attnviz.capture(model, text, ...): every head of `layers` (None: all,
    negative counts from the end) on `text`.

    model: a registry name (attnviz.models.available_models()), a folder, a .gguf file or a cached hub id, loaded
    by attnviz.models.load_model; an attnviz LoadedModel; or a transformers model object, with its `tokenizer`. A
    model object is lent, not changed: afterwards its attention implementation, its training flags and so its
    outputs are what they were (attnviz.capture.lending.lent).
    store: "pattern" (the dense weights), "qk" (only q and k, for any length) or "auto": the pattern while it fits
    (MAX_TOKENS tokens, MAX_CAPTURE_BYTES), else "qk" where the family records q and k (choose_store). The limits
    live in attnviz.capture.run (patch them there)."""
    with lent(model, tokenizer) as loaded:
        return _capture_loaded(loaded, text, layers, store)


def _capture_loaded(loaded, text: str, layers, store: str) -> AttentionCapture:
    if store == "auto":
        store = _auto_store(loaded, text, layers)
    return capture_attention(loaded, text, layers=layers, store=store)


def _auto_store(loaded, text: str, layers) -> str:
    """The store run.choose_store picks for this text and these layers."""
    if not isinstance(text, str) or not text.strip():
        return "pattern"  # capture_attention says what is wrong with the text
    n_layers = len(wanted_layers(layers, len(attention_modules(loaded.model))))
    return choose_store(loaded, len(loaded.tokenizer(text).input_ids), n_layers)[0]


class _FrontDoor(types.ModuleType):
    """This module, callable: attnviz.capture(model, text, ...) is attnviz.capture.capture(model, text, ...)."""

    def __call__(self, model, text: str, *, tokenizer=None, layers=None, store: str = "auto") -> AttentionCapture:
        return capture(model, text, tokenizer=tokenizer, layers=layers, store=store)

    __call__.__doc__ = capture.__doc__


# `attnviz.capture` names this package (every `from attnviz.capture import ...` needs it), and the front door too.
sys.modules[__name__].__class__ = _FrontDoor
