"""What each linear mixer of a model received: the arguments of transformers' own reference kernels, recorded while
the model runs.

Gated DeltaNet layers (Qwen3-Next, Qwen3.5) call their modeling module's `torch_chunk_gated_delta_rule`, Mamba2
layers (Mamba2, Falcon-H1, Bamba, Nemotron-H, Granite 4) its `mamba2_chunk_scan`, with q, k, v (or x, B, C) after
the short convolution and the gates computed. While a recorder is open, those module-level names point at a
wrapper that passes every call through and, in the recording thread only, keeps the arguments and the output
under the decoder layer whose mixer is running (a forward pre-hook names it). The first recorder installs the
wrappers, the last puts the originals back.

Kimi Delta Attention layers (Kimi Linear) call `chunk_kimi_delta_attention` the same way (their A_log sits in their
forget_gate).
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from contextlib import contextmanager

import torch

from attnviz.mixers.layers import layer_stack
from attnviz.mixers.records import MixerError, record_of

KERNELS = ("torch_chunk_gated_delta_rule", "mamba2_chunk_scan", "chunk_kimi_delta_attention")

_local = threading.local()
_lock = threading.Lock()
_installed: dict[tuple[str, str], list] = {}  # (module name, kernel name) -> [original, users]


def _recording(original, name: str):
    """`original`, passing every call through; in a recording thread inside a known layer, the call is kept."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def kernel(*args, **kwargs):
        out = original(*args, **kwargs)
        records, layer = getattr(_local, "records", None), getattr(_local, "layer", None)
        if records is not None and layer is not None:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            try:
                records[layer] = record_of(name, layer, dict(bound.arguments), out)
            except MixerError:  # a carried state (a cached step): no exact map of this call; the pass goes on
                records.pop(layer, None)
        return out

    kernel.attnviz_original = original
    return kernel


def mixer_modules(model) -> dict[int, tuple[torch.nn.Module, str]]:
    """{decoder layer: (its linear mixer module, the kernel it calls)} for the mixers whose modeling module
    defines one of KERNELS (and that carry the A_log of a decaying state, themselves or in their forget_gate as
    Kimi Delta Attention does)."""
    found = {}
    for i, layer in enumerate(layer_stack(model)):
        for module in layer.modules():
            source = sys.modules.get(type(module).__module__)
            names = [k for k in KERNELS if hasattr(source, k)]
            if names and (hasattr(module, "A_log") or hasattr(getattr(module, "forget_gate", None), "A_log")):
                found[i] = (module, names[0])
                break
    return found


def _install(modules) -> list[tuple[str, str]]:
    keys = sorted({(type(m).__module__, name) for m, name in modules})
    with _lock:
        for key in keys:
            entry = _installed.get(key)
            if entry is None:
                source = sys.modules[key[0]]
                original = getattr(source, key[1])
                setattr(source, key[1], _recording(original, key[1]))
                _installed[key] = [original, 1]
            else:
                entry[1] += 1
    return keys


def _uninstall(keys) -> None:
    with _lock:
        for key in keys:
            entry = _installed[key]
            entry[1] -= 1
            if entry[1] == 0:
                setattr(sys.modules[key[0]], key[1], entry[0])
                del _installed[key]


def _layer_hooks(mixers) -> list:
    """Pre- and post-hooks that name the running mixer's layer to the recording thread."""
    handles = []
    for layer, (module, _) in mixers.items():
        def enter(_module, _args, layer=layer):
            if getattr(_local, "records", None) is not None:
                _local.layer = layer

        def leave(_module, _args, _out):
            _local.layer = None

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    return handles


@contextmanager
def record_mixers(model):
    """Within the block, this thread's forward passes of `model` fill the yielded dict {layer: record}
    (a DeltaRuleRecord, KdaRecord or SsdRecord, batch row 0) of every linear mixer transformers' reference kernel
    ran, the last chunked call of each layer kept. A call that starts from a carried state is not kept (its map would
    miss what the state holds), and the one-token steps of a cached generation run the modules' recurrent kernels,
    which are not recorded: after a prefill and cached steps, a layer's record is still the prefill's. Captures run
    without a cache, so theirs is the whole text's."""
    mixers = mixer_modules(model)
    keys = _install(mixers.values())
    handles = _layer_hooks(mixers)
    records: dict = {}
    previous = getattr(_local, "records", None)
    _local.records, _local.layer = records, None
    try:
        yield records
    finally:
        _local.records, _local.layer = previous, None
        for handle in handles:
            handle.remove()
        _uninstall(keys)


def mixer_records(model, input_ids: torch.Tensor) -> dict:
    """{layer: record} of one forward pass of `model` on input_ids [1, N] (no cache, so no state is carried in)."""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise MixerError("Linear mixers are recorded for one text at a time (input ids of shape [1, N]).")
    with record_mixers(model) as records, torch.no_grad():
        model(input_ids=input_ids, use_cache=False)
    return records
