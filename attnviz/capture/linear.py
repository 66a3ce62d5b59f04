"""A capture's layers that are not plain softmax attention (attnviz.mixers): each layer's kind, the linear mixers'
kernel calls recorded during the capture's own forward pass and their exact implicit maps, the output gates of
gated softmax layers, and the layers left without a map, named.

A linear mixer's map w[head, query, key] is not a probability: its entries can be negative and a row need not sum
to 1 (o_t = sum_s w_ts v_s, exactly). The short convolution before the mixer is inside q, k and v as recorded."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from attnviz.errors import CaptureError
from attnviz.mixers.gates import gate_map, gate_stats, record_gates
from attnviz.mixers.kinds import module_kinds
from attnviz.mixers.maps import SOFTMAX_KINDS
from attnviz.mixers.record import mixer_modules, record_mixers
from attnviz.mixers.stats import map_stats, record_stats

LINEAR_NOTE = ("A linear mixer's implicit map is not a probability: o_t = Σ_s w_ts v_s exactly, its weights can be "
               "negative and a row need not sum to 1.")


@dataclass(frozen=True)
class LinearPlan:
    """kinds: every model layer's kind (attnviz.mixers.kinds.KINDS); mapped: {layer: kind} of the linear mixers
    with an exact map; skipped: {layer: kind} of the token mixers with none (a short convolution, a kind attnviz
    does not know); gated: the gated softmax layers."""

    kinds: tuple[str, ...]
    mapped: dict[int, str] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)
    gated: tuple[int, ...] = ()


def linear_plan(model) -> LinearPlan | None:
    """The plan of a model with any layer other than plain softmax attention; None for the others (nothing to
    record, so their captures are as they always were)."""
    try:
        kinds = module_kinds(model)
    except ValueError:  # no stack of layers attnviz recognises: softmax attention as before
        return None
    if all(kind in ("softmax", "mlp") for kind in kinds):
        return None
    mapped = {layer: kinds[layer] for layer in mixer_modules(model)}
    skipped = {layer: kind for layer, kind in enumerate(kinds)
               if kind not in SOFTMAX_KINDS and kind != "mlp" and layer not in mapped}
    gated = tuple(layer for layer, kind in enumerate(kinds) if kind == "gated softmax")
    return LinearPlan(kinds=kinds, mapped=mapped, skipped=skipped, gated=gated)


@contextlib.contextmanager
def recording_linear(model, plan: LinearPlan | None):
    """Within the block, this thread's forward pass of `model` fills the yielded (records, gates): {layer: kernel
    call} of every mapped mixer (attnviz.mixers.record) and {layer: sigmoid(gate) [head, query, head_dim]} of every
    gated softmax layer (attnviz.mixers.gates). Nothing is hooked for a model without a plan."""
    if plan is None:
        yield {}, {}
        return
    with record_mixers(model) as records, record_gates(model) as gates:
        yield records, gates


def linear_maps(records: dict, layers) -> dict[int, np.ndarray]:
    """{layer: w [head, query, key] float32, read-only} of the recorded mixers of `layers`."""
    maps = {}
    for layer in layers:
        w = records[layer].implicit_map().float().numpy()
        w.flags.writeable = False
        maps[layer] = w
    return maps


_building = threading.Lock()


def map_rows(capture, layer: int, start: int, stop: int, heads=None) -> np.ndarray:
    """Rows start .. stop - 1 of linear layer `layer`'s implicit map [head, rows, key], float32. The pattern store
    builds a layer's whole map from its recorded kernel call the first time it is read and keeps it (read-only,
    shared by every session reading the capture); the long-text store builds what it is asked for each time."""
    maps, mixers = capture.maps, capture.mixers or {}
    if maps is not None and layer in mixers and layer not in maps:  # a built map is read with no lock
        with _building:  # one build per layer, however many sessions ask at once
            if layer not in maps:
                maps.update(linear_maps(mixers, [layer]))
    if maps is not None and layer in maps:
        block = maps[layer][:, start:stop]
    elif layer in mixers:
        return record_rows(mixers[layer], start, stop, heads)
    else:
        raise CaptureError(f"Layer {layer} has no linear mixer map in this capture"
                           f"{' (' + capture.layer_kind(layer) + ')' if capture.layer_kinds else ''}.")
    return block if heads is None else block[list(heads)]


def record_rows(record, start: int, stop: int, heads=None) -> np.ndarray:
    """Rows start .. stop - 1 of a recorded mixer's implicit map [head, rows, key] float32, built a block of rows at
    a time up to `stop` (the record's rows, never the N x N map): the long-text store's read."""
    n = record.n_tokens
    picked = None if heads is None else [int(h) for h in heads]
    span = slice(None) if picked is None else slice(min(picked), max(picked) + 1)
    out = None
    for a, b, rows in record.rows(heads=span):
        if out is None:
            out = np.zeros((rows.shape[0], stop - start, n), dtype=np.float32)
        lo, hi = max(a, start), min(b, stop)
        if lo < hi:
            out[:, lo - start:hi - start, :b] = rows[:, lo - a:hi - a].float().numpy()
        if b >= stop:
            break
    return out if picked is None else out[[h - span.start for h in picked]]


def streams_stats(capture, layer: int) -> bool:
    """Whether layer_stats reads this layer a block of rows at a time from its recorded kernel call (a capture made
    from a model keeps it), rather than from its whole map (a capture read from a file)."""
    return int(layer) in (capture.mixers or {})


def layer_stats(capture, layer: int) -> dict:
    """A linear layer's statistics on |w| (attnviz.mixers.stats: prev_token, induction, distance_profile,
    half_mass_distance per head): streamed over row blocks from its record (no N x N array), else (a capture read
    from a file) from its map."""
    if streams_stats(capture, layer):
        return record_stats(capture.mixers[int(layer)], capture.token_ids)
    return map_stats(capture.layer_rows(layer, mixer="linear"), capture.token_ids)


def mean_gate(capture, layer: int) -> np.ndarray:
    """The output gate of gated softmax layer `layer`, averaged over each head's channels: [head, query]."""
    gates = capture.gates or {}
    if layer not in gates:
        raise CaptureError(f"Layer {layer} has no output gate in this capture: only gated softmax layers "
                           "(Qwen3-Next, Qwen3.5) have one.")
    return gate_map(gates[layer]).numpy()


def gate_table(capture, layers=None) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """{gated layer: (mean gate per head, share of gates under 0.1 per head)} (attnviz.mixers.gates.gate_stats), for
    every gated layer or those of `layers`."""
    out = {}
    for layer, gate in sorted((capture.gates or {}).items()):
        if layers is not None and layer not in layers:
            continue
        stats = gate_stats(gate)
        out[layer] = (stats.mean.numpy(), stats.sparse.numpy())
    return out


def kept_gates(gates: dict, layers) -> dict[int, torch.Tensor]:
    """The recorded gates of `layers`, float32 on the CPU."""
    return {layer: gates[layer].float().cpu() for layer in layers if layer in gates}


def gate_sink_table(capture, alpha: np.ndarray):
    """Per head of every gated softmax layer: its sink score α₀ (alpha [layer, head, key] over capture.layers,
    attnviz.sinks.sink_scores) beside its mean gate and its share of gates under 0.1, as a DataFrame. Qiu et al.
    find the gate takes the sink's place: a head that can shut its output needs no token to dump attention on."""
    import pandas as pd

    rows = []
    for layer, (mean, sparse) in gate_table(capture).items():
        li = capture.layers.index(layer)
        rows += [{"layer": layer, "head": h, "sink α₀": float(alpha[li, h, 0]), "mean gate": float(mean[h]),
                  "share of gates under 0.1": float(sparse[h])} for h in range(len(mean))]
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class IndexedView:
    """One head of an indexed (top-k) softmax layer (DeepSeek-V3.2), from the q, k and mask it saw: kept [query, key]
    the keys its indexer kept (the mask it attended under, causal and selected); pattern the weights over those;
    dense the weights the same q and k give over every causal key; outside [query] the dense mass on keys the
    selection dropped, what dense attention would have added."""

    kept: np.ndarray
    pattern: np.ndarray
    dense: np.ndarray
    outside: np.ndarray


def indexed_view(capture, layer: int, head: int) -> IndexedView:
    """The IndexedView of one head of indexed layer `layer` (its selection folded into the recorded mask)."""
    from dataclasses import replace

    from attnviz import attention as core

    if capture.layer_kind(layer) != "indexed" or not capture.inputs or int(layer) not in capture.inputs:
        raise CaptureError(f"Layer {layer} is not an indexed (top-k) attention layer with its q and k recorded.")
    x, n = capture.inputs[int(layer)], capture.n_tokens
    kept = x.mask.rows(0, n)
    dense_inputs = replace(x, mask=core.MaskRule(n, n, causal=True))
    dense = core.layer_pattern(dense_inputs, 0, n, heads=[head])[0][0].numpy()
    pattern = capture.head_pattern(layer, head)
    outside = np.where(kept, 0.0, dense.astype(np.float64)).sum(-1)
    return IndexedView(kept=kept, pattern=pattern, dense=dense, outside=outside)
