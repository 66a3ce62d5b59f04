"""Direct logit attribution (DLA) per head: what each part of the residual stream writes toward one answer token
against another, at one position.

The final residual stream at a position is a sum of parts: the embeddings, and for every layer what its attention
and its MLP add. A head's part is its output through its own slice of the output projection (W_O[:, head columns]
@ head output); the projection's bias is a part of its own. With the scales of the norms frozen at this run (the
standard choice), everything after the residual stream is linear in it: the final norm divides by the run's
RMS (LayerNorm: centres, then divides by its standard deviation) and multiplies by its weight, the unembedding
maps to logits, and logit[answer] - logit[wrong] is a dot product. Each part's logit difference is that map applied
to the part alone; the final norm's bias and the unembedding's bias are parts too. The parts add up to the model's
own logit difference, which every call checks.

Gemma 2 / 3 blocks normalise what attention and the MLP write before adding it (post_attention_layernorm,
post_feedforward_layernorm): those scales are frozen at the run as well, so each head's share of the attention
output goes through the same frozen norm (the split and the frozen norms: attnviz.residual, which QK attribution
shares; the activations: one plain run read at attnviz.interventions' sites). Families that soft-cap their logits
(Gemma 2) are refused: the cap is not linear. A family whose blocks add something else to the residual stream fails
the check and is refused.

Called, this module is the front door: attnviz.logit_attribution(model, text, answer=..., wrong=...) is
attnviz.front.logit_attribution (attnviz.doors).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnviz import interventions as iv
from attnviz.errors import AttnvizError
from attnviz.prompt_pairs import TokenPair
from attnviz.residual import FrozenNorm, freeze, layer_parts, refused_as, sites  # noqa: F401  (FrozenNorm: its type)

FINAL_NORM_NAMES = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "norm_f")


class LogitAttributionError(AttnvizError, ValueError):
    """Direct logit attribution cannot be done for this model or input; the message says why."""


@dataclass
class LogitAttribution:
    """Each part's share of logit[answer] - logit[wrong] at `position` (float64).

    embeddings: the block-0 input (token and position embeddings); heads: [layer, head]; attn_bias: [layer] the
    output projection's bias; mlp: [layer]; final_bias: the final norm's bias and the unembedding's bias;
    logit_diff: the model's own difference, which the parts add up to; frozen: the norms whose scale was frozen.
    """

    embeddings: float
    heads: np.ndarray
    attn_bias: np.ndarray
    mlp: np.ndarray
    final_bias: float
    logit_diff: float
    answer: int
    wrong: int
    position: int
    frozen: tuple[str, ...]

    @property
    def total(self) -> float:
        """The sum of every part (equals logit_diff to float precision)."""
        return float(self.embeddings + self.heads.sum() + self.attn_bias.sum() + self.mlp.sum() + self.final_bias)

    def terms(self) -> list[tuple[str, float]]:
        """Every part as (label, value): "embeddings", "L3H5", "L3 attn bias", "L3 MLP", "final bias"."""
        out = [("embeddings", float(self.embeddings))]
        for layer in range(self.heads.shape[0]):
            out += [(f"L{layer}H{h}", float(v)) for h, v in enumerate(self.heads[layer])]
            out += [(f"L{layer} attn bias", float(self.attn_bias[layer])), (f"L{layer} MLP", float(self.mlp[layer]))]
        return out + [("final bias", float(self.final_bias))]


def final_norm(model) -> torch.nn.Module:
    """The norm between the last block and the unembedding, named as in FINAL_NORM_NAMES."""
    body = model.base_model
    for name in FINAL_NORM_NAMES:
        module = getattr(body, name, None)
        if isinstance(module, torch.nn.Module):
            return module
    raise LogitAttributionError(f"{type(model).__name__}: attnviz finds no final norm (one of "
                                f"{', '.join(FINAL_NORM_NAMES)}), so it cannot attribute the logits.")


def answer_direction(model, answer: int, wrong: int) -> tuple[torch.Tensor, float]:
    """(u [d] float64, b): logit[answer] - logit[wrong] = u . (final normed residual) + b, with the family's linear
    logit scale folded in. LogitAttributionError for soft-capped logits, which are not linear."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(config, "final_logit_softcapping", None):
        raise LogitAttributionError(f"{type(model).__name__} soft-caps its logits (cap * tanh(logit / cap)): the "
                                    "logit difference is not a sum of parts, so direct logit attribution is refused.")
    head = model.get_output_embeddings()
    w = head.weight.detach()
    u = w[answer].double().cpu() - w[wrong].double().cpu()
    b = 0.0 if getattr(head, "bias", None) is None else float(head.bias[answer].double() - head.bias[wrong].double())
    factor = float(getattr(config, "logit_scale", None) or 1.0) / float(getattr(config, "logits_scaling", None) or 1.0)
    return u * factor, b * factor


@torch.no_grad()
@refused_as(LogitAttributionError)
def direct_logit_attribution(loaded, token_ids, answer: int, wrong: int, position: int = -1) -> LogitAttribution:
    """Each head's, MLP's and bias's share of logit[answer] - logit[wrong] at `position` (default: the last) of the
    text token_ids, with every norm's scale frozen at this run. LogitAttributionError when the parts do not add up
    to the model's own logit difference (a family whose blocks do something attnviz does not decompose)."""
    ids = [int(i) for i in token_ids]
    iv.check_text(loaded, ids, error=LogitAttributionError, what="direct logit attribution")
    for token in (answer, wrong):
        if not 0 <= int(token) < loaded.shape.vocab:
            raise LogitAttributionError(f"Token id {token} is outside the vocabulary (0 to {loaded.shape.vocab - 1}).")
    p = int(position) % len(ids)
    record, logits = sites(loaded, ids)
    u, unembed_bias = answer_direction(loaded.model, int(answer), int(wrong))
    layers = [layer_parts(loaded, layer, record, p) for layer in range(loaded.shape.layers)]
    embeddings = record[("resid", 0)][p].double()
    residual = embeddings + sum(h.sum(0) + b + m for h, b, m, _ in layers)
    norm = freeze(final_norm(loaded.model), residual)
    final_bias = unembed_bias + (0.0 if norm.bias is None else float(norm.bias @ u))
    out = LogitAttribution(
        embeddings=float(norm(embeddings) @ u), heads=np.stack([(norm(h) @ u).numpy() for h, _, _, _ in layers]),
        attn_bias=np.array([float(norm(b) @ u) for _, b, _, _ in layers]),
        mlp=np.array([float(norm(m) @ u) for _, _, m, _ in layers]), final_bias=final_bias,
        logit_diff=float(logits[p, answer].double() - logits[p, wrong].double()), answer=int(answer), wrong=int(wrong),
        position=p, frozen=tuple(sorted({n for *_, names in layers for n in names})) + ("final norm",))
    _check_sum(loaded, out)
    return out


def _check_sum(loaded, out: LogitAttribution) -> None:
    """LogitAttributionError unless the parts add up to the model's own logit difference (to float32 precision of
    the largest part)."""
    size = max(1.0, float(np.abs([v for _, v in out.terms()]).max()))
    if abs(out.total - out.logit_diff) > 1e-3 * size:
        raise LogitAttributionError(f"{loaded.spec.name}: the parts add up to {out.total:.6g}, the model's logit "
                                    f"difference is {out.logit_diff:.6g}; its blocks add something attnviz does not "
                                    "decompose, so the attribution is not shown.")


def pair_attribution(loaded, pair: TokenPair, prompt: str = "clean") -> LogitAttribution:
    """DLA of a prompt pair's clean (or corrupted) prompt onto its answer minus its wrong answer, last position."""
    ids = pair.clean_ids if prompt == "clean" else pair.corrupted_ids
    return direct_logit_attribution(loaded, ids, pair.answer, pair.wrong)
