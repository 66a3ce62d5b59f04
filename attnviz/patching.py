"""Activation patching and attribution patching: which parts of a model carry the difference between a clean prompt
and a corrupted prompt of the same token length.

Metric. At the last position: the logit difference between the clean answer token and the corrupted answer token,
or the loss (-log p) of the clean answer; normalised so that the corrupted run scores 0 and the clean run 1.

Sites. A patched run is the corrupted prompt with some activations replaced by the clean run's, at the sites of
attnviz.interventions: ("heads", layer, head) (the head's output before the output projection, at every position),
("resid", layer, position) (the residual stream entering the block), ("attn", layer, position) (the attention
module's output, before any norm the block applies to it) and ("mlp", layer, position). Batches are built as
knock-outs are: each row patches its own sites, rows sorted by their first layer, and the layers below a batch's
first patch run once and are shared by every row (attnviz.interventions.share_prefix).

Attribution patching (AtP; Nanda 2023, Syed et al. 2023) estimates every site at once, to first order:
(clean - corrupted activation) . d metric / d activation, at the corrupted run, from one forward and one backward
pass. A zero tensor that requires grad is added at every site, so the gradient is the total derivative through
every later layer; the model's weights stay untouched and need no grad.

Threads. Every edit is this thread's plan (attnviz.interventions): other sessions on the model see it unpatched.

Called, this module is the front door: attnviz.patching(model, clean, corrupted, answer=..., wrong=...) is
attnviz.front.patching (attnviz.doors).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from attnviz import interventions as iv
from attnviz.projection import head_width
from attnviz.prompt_pairs import (  # noqa: F401  (the experiment's names: pairs are what it takes)
    READY_PAIRS, PatchingError, PromptPair, TokenPair, ready_pair, tokenize_pair)

KINDS = ("heads", "resid", "attn", "mlp")  # the sites patched (attnviz.interventions' kinds but "out")
METRICS = ("logit_diff", "loss")

Site = iv.Site  # (kind, layer, head or position)
_HOOKS = iv.HOOKS  # the one set of intervention hooks


def mlp_module(block, required: bool = True) -> torch.nn.Module | None:
    """The block's MLP (attnviz.interventions.mlp_module); PatchingError without one, or None if not required."""
    return iv.mlp_module(block, required, error=PatchingError)


def activations(loaded, token_ids) -> tuple[dict[tuple[str, int], torch.Tensor], torch.Tensor]:
    """({(kind, layer): [n, d]} every site's activation in a plain run of token_ids, [n, vocab] logits)."""
    head_width(loaded)  # KnockoutError, before any hook goes on, for a model without a known output projection
    return iv.read(loaded.model, iv.as_ids(token_ids), kinds=KINDS)


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
            blocks = blocks or iv.blocks(loaded.model)
            if not blocks:
                raise PatchingError(f"{loaded.spec.name} has no stack of blocks attnviz finds: patch heads instead.")
            if kind == "mlp":
                mlp_module(blocks[layer])
        out.add((kind, layer, index))
    return tuple(sorted(out, key=lambda s: (s[1], KINDS.index(s[0]), s[2])))


def patched_logits(loaded, pair: TokenPair, rows: Sequence[Iterable[Site]], *, clean: dict | None = None,
                   share_prefix: bool = True) -> torch.Tensor:
    """[len(rows), n, vocab] float32 logits of the corrupted prompt, row b with the sites rows[b] set to the clean
    run's activations (`clean` from activations(loaded, pair.clean_ids), computed when not given)."""
    rows = [check_sites(loaded, pair.n, r) for r in rows]
    if not rows:
        raise PatchingError("No patches asked for.")
    if clean is None:
        clean, _ = activations(loaded, pair.clean_ids)
    ids = iv.as_ids(pair.corrupted_ids)
    edits = iv.batch_edits(rows, lambda key: clean[key][None], n=pair.n, heads=loaded.shape.heads,
                           d_v=head_width(loaded))
    plan = iv.Plan(rows=len(rows), edits=edits)
    if share_prefix:
        iv.share_prefix(loaded.model, ids, plan, iv.first_layer(rows))
    return iv.run(loaded.model, ids, plan)


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
    iv.check_text(loaded, pair.clean_ids, error=PatchingError, what="patching")
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
    ids = iv.as_ids(token_ids).to(model.get_input_embeddings().weight.device)
    patch = iv.Plan(record={}, deltas={}, kinds=KINDS)
    with iv.applied(model, patch), torch.inference_mode(False), torch.enable_grad():
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
    iv.check_text(loaded, pair.clean_ids, error=PatchingError, what="patching")
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
