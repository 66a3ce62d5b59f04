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
  methods    AttentionCapture's methods that reach above the store (by_words, save, stats, the notebook views),
             set on the class below
  frugal     a capture's MLPs over blocks of positions, mapped weights paged out, slim tokenizers
  front      the front door, capture(): a model by name, folder or GGUF file, or a transformers model object lent
             back unchanged (lending); not imported here, as it loads models (attnviz.models), which import this

The package itself is callable: attnviz.capture(model, text, ...) is attnviz.capture.front.capture(model, text, ...)
(opened by attnviz.capture.front, which `import attnviz` imports before it hands out attnviz.capture).
"""

from __future__ import annotations

from attnviz.capture.files import load_capture, save_capture
from attnviz.capture.hooks import SharedHooks
from attnviz.capture.loading import borrowed, prepare_model, records_inputs
from attnviz.capture.modules import (CaptureError, attention_layers, attention_modules, decoder_layers, input_device,
                                     is_causal, numbered_attention, uses_interface)
from attnviz.capture.masks import named_rule
from attnviz.capture.recording import ATTN_IMPLEMENTATION, Recorder, recording, recording_forward, wanted_layers
from attnviz.capture.run import (MAX_CAPTURE_BYTES, MAX_TOKENS, STORES, DuringForward, capture_attention, choose_store,
                                 inputs_bytes, maps_of, pattern_bytes)
from attnviz.capture.store import AttentionCapture, from_attentions
from attnviz.capture import methods  # after the store: the store's upper methods

__all__ = ["ATTN_IMPLEMENTATION", "MAX_CAPTURE_BYTES", "MAX_TOKENS", "STORES", "AttentionCapture", "CaptureError",
           "attention_layers", "numbered_attention",
           "DuringForward", "Recorder", "SharedHooks", "attention_modules", "borrowed", "capture_attention",
           "choose_store",
           "decoder_layers", "from_attentions", "input_device", "inputs_bytes", "is_causal", "load_capture",
           "maps_of", "named_rule", "pattern_bytes", "prepare_model", "records_inputs", "recording",
           "recording_forward", "save_capture", "uses_interface", "wanted_layers"]


# AttentionCapture's methods that reach above the store (by_words, save, stats, the notebook views): set here, where
# the package starts, so every AttentionCapture has them (attnviz.capture.methods)
for _name in methods.METHODS:
    setattr(AttentionCapture, _name, getattr(methods, _name))
