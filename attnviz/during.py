"""DuringForward: work a caller does inside a capture's forward pass. It sits outside attnviz.capture so that the
statistics (attnviz.stats.streaming_attend), which attnviz.capture itself imports for AttentionCapture.stats, can
make one without importing the capture package. This module imports nothing of attnviz but the attention maths'
types."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnviz.attention import LayerInputs


@dataclass
class DuringForward:
    """Work a caller does inside a qk-store capture's forward pass, layer by layer (attnviz.stats.streaming_attend
    makes one that computes every head's statistics there).

    attend(layer, inputs, v [kv_head, n, d_v]) returns the wanted layer's attention output [head, n, d_v] in place
    of SDPA's (families of the attention interface), so a caller that computes the weights block by block anyway
    computes the scores once for both. on_layer(layer, inputs) is called as soon as a wanted layer's inputs are
    recorded (every family that records them). keep_inputs=False drops each layer's q and k after that: memory
    O(one layer), and the capture has no maps, only tokens. summary: what they computed, {layer: result}; it
    becomes capture.summary. device_inputs (with keep_inputs=False): a model on a GPU hands attend and on_layer its
    q, k and v where it made them, in its own dtype, instead of float32 copies on the CPU, for a caller that
    computes on that GPU (streaming_attend with the statistics kernel: no copy out and back per layer)."""

    attend: Callable[[int, LayerInputs, torch.Tensor], torch.Tensor] | None = None
    on_layer: Callable[[int, LayerInputs], None] | None = None
    keep_inputs: bool = True
    summary: dict | None = None
    device_inputs: bool = False
