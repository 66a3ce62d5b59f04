"""The sites an intervention names, the edits it makes there, and the plan of one forward pass.

A site is (kind, layer, index); its activation at (kind, layer) is one tensor [rows, n, d] per forward pass:

  ("heads", layer, head)     a head's output before the output projection: the projection's input columns
                             head * d_v ... (head + 1) * d_v - 1 at every position (TransformerLens: attn.hook_z);
  ("resid", layer, position) the residual stream entering block `layer` (hook_resid_pre);
  ("attn", layer, position)  the attention module's output, after the output projection and before any norm the
                             block applies to it (hook_attn_out);
  ("mlp", layer, position)   the MLP's output (hook_mlp_out);
  ("out", layer, position)   the block's output, the residual stream after it (hook_resid_post; the last layer's
                             is read before the final norm).

("rope", layer) is read only: the rotary (cos, sin) tables the attention layer received, float64.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from attnviz import lm
from attnviz.capture import decoder_layers
from attnviz.errors import AttnvizError

KINDS = ("heads", "resid", "attn", "mlp", "out")
READ_ONLY = ("rope",)
MLP_NAMES = ("mlp", "feed_forward", "ffn")

Site = tuple[str, int, int]  # (kind, layer, head or position)
Key = tuple[str, int]        # (kind, layer): one tensor per forward pass


class InterventionError(AttnvizError, ValueError):
    """An intervention cannot be done on this model or input; the message says why."""


@dataclass(frozen=True)
class Replace:
    """x where `mask` is False and `value` where it is True, both broadcast against x [rows, n, d]: one edit serves
    every row of a batch, each row with its own sites."""

    mask: torch.Tensor
    value: torch.Tensor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(self.mask.to(x.device), self.value.to(device=x.device, dtype=x.dtype), x)


@dataclass(frozen=True)
class Put:
    """x[row, position, columns] = value; None: every row, every position, every column. A position outside the
    text leaves x as it is (one edit serves texts of any length)."""

    value: torch.Tensor | float = 0.0
    row: int | None = None
    position: int | None = None
    columns: tuple[int, ...] | slice | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.position is not None and not -x.shape[1] <= self.position < x.shape[1]:
            return x
        x = x.clone()
        index = (slice(None) if self.row is None else self.row,
                 slice(None) if self.position is None else self.position,
                 slice(None) if self.columns is None else
                 (self.columns if isinstance(self.columns, slice) else list(self.columns)))
        x[index] = torch.as_tensor(self.value, dtype=x.dtype).to(x.device)
        return x


Edit = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Plan:
    """What one forward pass of `rows` rows does at each site (this thread's plan while it runs):

    edits:     (kind, layer) -> edits applied in order to the site's tensor [rows, n, d]
    record:    filled when not None: (kind, layer) -> [n, d] row 0 as the model used it (after the edits), detached,
               on the CPU, in the model's dtype; ("rope", layer) -> (cos, sin) [n, d_head] float64
    kinds:     which kinds are recorded (and given deltas); None: every kind in KINDS
    deltas:    filled when not None: (kind, layer) -> a zero tensor that requires grad, added at the site, so that a
               backward pass gives d (anything) / d (activation) through every later layer
    expand_at: the block whose input (one row) is copied to `rows` rows: the layers below it run once
    """

    rows: int = 1
    edits: dict[Key, list[Edit]] = field(default_factory=dict)
    record: dict | None = None
    kinds: tuple[str, ...] | None = None
    deltas: dict | None = None
    expand_at: int | None = None

    def edit(self, key: Key, edit: Edit) -> Plan:
        """Add an edit at (kind, layer); returns the plan."""
        self.edits.setdefault((key[0], int(key[1])), []).append(edit)
        return self

    def wants(self, kind: str) -> bool:
        """Whether this plan records (and gives deltas to) sites of `kind`."""
        return (kind in KINDS) if self.kinds is None else kind in self.kinds

    def following(self, outer: Plan | None) -> Plan:
        """This plan with the edits of an outer plan (one already set in this thread) applied first."""
        if outer is not None:
            merged = {key: list(edits) for key, edits in outer.edits.items()}
            for key, edits in self.edits.items():
                merged.setdefault(key, []).extend(edits)
            self.edits = merged
        return self


def zero(site: Site, *, heads: int, row: int | None = None) -> tuple[Key, Put]:
    """The edit that zeroes a site (every row, or one): (key, edit) for Plan.edit. heads: the layer's head count
    (a head's columns are its share of the projection's input)."""
    return replace(site, 0.0, heads=heads, row=row)


def replace(site: Site, value, *, heads: int, row: int | None = None) -> tuple[Key, Edit]:
    """The edit that sets a site to `value` (a number, or a tensor: [d_v] or [n, d_v] for a head, [d] for a
    position): (key, edit) for Plan.edit."""
    kind, layer, index = site[0], int(site[1]), int(site[2])
    if kind not in KINDS:
        raise InterventionError(f"Unknown site kind {kind!r}: use one of {', '.join(KINDS)}.")
    if kind != "heads":
        return (kind, layer), Put(value, row=row, position=index)

    def head(x: torch.Tensor) -> torch.Tensor:
        d_v = x.shape[-1] // heads
        return Put(value, row=row, columns=slice(index * d_v, (index + 1) * d_v))(x)
    return (kind, layer), head


def batch_edits(rows: Sequence[Sequence[Site]], value: Callable[[Key], torch.Tensor | float], *, n: int,
                heads: int, d_v: int) -> dict[Key, list[Edit]]:
    """One Replace per (kind, layer) for a batch whose row b sets the sites rows[b] to value((kind, layer)) (a
    tensor broadcast against [rows, n, d]: a number, [d], or [1, n, d]); heads mask their columns at every
    position, the other kinds their position in every column."""
    out = {}
    for kind, layer in sorted({(s[0], s[1]) for r in rows for s in r}):
        if kind == "heads":
            mask = torch.zeros(len(rows), 1, heads * d_v, dtype=torch.bool)
        else:
            mask = torch.zeros(len(rows), n, 1, dtype=torch.bool)
        for b, r in enumerate(rows):
            for _, _, index in (s for s in r if (s[0], s[1]) == (kind, layer)):
                if kind == "heads":
                    mask[b, 0, index * d_v:(index + 1) * d_v] = True
                else:
                    mask[b, index] = True
        out[(kind, layer)] = [Replace(mask, torch.as_tensor(value((kind, layer))))]
    return out


def first_layer(rows: Iterable[Iterable[Site]]) -> int | None:
    """The lowest layer any row edits (None when none does)."""
    return min((s[1] for r in rows for s in r), default=None)


def blocks(model) -> list[torch.nn.Module] | None:
    """The transformer block of each layer (attnviz.capture.decoder_layers), or None when the model has no such
    list."""
    try:
        return decoder_layers(model)
    except ValueError:
        return None


def mlp_module(block, required: bool = True, error: type[Exception] = InterventionError) -> torch.nn.Module | None:
    """The block's MLP: its child named as in MLP_NAMES. Without one: `error`, or None if not required."""
    for name in MLP_NAMES:
        if isinstance(getattr(block, name, None), torch.nn.Module):
            return getattr(block, name)
    if not required:
        return None
    raise error(f"{type(block).__name__} has no MLP attnviz recognises (one of {', '.join(MLP_NAMES)}).")


def as_ids(token_ids) -> torch.Tensor:
    """Token ids as the [1, n] long tensor a forward pass takes."""
    return torch.as_tensor(token_ids).long().reshape(1, -1)


def check_text(loaded, token_ids, target: tuple[int, int] | None = None, *,
               error: type[Exception] = InterventionError, what: str = "an intervention") -> None:
    """`error` for an encoder, a text under 2 tokens or a target (position, token id) outside the text or the
    vocabulary; `what` names the experiment in the encoder's message."""
    if not lm.is_language_model(loaded.model):
        raise error(f"{loaded.spec.name} is an encoder: it predicts no next token, so {what} has no loss or logit "
                    "to change. Pick a decoder (toy-gpt2, smollm2-135m, ...).")
    n = len(token_ids)
    if n < 2:
        raise error("The text is one token long: the next-token loss needs at least two tokens.")
    if target is not None:
        position, token = target
        if not 0 <= int(position) < n:
            raise error(f"Target position {position} is outside the text (positions 0 to {n - 1}).")
        if not 0 <= int(token) < loaded.shape.vocab:
            raise error(f"Token id {token} is outside the vocabulary (0 to {loaded.shape.vocab - 1}).")
