"""Head knock-outs and their measured effect: a head's output is zeroed, or replaced by its mean over positions,
just before the attention output projection, and the change in next-token loss (and in the log-probability of a
chosen target token) is measured.

Where. The output projection (o_proj, c_proj, dense, out_proj, ...) takes the heads' outputs side by side,
[batch, query, head * d_v]: head h owns input columns h * d_v ... (h + 1) * d_v - 1 in every family. A forward
pre-hook there edits those columns, so one mechanism serves every family, including those whose attention does not
go through transformers' attention interface (BLOOM, Falcon, GPT-J). Zeroing the columns is the same as zeroing
the projection's weight columns of that head; "mean" replaces them with the clean run's mean over the text's
positions (mean ablation).

Batches. Each batch row carries its own set of knocked-out heads, so every head of a model is one batched pass
over a few rows each. A knock-out in layer l leaves layers below l untouched, so a batch whose heads all sit in
layers >= l runs layers 0 .. l-1 once for one row and copies their output to every row (checked once per model
against a plain forward pass; a family where that does not hold gets full batches).

Threads. The hooks read the plan of the current thread from a ContextVar and do nothing without one: sessions
sharing one cached model stay independent.

Called, this module is the front door: attnviz.knockout(model, text, ...) is attnviz.front.knockout (attnviz.doors).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from attnviz import lm
from attnviz.capture import attention_modules
from attnviz.capture import SharedHooks, decoder_layers
from attnviz.projection import KnockoutError, head_width, output_projection, projection_weight  # noqa: F401

MODES = ("zero", "mean")


@dataclass
class Plan:
    """What one batched forward pass does to the heads' outputs (a ContextVar holds it while forward_with runs; the
    projection hooks read it): knock-outs per layer and row, mean-ablation means to fill, a shared prefix."""

    keep: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [batch, 1, in] 1 = keep, 0 = knocked
    add: dict[int, torch.Tensor] = field(default_factory=dict)   # layer -> [batch, 1, in] what replaces them
    means: dict[int, torch.Tensor] | None = None                  # filled: layer -> [in] mean over positions, row 0
    expand_at: int | None = None                                  # block whose input is copied to `rows` rows
    rows: int = 1


_PLAN: ContextVar[Plan | None] = ContextVar("attnviz_knockout", default=None)
_PREFIX_OK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _before_projection(layer: int, module, args):
    plan = _PLAN.get()
    if plan is None:
        return None
    x = args[0]  # [batch, query, head * d_v]
    if plan.means is not None:
        plan.means[layer] = x[0].double().mean(0).float().cpu()
    if layer not in plan.keep:
        return None
    keep = plan.keep[layer].to(device=x.device, dtype=x.dtype)
    add = plan.add[layer].to(device=x.device, dtype=x.dtype)
    return (x * keep + add, *args[1:])


def _before_block(layer: int, module, args, kwargs):
    plan = _PLAN.get()
    if plan is None or plan.expand_at != layer:
        return None
    if args:
        hidden = args[0]
        return (hidden.expand(plan.rows, *hidden.shape[1:]), *args[1:]), kwargs
    hidden = kwargs["hidden_states"]
    return args, {**kwargs, "hidden_states": hidden.expand(plan.rows, *hidden.shape[1:])}


def blocks(model) -> list[torch.nn.Module] | None:
    """The transformer block of each layer (attnviz.capture.decoder_layers), or None when the model has no such
    list."""
    try:
        return decoder_layers(model)
    except ValueError:
        return None


def _install(model) -> list:
    handles = []
    for layer in range(len(attention_modules(model))):
        handles.append(output_projection(model, layer).register_forward_pre_hook(partial(_before_projection, layer)))
    for layer, block in enumerate(blocks(model) or []):
        handles.append(block.register_forward_pre_hook(partial(_before_block, layer), with_kwargs=True))
    return handles


_HOOKS = SharedHooks(_install)  # the projection (and block) hooks, shared by concurrent users


def forward_with(model, ids: torch.Tensor, plan: Plan) -> torch.Tensor:
    """[rows, n, vocab] float32 logits of ids [1, n] under `plan` (rows = plan.rows)."""
    if plan.expand_at is None:
        ids = ids.expand(plan.rows, -1)
    with _HOOKS.serving(model, _PLAN, plan), torch.inference_mode():
        logits = lm.next_token_logits(model, ids, attention_mask=torch.ones_like(ids))
    if logits.shape[0] != plan.rows:
        raise KnockoutError("The shared first layers did not expand to every row.")
    return logits


def prefix_ok(model, ids: torch.Tensor) -> bool:
    """Whether running the untouched first layers once and copying them to every row gives the plain forward pass
    (once per model; families whose blocks take per-row inputs, as BLOOM's ALiBi, do not)."""
    ok = _PREFIX_OK.get(model)
    if ok is None:
        n_blocks = len(blocks(model) or [])
        ok = False
        if n_blocks > 1:
            try:
                plain = forward_with(model, ids, Plan())
                shared = forward_with(model, ids, Plan(expand_at=n_blocks - 1, rows=2))
                ok = bool(torch.allclose(shared, plain.expand_as(shared), atol=1e-4, rtol=1e-4))
            except Exception:
                ok = False
        _PREFIX_OK[model] = ok
    return ok


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
    plan = Plan(means={})
    forward_with(loaded.model, as_ids(token_ids), plan)
    return plan.means


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
    d_v = head_width(loaded)
    width = d_v * loaded.shape.heads
    plan = Plan(rows=len(rows))
    for layer in sorted({layer for r in rows for layer, _ in r}):
        keep = torch.ones(len(rows), 1, width)
        for b, r in enumerate(rows):
            for _, head in (x for x in r if x[0] == layer):
                keep[b, 0, head * d_v:(head + 1) * d_v] = 0
        plan.keep[layer] = keep
        plan.add[layer] = (1 - keep) * means[layer] if mode == "mean" else torch.zeros_like(keep)
    first = min((min(layer for layer, _ in r) for r in rows if r), default=None)
    if share_prefix and len(rows) > 1 and first and prefix_ok(loaded.model, ids):
        plan.expand_at = first
    return forward_with(loaded.model, ids, plan)


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


def as_ids(token_ids) -> torch.Tensor:
    """Token ids as the [1, n] long tensor a forward pass takes."""
    return torch.as_tensor(token_ids).long().reshape(1, -1)


def check_text(loaded, token_ids, target: tuple[int, int] | None = None) -> None:
    """KnockoutError for an encoder, a text under 2 tokens or a target outside the text or vocabulary."""
    if not lm.is_language_model(loaded.model):
        raise KnockoutError(f"{loaded.spec.name} is an encoder: it predicts no next token, so a knock-out has no "
                            "loss to change. Pick a decoder (toy-gpt2, smollm2-135m, ...).")
    n = len(token_ids)
    if n < 2:
        raise KnockoutError("The text is one token long: the next-token loss needs at least two tokens.")
    if target is not None:
        position, token = target
        if not 0 <= int(position) < n:
            raise KnockoutError(f"Target position {position} is outside the text (positions 0 to {n - 1}).")
        if not 0 <= int(token) < loaded.shape.vocab:
            raise KnockoutError(f"Token id {token} is outside the vocabulary (0 to {loaded.shape.vocab - 1}).")


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
