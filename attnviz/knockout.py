"""Head knock-outs and their measured effect: a head's output is zeroed, or replaced by its mean over positions,
just before the attention output projection, and the change in next-token loss (and in the log-probability of a
chosen target token) is measured.

Where. A head's output is the site ("heads", layer, head) of attnviz.interventions: its columns of the output
projection's input (o_proj, c_proj, dense, out_proj, ...), edited by a pre-hook there, so one mechanism serves every
family, including those whose attention does not go through transformers' attention interface (BLOOM, Falcon,
GPT-J). Zeroing the columns is the same as zeroing the projection's weight columns of that head; "mean" replaces
them with the clean run's mean over the text's positions (mean ablation).

Batches. Each batch row carries its own set of knocked-out heads, so every head of a model is one batched pass
over a few rows each; rows are sorted by their first layer and the layers below a batch's first knock-out run once
(attnviz.interventions.share_prefix). Sessions sharing one cached model stay independent (per-thread plans).

Called, this module is the front door: attnviz.knockout(model, text, ...) is attnviz.front.knockout (attnviz.doors).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from attnviz import interventions as iv
from attnviz import lm
from attnviz.interventions import Plan, as_ids, blocks  # noqa: F401  (blocks: the tests' and callers' name)
from attnviz.projection import KnockoutError, head_width, output_projection, projection_weight  # noqa: F401

MODES = ("zero", "mean")

_HOOKS = iv.HOOKS                # the one set of intervention hooks (attnviz.interventions)
_PREFIX_OK = iv.SHARED_PREFIX    # model -> whether its first layers may be shared by every row


Heads = tuple[tuple[int, int], ...]  # the (layer, head) pairs one row knocks out


def check_heads(loaded, heads: Iterable[tuple[int, int]]) -> Heads:
    """The (layer, head) pairs as sorted ints; KnockoutError naming the first that does not exist."""
    out = set()
    for layer, head in heads:
        layer, head = int(layer), int(head)
        if not 0 <= layer < loaded.shape.layers:
            raise KnockoutError(f"Layer {layer} does not exist: {loaded.spec.name} has layers 0 to "
                                f"{loaded.shape.layers - 1}.")
        if not 0 <= head < loaded.shape.heads:
            raise KnockoutError(f"Head {head} does not exist: {loaded.spec.name} has heads 0 to "
                                f"{loaded.shape.heads - 1}.")
        out.add((layer, head))
    return tuple(sorted(out))


def head_means(loaded, token_ids) -> dict[int, torch.Tensor]:
    """{layer: [head * d_v]} each layer's projection input averaged over the text's positions, in a clean run."""
    record, _ = iv.read(loaded.model, as_ids(token_ids), kinds=("heads",))
    return {key[1]: x.double().mean(0).float() for key, x in record.items()}


def knocked_logits(loaded, token_ids, rows: Sequence[Iterable[tuple[int, int]]], *, mode: str = "zero",
                   means: dict[int, torch.Tensor] | None = None, share_prefix: bool = True) -> torch.Tensor:
    """[len(rows), n, vocab] float32 logits of the text token_ids [n], row b with the heads rows[b] knocked out.

    mode "zero": the heads' outputs are zeroed before the output projection; "mean": replaced by their mean over
    the text's positions in a clean run (`means` from head_means, computed when not given)."""
    if mode not in MODES:
        raise KnockoutError(f"Unknown knock-out mode {mode!r}: use 'zero' or 'mean'.")
    rows = [check_heads(loaded, r) for r in rows]
    if not rows:
        raise KnockoutError("No knock-outs asked for.")
    ids = as_ids(token_ids)
    if mode == "mean" and means is None:
        means = head_means(loaded, ids)
    sites = [[("heads", layer, head) for layer, head in r] for r in rows]
    value = (lambda key: means[key[1]]) if mode == "mean" else (lambda key: 0.0)
    plan = Plan(rows=len(rows), edits=iv.batch_edits(sites, value, n=ids.shape[1], heads=loaded.shape.heads,
                                                     d_v=head_width(loaded)))
    if share_prefix:
        iv.share_prefix(loaded.model, ids, plan, iv.first_layer(sites))
    return iv.run(loaded.model, ids, plan)


@dataclass
class KnockoutResult:
    """The effect of each row's knock-out on one text.

    rows:            the (layer, head) pairs each row knocked out
    loss:            [row] mean next-token loss over the text (nats) with them knocked out
    base_loss:       the same without a knock-out
    target_logprob:  [row] log p(target token | tokens 0..position), or None without a target
    base_target_logprob, target: (position, token id) or None; mode: "zero" or "mean"
    """

    rows: list[Heads]
    loss: np.ndarray
    base_loss: float
    target_logprob: np.ndarray | None
    base_target_logprob: float | None
    target: tuple[int, int] | None
    mode: str
    n_tokens: int

    @property
    def delta_loss(self) -> np.ndarray:
        return self.loss - self.base_loss

    @property
    def delta_target(self) -> np.ndarray | None:
        return None if self.target_logprob is None else self.target_logprob - self.base_target_logprob

    def grid(self, values: np.ndarray, n_layers: int, n_heads: int) -> np.ndarray:
        """[layer, head] of `values` for the rows that knock out one head each (NaN elsewhere)."""
        out = np.full((n_layers, n_heads), np.nan)
        for r, v in zip(self.rows, values):
            if len(r) == 1:
                out[r[0]] = v
        return out


def check_text(loaded, token_ids, target: tuple[int, int] | None = None) -> None:
    """KnockoutError for an encoder, a text under 2 tokens or a target outside the text or vocabulary."""
    iv.check_text(loaded, token_ids, target, error=KnockoutError, what="a knock-out")


def knockout_effects(loaded, token_ids, rows: Sequence[Iterable[tuple[int, int]]], *, mode: str = "zero",
                     target: tuple[int, int] | None = None, batch: int = 16,
                     progress: Callable[[int, int], None] | None = None) -> KnockoutResult:
    """The mean next-token loss of the text (and log p of the target token id at the target position) with each
    row's heads knocked out, `batch` rows per forward pass. progress(rows done, rows) after each batch."""
    token_ids = list(token_ids)
    check_text(loaded, token_ids, target)
    rows = [check_heads(loaded, r) for r in rows]
    if not rows:
        raise KnockoutError("No heads chosen: pick at least one head to knock out.")
    ids = as_ids(token_ids)
    means = head_means(loaded, ids) if mode == "mean" else None
    base = lm.next_token_logits(loaded.model, ids, attention_mask=torch.ones_like(ids))[0]

    def measure(logits) -> tuple[float, float | None]:
        loss = float(lm.token_losses(logits, token_ids).mean())
        if target is None:
            return loss, None
        return loss, float(torch.log_softmax(logits[target[0]].double(), -1)[target[1]])

    base_loss, base_target = measure(base)
    # rows sorted by their first layer, so each batch shares as many untouched layers as it can
    order = sorted(range(len(rows)), key=lambda i: min((layer for layer, _ in rows[i]), default=0))
    loss = np.zeros(len(rows))
    logp = np.zeros(len(rows)) if target is not None else None
    for start in range(0, len(order), batch):
        chunk = order[start:start + batch]
        logits = knocked_logits(loaded, token_ids, [rows[i] for i in chunk], mode=mode, means=means)
        for b, i in enumerate(chunk):
            loss[i], t = measure(logits[b])
            if logp is not None:
                logp[i] = t
        if progress is not None:
            progress(min(start + batch, len(rows)), len(rows))
    return KnockoutResult(rows=rows, loss=loss, base_loss=base_loss, target_logprob=logp,
                          base_target_logprob=base_target, target=None if target is None else tuple(map(int, target)),
                          mode=mode, n_tokens=len(token_ids))


def every_head(loaded) -> list[Heads]:
    """One row per head of the model, layer by layer."""
    return [((layer, head),) for layer in range(loaded.shape.layers) for head in range(loaded.shape.heads)]
