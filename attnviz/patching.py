"""Activation patching and attribution patching: which parts of a model carry the difference between a clean prompt
and a corrupted prompt of the same token length.

Metric. At the last position: the logit difference between the clean answer token and the corrupted answer token,
or the loss (-log p) of the clean answer; normalised so that the corrupted run scores 0 and the clean run 1.

Sites. A patched run is the corrupted prompt with some activations replaced by the clean run's:
  ("heads", layer, head)     the head's output before the output projection, at every position: the columns that
                             attnviz.knockout edits, through its hooks and plan (add = the clean columns);
  ("resid", layer, position) the residual stream entering the block;
  ("attn", layer, position)  the attention module's output (after the output projection, before any norm the block
                             applies to it);
  ("mlp", layer, position)   the MLP's output.
Batches are built as knock-outs are: each row patches its own sites, rows sorted by their first layer, and the layers
below a batch's first patch run once and are shared by every row (attnviz.knockout's check decides per model).

Attribution patching (AtP; Nanda 2023, Syed et al. 2023) estimates every site at once, to first order:
(clean - corrupted activation) . d metric / d activation, at the corrupted run, from one forward and one backward
pass. A zero tensor that requires grad is added at every site, so the gradient is the total derivative through
every later layer; the model's weights stay untouched and need no grad.

Threads. Hooks act only for the thread whose plan is set (ContextVar), as in attnviz.knockout.

Called, this module is the front door: attnviz.patching(model, clean, corrupted, answer=..., wrong=...) is
attnviz.front.patching (attnviz.doors).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from attnviz import knockout as ko
from attnviz.capture import attention_modules
from attnviz.capture import SharedHooks
from attnviz.prompt_pairs import (  # noqa: F401  (the experiment's names: pairs are what it takes)
    READY_PAIRS, PatchingError, PromptPair, TokenPair, ready_pair, tokenize_pair)

KINDS = ("heads", "resid", "attn", "mlp")
METRICS = ("logit_diff", "loss")
MLP_NAMES = ("mlp", "feed_forward", "ffn")

Site = tuple[str, int, int]  # (kind, layer, head or position)



# -- hooks -----------------------------------------------------------------------------------------------------------

@dataclass
class _Patch:
    masks: dict = field(default_factory=dict)  # (kind, layer) -> ([rows, n, 1] bool: patch here, [1, n, d] clean)
    record: dict | None = None                 # filled: (kind, layer) -> [n, d] of row 0, the model's dtype
    deltas: dict | None = None                 # filled: (kind, layer) -> zero [1, n, d] tensor that requires grad


_PATCH: ContextVar[_Patch | None] = ContextVar("attnviz_patching", default=None)


def _edit(key: tuple[str, int], x: torch.Tensor) -> torch.Tensor | None:
    """x [batch, n, d] at a site as this thread's plan wants it (None: unchanged)."""
    plan = _PATCH.get()
    if plan is None:
        return None
    if plan.record is not None:
        plan.record[key] = x[0].detach().cpu().clone()
    out = None
    if key in plan.masks:
        mask, clean = plan.masks[key]
        mask = mask.to(x.device)
        out = torch.where(mask, clean.to(device=x.device, dtype=x.dtype), x)  # [rows, n, d]: broadcasts batch 1
    if plan.deltas is not None:
        plan.deltas[key] = torch.zeros_like(x, requires_grad=True)
        out = (x if out is None else out) + plan.deltas[key]
    return out


def _block_input(layer, module, args, kwargs):
    if args:
        new = _edit(("resid", layer), args[0])
        return None if new is None else ((new, *args[1:]), kwargs)
    new = _edit(("resid", layer), kwargs["hidden_states"])
    return None if new is None else (args, {**kwargs, "hidden_states": new})


def _module_output(key, module, args, output):
    first = output[0] if isinstance(output, tuple) else output
    new = _edit(key, first)
    if new is None:
        return None
    return (new, *output[1:]) if isinstance(output, tuple) else new


def _projection_input(layer, module, args):
    new = _edit(("heads", layer), args[0])
    return None if new is None else (new, *args[1:])


def mlp_module(block, required: bool = True) -> torch.nn.Module | None:
    """The block's MLP: its child named as in MLP_NAMES. Without one: PatchingError, or None if not required."""
    for name in MLP_NAMES:
        if isinstance(getattr(block, name, None), torch.nn.Module):
            return getattr(block, name)
    if not required:
        return None
    raise PatchingError(f"{type(block).__name__} has no MLP attnviz recognises (one of {', '.join(MLP_NAMES)}).")


def _install(model) -> list:
    handles = []
    for layer, attn in enumerate(attention_modules(model)):
        handles.append(ko.output_projection(model, layer).register_forward_pre_hook(partial(_projection_input, layer)))
        handles.append(attn.register_forward_hook(partial(_module_output, ("attn", layer))))
    for layer, block in enumerate(ko.blocks(model) or []):
        handles.append(block.register_forward_pre_hook(partial(_block_input, layer), with_kwargs=True))
        mlp = mlp_module(block, required=False)
        if mlp is not None:
            handles.append(mlp.register_forward_hook(partial(_module_output, ("mlp", layer))))
    return handles


_HOOKS = SharedHooks(_install)


def _run(model, ids: torch.Tensor, knock: ko.Plan, patch: _Patch) -> torch.Tensor:
    """[rows, n, vocab] float32 logits of ids [1, n] under the knock-out plan (head patches) and the patch plan."""
    with _HOOKS.serving(model, _PATCH, patch):
        return ko.forward_with(model, ids, knock)


def activations(loaded, token_ids) -> tuple[dict[tuple[str, int], torch.Tensor], torch.Tensor]:
    """({(kind, layer): [n, d]} every site's activation in a plain run of token_ids, [n, vocab] logits)."""
    ko.head_width(loaded)  # KnockoutError, before any hook goes on, for a model without a known output projection
    patch = _Patch(record={})
    logits = _run(loaded.model, ko.as_ids(token_ids), ko.Plan(), patch)
    return patch.record, logits[0]


# -- activation patching ---------------------------------------------------------------------------------------------

def check_sites(loaded, n: int, sites: Iterable[Site]) -> tuple[Site, ...]:
    """The sites as sorted (kind, layer, index) ints; PatchingError naming the first that does not exist."""
    out, blocks = set(), None
    for kind, layer, index in sites:
        if kind not in KINDS:
            raise PatchingError(f"Unknown site kind {kind!r}: use one of {', '.join(KINDS)}.")
        layer, index = int(layer), int(index)
        top = loaded.shape.heads if kind == "heads" else n
        if not 0 <= layer < loaded.shape.layers or not 0 <= index < top:
            what = "head" if kind == "heads" else "position"
            raise PatchingError(f"({kind}, layer {layer}, {what} {index}) does not exist: {loaded.spec.name} has "
                                f"layers 0 to {loaded.shape.layers - 1} and {what}s 0 to {top - 1}.")
        if kind in ("resid", "mlp"):
            blocks = blocks or ko.blocks(loaded.model)
            if not blocks:
                raise PatchingError(f"{loaded.spec.name} has no stack of blocks attnviz finds: patch heads instead.")
            if kind == "mlp":
                mlp_module(blocks[layer])
        out.add((kind, layer, index))
    return tuple(sorted(out, key=lambda s: (s[1], KINDS.index(s[0]), s[2])))


def _plans(loaded, n: int, rows: list[tuple[Site, ...]], clean: dict) -> tuple[ko.Plan, _Patch]:
    """The knock-out plan that puts the clean head columns in, and the patch plan for the other sites."""
    knock, patch = ko.Plan(rows=len(rows)), _Patch()
    d_v = ko.head_width(loaded)
    for kind, layer in sorted({(s[0], s[1]) for r in rows for s in r}):
        if kind == "heads":
            keep = torch.ones(len(rows), 1, d_v * loaded.shape.heads)
            for b, r in enumerate(rows):
                for _, _, head in (s for s in r if s[:2] == (kind, layer)):
                    keep[b, 0, head * d_v:(head + 1) * d_v] = 0
            knock.keep[layer], knock.add[layer] = keep, (1 - keep) * clean[(kind, layer)]
        else:
            mask = torch.zeros(len(rows), n, 1, dtype=torch.bool)
            for b, r in enumerate(rows):
                for _, _, position in (s for s in r if s[:2] == (kind, layer)):
                    mask[b, position] = True
            patch.masks[(kind, layer)] = (mask, clean[(kind, layer)][None])
    return knock, patch


def patched_logits(loaded, pair: TokenPair, rows: Sequence[Iterable[Site]], *, clean: dict | None = None,
                   share_prefix: bool = True) -> torch.Tensor:
    """[len(rows), n, vocab] float32 logits of the corrupted prompt, row b with the sites rows[b] set to the clean
    run's activations (`clean` from activations(loaded, pair.clean_ids), computed when not given)."""
    rows = [check_sites(loaded, pair.n, r) for r in rows]
    if not rows:
        raise PatchingError("No patches asked for.")
    if clean is None:
        clean, _ = activations(loaded, pair.clean_ids)
    ids = ko.as_ids(pair.corrupted_ids)
    knock, patch = _plans(loaded, pair.n, rows, clean)
    first = min((r[0][1] for r in rows if r), default=None)  # rows are sorted by layer
    if share_prefix and len(rows) > 1 and first and ko.prefix_ok(loaded.model, ids):
        knock.expand_at = first
    return _run(loaded.model, ids, knock, patch)


def metric_values(last_logits: torch.Tensor, pair: TokenPair, metric: str = "logit_diff") -> torch.Tensor:
    """[rows] float64 metric of logits [rows, vocab] at the last position: logit(answer) - logit(wrong), or the loss
    -log p(answer). Differentiable."""
    z = last_logits.double()
    if metric == "logit_diff":
        return z[:, pair.answer] - z[:, pair.wrong]
    if metric == "loss":
        return -torch.log_softmax(z, dim=-1)[:, pair.answer]
    raise PatchingError(f"Unknown metric {metric!r}: use 'logit_diff' or 'loss'.")


def every_site(loaded, kind: str, n: int) -> list[Site]:
    """Every site of one kind, layer by layer: layer x head, or layer x position."""
    if kind not in KINDS:
        raise PatchingError(f"Unknown site kind {kind!r}: use one of {', '.join(KINDS)}.")
    width = loaded.shape.heads if kind == "heads" else n
    return [(kind, layer, i) for layer in range(loaded.shape.layers) for i in range(width)]


@dataclass
class PatchingResult:
    """The metric of the corrupted prompt with each site patched from the clean one.

    kind:      "heads" (values [layer, head]) or "resid", "attn", "mlp" (values [layer, position])
    values:    the raw metric of each patched run; clean_value, corrupted_value: the unpatched runs'
    metric:    "logit_diff" or "loss"; pair: the TokenPair
    """

    kind: str
    metric: str
    values: np.ndarray
    clean_value: float
    corrupted_value: float
    pair: TokenPair

    @property
    def normalised(self) -> np.ndarray:
        """(value - corrupted) / (clean - corrupted): 0 = the corrupted run, 1 = the clean run."""
        return (self.values - self.corrupted_value) / (self.clean_value - self.corrupted_value)

    def columns(self) -> list[str]:
        """The labels of the grid's columns: head numbers, or each position's tokens."""
        return [str(h) for h in range(self.values.shape[1])] if self.kind == "heads" else self.pair.position_labels()


def base_values(loaded, pair: TokenPair, metric: str = "logit_diff") -> tuple[float, float, dict]:
    """(clean metric, corrupted metric, the clean run's activations); PatchingError when the metric does not tell
    the two runs apart (nothing to patch)."""
    clean, clean_logits = activations(loaded, pair.clean_ids)
    _, corrupted_logits = activations(loaded, pair.corrupted_ids)
    values = metric_values(torch.stack([clean_logits[-1], corrupted_logits[-1]]), pair, metric)
    a, b = float(values[0]), float(values[1])
    if not abs(a - b) > 1e-6 * max(1.0, abs(a), abs(b)):
        raise PatchingError(f"The {metric} is the same on the clean and the corrupted prompt ({a:.4g}): there is no "
                            "difference to patch. Choose prompts the model answers differently.")
    return a, b, clean


def activation_patching(loaded, pair: TokenPair, kind: str = "heads", metric: str = "logit_diff", *,
                        batch: int = 16, progress: Callable[[int, int], None] | None = None) -> PatchingResult:
    """Patch every site of one kind (layer x head, or layer x position), one site per row, `batch` rows per
    forward pass. progress(rows done, rows) after each batch."""
    ko.check_text(loaded, pair.clean_ids)
    clean_value, corrupted_value, clean = base_values(loaded, pair, metric)
    sites = every_site(loaded, kind, pair.n)  # layer by layer: each batch shares the layers below its first
    values = np.zeros(len(sites))
    for start in range(0, len(sites), batch):
        chunk = sites[start:start + batch]
        logits = patched_logits(loaded, pair, [(s,) for s in chunk], clean=clean)[:, -1]
        values[start:start + len(chunk)] = metric_values(logits, pair, metric).numpy()
        if progress is not None:
            progress(min(start + batch, len(sites)), len(sites))
    return PatchingResult(kind, metric, values.reshape(loaded.shape.layers, -1), clean_value, corrupted_value, pair)


# -- attribution patching --------------------------------------------------------------------------------------------

def _gradients(loaded, token_ids, pair: TokenPair, metric: str) -> tuple[float, dict, dict]:
    """(metric, {site key: [n, d] activation}, {site key: [n, d] d metric / d activation}) of one forward and one
    backward pass of token_ids; float64 gradients."""
    model = loaded.model
    ids = ko.as_ids(token_ids).to(model.get_input_embeddings().weight.device)
    patch = _Patch(record={}, deltas={})
    with _HOOKS.serving(model, _PATCH, patch), torch.inference_mode(False), torch.enable_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
        value = metric_values(logits[:, -1], pair, metric)[0]
        keys = list(patch.deltas)
        grads = torch.autograd.grad(value, [patch.deltas[k] for k in keys], allow_unused=True)
    out = {k: torch.zeros_like(patch.record[k], dtype=torch.float64) if g is None else g[0].detach().double().cpu()
           for k, g in zip(keys, grads)}
    return float(value.detach()), patch.record, out


def attribution_patching(loaded, pair: TokenPair, metric: str = "logit_diff") -> dict[str, np.ndarray]:
    """AtP estimate of every site, normalised as PatchingResult.normalised (0 = no change from the corrupted run,
    1 = the whole clean-minus-corrupted difference): {"heads": [layer, head], "resid" / "attn" / "mlp":
    [layer, position]}. Each entry is (clean - corrupted activation) . gradient at the corrupted run, summed over
    the site's components (and, for a head, over positions), divided by (clean - corrupted metric)."""
    ko.check_text(loaded, pair.clean_ids)
    clean_value, corrupted_value, clean = base_values(loaded, pair, metric)
    _, corrupted, grads = _gradients(loaded, pair.corrupted_ids, pair, metric)
    scale = clean_value - corrupted_value
    layers, heads = loaded.shape.layers, loaded.shape.heads
    out = {kind: np.full((layers, heads if kind == "heads" else pair.n), np.nan) for kind in KINDS}
    for (kind, layer), grad in grads.items():
        term = (clean[(kind, layer)].double() - corrupted[(kind, layer)].double()) * grad  # [n, d]
        if kind == "heads":
            out[kind][layer] = term.reshape(pair.n, heads, -1).sum((0, 2)).numpy() / scale
        else:
            out[kind][layer] = term.sum(-1).numpy() / scale
    return out


@dataclass
class Comparison:
    """Real patching beside attribution patching, both normalised: their Pearson correlation over every site and
    the sites where they disagree most (row, column, patched, attributed), largest |patched - attributed| first."""

    patched: PatchingResult
    attributed: np.ndarray
    pearson: float
    disagreements: list[tuple[int, int, float, float]]


def compare(patched: PatchingResult, attributed: np.ndarray, top: int = 10) -> Comparison:
    """Pearson correlation of the two grids and the `top` sites where they differ most."""
    real, estimate = patched.normalised, np.asarray(attributed, dtype=float)
    a, b = real.ravel(), estimate.ravel()
    pearson = float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0 else float("nan")
    order = np.argsort(-np.abs(a - b), kind="stable")[:top]
    cols = real.shape[1]
    return Comparison(patched, estimate, pearson,
                      [(int(i // cols), int(i % cols), float(a[i]), float(b[i])) for i in order])


def patching_with_attribution(loaded, pair: TokenPair, kind: str = "heads", metric: str = "logit_diff", *,
                              batch: int = 16, top: int = 10,
                              progress: Callable[[int, int], None] | None = None) -> Comparison:
    """Real activation patching of every site of `kind` and its AtP estimate, compared."""
    patched = activation_patching(loaded, pair, kind, metric, batch=batch, progress=progress)
    return compare(patched, attribution_patching(loaded, pair, metric)[kind], top=top)
