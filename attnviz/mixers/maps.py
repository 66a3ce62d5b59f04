"""Every linear mixer's implicit map from one forward pass, and the layers left without one, named.

A layer whose mixer is not softmax attention gets its exact map only where attnviz knows its kernel (the gated
delta rule of Qwen3-Next and Qwen3.5, Kimi Delta Attention's per-channel decay, Mamba2's scan); any other (LFM2's
short convolutions, an unknown kind) is listed in `skipped`, never given a map that is not exact. Softmax layers
(gated or not, indexed included) are the softmax capture's."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz.mixers.kinds import module_kinds
from attnviz.mixers.record import mixer_records

SOFTMAX_KINDS = ("softmax", "gated softmax", "indexed")


@dataclass(frozen=True)
class ImplicitMaps:
    """maps: {layer: w [head, query, key]}; records: {layer: the kernel call it was built from}; kinds: each
    layer's kind (attnviz.mixers.kinds); skipped: {layer: kind} of the layers with a mixer other than softmax
    attention and no map."""

    maps: dict[int, torch.Tensor]
    records: dict
    kinds: tuple[str, ...]
    skipped: dict[int, str]

    def message(self) -> str:
        """One sentence naming the skipped layers and their kinds, or "" when none was skipped."""
        if not self.skipped:
            return ""
        by_kind: dict[str, list[int]] = {}
        for layer, kind in self.skipped.items():
            by_kind.setdefault(kind, []).append(layer)
        parts = [f"layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))} ({kind})"
                 for kind, layers in by_kind.items()]
        return (f"No exact attention map for {'; '.join(parts)}: attnviz does not read this kind of token mixer "
                "exactly, so it draws none rather than an approximate one.")


def implicit_maps(model, input_ids: torch.Tensor, **options) -> ImplicitMaps:
    """The implicit maps of every linear mixer of `model` on input_ids [1, N]; options go to each record's
    implicit_map (dtype, chunk)."""
    kinds = module_kinds(model)
    records = mixer_records(model, input_ids)
    maps = {layer: record.implicit_map(**options) for layer, record in sorted(records.items())}
    skipped = {layer: kind for layer, kind in enumerate(kinds) if kind not in SOFTMAX_KINDS and kind != "mlp"
               and layer not in records}
    return ImplicitMaps(maps=maps, records=records, kinds=kinds, skipped=skipped)
