"""One linear mixer's recorded kernel call, and what follows from it: the implicit map, the output it rebuilds and
the terms outside the map. Arrays are batch row 0, [N, ...] as the kernel received them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz.errors import AttnvizError
from attnviz.mixers import delta, kda
from attnviz.mixers.delta import apply_map, delta_rule_map, delta_rule_rows
from attnviz.mixers.kda import kda_map, kda_rows
from attnviz.mixers.ssd import apply_ssd, ssd_map, ssd_rows


class MixerError(AttnvizError, ValueError):
    """A linear mixer's map cannot be built; the message says why."""


@dataclass(frozen=True)
class DeltaCall:
    """A delta rule kernel call: query, key [N, k heads, dk]; value [N, value heads, dv]; g (log decay), beta
    [N, value heads]; l2norm: the kernel's use_qk_l2norm_in_kernel; output [N, value heads, dv]: what the kernel
    returned (before the layer's gated RMSNorm and output projection). The two kinds below differ in g and so in
    their map. Every record reads its map whole (implicit_map) or `block` rows at a time (rows; block: its
    default, the rows per block a streamed read takes)."""

    layer: int
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    l2norm: bool
    output: torch.Tensor
    kind = "gated delta rule"

    @property
    def heads(self) -> int:
        """How many heads its map has: one per value head."""
        return int(self.beta.shape[-1])

    @property
    def n_tokens(self) -> int:
        """How many tokens (rows and keys) its map has."""
        return int(self.beta.shape[0])

    def implicit_map(self, **options) -> torch.Tensor:
        """w [value head, query, key]: the kind's map (delta.delta_rule_map, kda.kda_map; options: chunk, dtype,
        out)."""
        return type(self)._map(self.query, self.key, self.g, self.beta, l2norm=self.l2norm, **options)

    def rows(self, block: int | None = None, **options):
        """The map's rows a chunk of `block` rows at a time (delta.delta_rule_rows, kda.kda_rows; options: dtype,
        into, heads)."""
        return type(self)._rows(self.query, self.key, self.g, self.beta, l2norm=self.l2norm,
                                chunk=block or self.block, **options)

    def mixed(self, w: torch.Tensor) -> torch.Tensor:
        """The kernel's output rebuilt from a map: sum_s w_ts v_s; there is no other term."""
        return apply_map(w, self.value)


class DeltaRuleRecord(DeltaCall):
    """A gated delta rule call (Qwen3-Next, Qwen3.5): g [N, value heads], one log decay per head."""

    block = delta.CHUNK
    _map, _rows = staticmethod(delta_rule_map), staticmethod(delta_rule_rows)


class KdaRecord(DeltaCall):
    """A Kimi Delta Attention call (chunk_kimi_delta_attention): query, key, value [N, head, d], after the short
    convolution; g [N, head, dk], each key channel's log decay (attnviz.mixers.kda)."""

    block = kda.CHUNK
    _map, _rows = staticmethod(kda_map), staticmethod(kda_rows)


@dataclass(frozen=True)
class SsdRecord:
    """A Mamba2 scan call: x [N, head, p]; dt [N, head] before bias and softplus; A [head]; B, C [N, group, n];
    D [head] or None; dt_bias, dt_softplus, dt_limit as the scan takes them; output [N, head, p]: what the scan
    returned, skip term included (before the layer's gated norm and output projection)."""

    layer: int
    x: torch.Tensor
    dt: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    D: torch.Tensor | None
    dt_bias: torch.Tensor | None
    dt_softplus: bool
    dt_limit: tuple
    output: torch.Tensor
    kind = "mamba2"
    block = 64  # rows of a Mamba2 map per block: [128 heads, 64, 8,192] float32 is 256 MiB

    @property
    def heads(self) -> int:
        """How many heads its map has."""
        return int(self.dt.shape[-1])

    @property
    def n_tokens(self) -> int:
        """How many tokens (rows and keys) its map has."""
        return int(self.dt.shape[0])

    def implicit_map(self, **options) -> torch.Tensor:
        """w [head, query, key] (attnviz.mixers.ssd.ssd_map)."""
        return ssd_map(self.dt, self.A, self.B, self.C, dt_bias=self.dt_bias, dt_softplus=self.dt_softplus,
                       dt_limit=self.dt_limit, **options)

    def rows(self, block: int | None = None, **options):
        """The map's rows `block` at a time (attnviz.mixers.ssd.ssd_rows; options: dtype, into, heads)."""
        return ssd_rows(self.dt, self.A, self.B, self.C, dt_bias=self.dt_bias, dt_softplus=self.dt_softplus,
                        dt_limit=self.dt_limit, block=block or self.block, **options)

    def skip(self) -> torch.Tensor:
        """The term outside the map, D x_t [N, head, p] (zero where the layer has no D)."""
        return torch.zeros_like(self.x) if self.D is None else self.D[None, :, None] * self.x

    def mixed(self, w: torch.Tensor) -> torch.Tensor:
        """The scan's output rebuilt from a map: sum_s w_ts x_s + D x_t."""
        return apply_ssd(w, self.x, self.D)


def _row(x):
    return x[0].detach() if isinstance(x, torch.Tensor) else x


def record_of(kernel: str, layer: int, args: dict, out):
    """The record of one kernel call from its named arguments and its return value."""
    out = out[0] if isinstance(out, tuple) else out
    if kernel == "chunk_kimi_delta_attention":
        if args.get("initial_state") is not None:
            raise MixerError("This Kimi Delta Attention layer started from a carried state; its map covers one text "
                             "from its first token.")
        return KdaRecord(layer, *(_row(args[k]) for k in ("query", "key", "value", "g", "beta")),
                         l2norm=bool(args["use_qk_l2norm_in_kernel"]), output=_row(out))
    if kernel == "torch_chunk_gated_delta_rule":
        if args.get("initial_state") is not None:
            raise MixerError("This gated delta rule layer started from a carried state; its map covers one text "
                             "from its first token.")
        return DeltaRuleRecord(layer, *(_row(args[k]) for k in ("query", "key", "value", "g", "beta")),
                               l2norm=bool(args["use_qk_l2norm_in_kernel"]), output=_row(out))
    if args.get("initial_states") is not None:
        raise MixerError("This Mamba2 layer started from a carried state; its map covers one text from its first "
                         "token.")
    dt_limit = tuple(float(x) for x in args["dt_limit"])
    return SsdRecord(layer, _row(args["hidden_states"]), _row(args["dt"]), args["A"].detach(), _row(args["B"]),
                     _row(args["C"]), None if args["D"] is None else args["D"].detach(),
                     None if args["dt_bias"] is None else args["dt_bias"].detach(), bool(args["dt_softplus"]),
                     dt_limit, _row(out))
