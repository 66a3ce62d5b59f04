"""The residual stream as a sum of parts, with the norms' scales frozen at one run: what direct logit attribution
(attnviz.logit_attribution) and QK attribution (attnviz.qk_attribution) both decompose.

The residual stream entering layer L at a position is the embeddings plus, for every earlier layer, what each head
writes (its output through its own slice of the output projection, W_O[:, head columns] @ head output), the
projection's bias and the MLP's output. Gemma 2 / 3 (and OLMo 2) blocks normalise what attention and the MLP write
before adding it: those norms are frozen at the run, so each head's share goes through the same linear map. The
activations come from one plain run read at the sites of attnviz.interventions. Every split is checked against the
stream the model computed (check_sum); DecompositionError when something does not add up, which each experiment
turns into its own error (refused_as).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnviz import interventions as iv
from attnviz.errors import AttnvizError
from attnviz.projection import output_projection, projection_weight

SANDWICH = ("post_attention_layernorm", "post_feedforward_layernorm")  # Gemma 2 / 3: norms on what blocks add
SITE_KINDS = ("heads", "resid", "attn", "mlp")


class DecompositionError(AttnvizError, ValueError):
    """The residual stream of this model cannot be split into parts; the message says why."""


def refused_as(error: type[Exception]) -> Callable:
    """A decorator: DecompositionError raised inside the function becomes `error` with the same message."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except DecompositionError as exc:
                raise error(str(exc)) from None
        return inner
    return wrap


def sites(loaded, token_ids, kinds: tuple[str, ...] = SITE_KINDS) -> tuple[dict, torch.Tensor]:
    """({(kind, layer): [n, d]} the sites a decomposition reads, in one plain run of token_ids, [n, vocab] logits)
    (attnviz.interventions.read); DecompositionError for a model without a known output projection."""
    try:
        output_projection(loaded.model, 0)
    except AttnvizError as exc:
        raise DecompositionError(str(exc)) from None
    return iv.read(loaded.model, iv.as_ids(token_ids), kinds=kinds)


@dataclass(frozen=True)
class FrozenNorm:
    """A norm with its scale frozen at one input: parts -> (parts - their mean, for LayerNorm) * gain, a linear map;
    the norm's bias (None for RMSNorm) is kept apart, as a part of its own."""

    gain: torch.Tensor  # [d] float64: weight / the input's RMS (or standard deviation)
    center: bool
    bias: torch.Tensor | None

    def __call__(self, parts: torch.Tensor) -> torch.Tensor:
        parts = parts - parts.mean(-1, keepdim=True) if self.center else parts
        return parts * self.gain


def freeze(norm: torch.nn.Module, y: torch.Tensor) -> FrozenNorm:
    """The norm frozen at input y [d] (float64). The weight convention (w, or Gemma's 1 + w) is the one that
    reproduces the module's own output on y; DecompositionError when none does."""
    eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
    weight = getattr(norm, "weight", None)
    if eps is None or weight is None:
        raise DecompositionError(f"{type(norm).__name__} is not a LayerNorm or RMSNorm attnviz can freeze.")
    w = weight.detach().double().cpu()
    bias = getattr(norm, "bias", None)
    bias = None if bias is None else bias.detach().double().cpu()
    center = isinstance(norm, torch.nn.LayerNorm) or ("LayerNorm" in type(norm).__name__ and bias is not None)
    centred = y - y.mean() if center else y
    scale = torch.sqrt(centred.pow(2).mean() + float(eps))
    target = norm(y.to(weight.dtype).to(weight.device)[None]).detach().double().cpu()[0]
    for candidate in ((w,) if center else (w, 1 + w)):
        frozen = FrozenNorm(candidate / scale, center, bias)
        got = frozen(y) + (0 if bias is None else bias)
        if torch.allclose(got, target, rtol=1e-4, atol=1e-4 * float(target.abs().max())):
            return frozen
    raise DecompositionError(f"{type(norm).__name__} does not compute weight * x / RMS(x) (or LayerNorm) as "
                             "attnviz expects, so its scale cannot be frozen.")


def layer_parts(loaded, layer: int, record: dict, p: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list]:
    """(heads [head, d], projection bias [d], MLP [d]) that layer `layer` adds to the residual stream at position p,
    float64, through its frozen post-norms where the block has them (their names are returned)."""
    model, heads = loaded.model, loaded.shape.heads
    proj = output_projection(model, layer)
    w = projection_weight(proj).detach().double().cpu()  # [d, head * d_v]
    x = record[("heads", layer)][p].double()
    per_head = torch.einsum("dhv,hv->hd", w.reshape(w.shape[0], heads, -1), x.reshape(heads, -1))
    bias = torch.zeros(w.shape[0], dtype=torch.float64) if proj.bias is None else proj.bias.detach().double().cpu()
    mlp = record[("mlp", layer)][p].double()
    block = iv.blocks(model)[layer]
    if not all(isinstance(getattr(block, name, None), torch.nn.Module) for name in SANDWICH):
        return per_head, bias, mlp, []
    after_attn = freeze(block.post_attention_layernorm, record[("attn", layer)][p].double())
    after_mlp = freeze(block.post_feedforward_layernorm, mlp)
    if after_attn.bias is not None or after_mlp.bias is not None:
        raise DecompositionError(f"{type(block).__name__}'s post-norms have a bias, which attnviz does not split.")
    return after_attn(per_head), after_attn(bias), after_mlp(mlp), list(SANDWICH)


def check_sum(loaded, what: str, got: torch.Tensor, want: torch.Tensor, size: float | None = None) -> None:
    """DecompositionError unless the parts' sum `got` equals the model's own `want` to float32 precision of `size`
    (default: want's largest entry)."""
    error = float((got - want).abs().max())
    size = float(want.abs().max()) if size is None else size
    if not error <= 1e-3 * max(1.0, size):
        raise DecompositionError(f"{loaded.spec.name}: the parts of {what} differ from the model's own by "
                                 f"{error:.3g}; this family computes something attnviz does not decompose, so the "
                                 "attribution is not shown.")


def residual_parts(loaded, record: dict, layer: int, p: int) -> tuple[list[str], torch.Tensor, list[str]]:
    """(labels, parts [n_parts, d] float64, frozen post-norm names): the residual stream entering block `layer` at
    position p, split into the embeddings and each earlier layer's heads, attention bias and MLP, checked against the
    stream the model computed (`record` from sites)."""
    if ("resid", layer) not in record:
        raise DecompositionError(f"{loaded.spec.name} has no stack of blocks attnviz finds, so its residual "
                                 "stream cannot be split.")
    labels, rows, frozen = ["embeddings"], [record[("resid", 0)][p].double()], set()
    for earlier in range(layer):
        heads, bias, mlp, names = layer_parts(loaded, earlier, record, p)
        labels += [f"L{earlier}H{h}" for h in range(heads.shape[0])] + [f"L{earlier} attn bias", f"L{earlier} MLP"]
        rows += [*heads, bias, mlp]
        frozen.update(names)
    parts = torch.stack(rows)
    check_sum(loaded, f"layer {layer}'s residual stream", parts.sum(0), record[("resid", layer)][p].double())
    return labels, parts, sorted(frozen)
