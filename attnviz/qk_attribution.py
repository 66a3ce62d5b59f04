"""QK attribution (Kamath et al. 2025): why one head at one query position scores one key position as it does.

The residual stream entering layer L at a position is a sum of parts: the embeddings, and for every earlier layer
what each of its heads writes (through its slice of the output projection), the projection's bias and the MLP's
output (through the frozen post-norms of Gemma 2 / 3 and OLMo 2 blocks), as attnviz.residual splits it for direct
logit attribution too; the activations and the rotary tables come from one plain run read at attnviz.interventions'
sites.
With the scales of the norms frozen at this run (the layer's input norm: x * w / rms(x_total); the QK-norm of
Gemma 3, Qwen 3 and OLMo 2 after the projection, frozen the same way at the run's q and k), the query and the key
are linear in those parts: q = sum_a R_q n_q(W_q n(x_a)) plus the bias part, R_q the rotary rotation at the query
position (linear too), and the same for k at the key position. The head's pre-softmax score q . k * scaling is then
exactly sum_(a, b) (q_a . k_b) * scaling over (query-side part a, key-side part b) pairs: `terms`.

The same score also splits by RoPE frequency: the rotation turns each plane (i, i + d/2) of the head's dimensions
by its own angle, and the score is the sum over planes of the two coordinates' products: `by_frequency`.

Every call checks its work against the model: the parts' q and k add up to the q and k the model used (recorded by
attnviz.capture) and the terms add up to the model's own score; QKAttributionError when they do not (a family that
does something attnviz does not decompose). Soft-capped scores (Gemma 2) and additive position biases are refused:
they are not linear. Only the families with separate q_proj and k_proj modules and the Llama rotary convention
(Llama, Mistral, Qwen 2 / 3, Gemma, OLMo 2, ...) are decomposed.

Called, this module is the front door: attnviz.qk_attribution(model, text, layer=..., head=...) is
attnviz.front.qk_attribution (attnviz.doors).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnviz import interventions as iv
from attnviz.capture import capture_attention, numbered_attention
from attnviz.errors import AttnvizError
from attnviz.residual import check_sum, freeze, refused_as, residual_parts, sites

INPUT_NORM_NAMES = ("input_layernorm", "ln_1", "attention_norm", "input_norm")


class QKAttributionError(AttnvizError, ValueError):
    """QK attribution cannot be done for this model or input; the message says why."""


@dataclass
class QKAttribution:
    """One head's score of one (query, key) pair split into contributions, float64.

    terms [n_q_parts, n_k_parts]: (q part a . k part b) * scaling; q_labels / k_labels name the parts ("embeddings",
    "L3H5", "L3 attn bias", "L3 MLP", and the layer's own "q bias" / "k bias" or "input norm bias" where the model
    has them). by_frequency [head_dim / 2]: the score's share of each rotary plane (i, i + head_dim / 2), lowest
    index = highest frequency (None without RoPE). score: the model's own pre-softmax score (attnviz.capture);
    kv_head: the key/value head the head reads (GQA); frozen: the norms whose scale was frozen.
    """

    terms: np.ndarray
    q_labels: list[str]
    k_labels: list[str]
    by_frequency: np.ndarray | None
    score: float
    layer: int
    head: int
    kv_head: int
    query: int
    key: int
    scaling: float
    frozen: tuple[str, ...]

    @property
    def total(self) -> float:
        """The sum of every term (equals score to float precision)."""
        return float(self.terms.sum())

    def top(self, k: int = 10) -> list[tuple[str, str, float]]:
        """The k largest terms by absolute value: (query-side part, key-side part, value), largest first."""
        order = np.argsort(-np.abs(self.terms), axis=None, kind="stable")[:k]
        cols = self.terms.shape[1]
        return [(self.q_labels[i // cols], self.k_labels[i % cols], float(self.terms.flat[i])) for i in order]

    def q_side(self) -> np.ndarray:
        """[n_q_parts] each query-side part's share of the score (its row of terms summed over every key part)."""
        return self.terms.sum(1)

    def k_side(self) -> np.ndarray:
        """[n_k_parts] each key-side part's share of the score."""
        return self.terms.sum(0)


# -- one plain run: every site and the rotary tables ---------------------------------------------------------------

def _run(loaded, ids: list[int]) -> tuple[dict, dict]:
    """(the sites of one plain run, {layer: (cos [n, d], sin [n, d])} the rotary tables each attention layer
    received in that same run; empty for a family without them), by attnviz.interventions."""
    record, _ = sites(loaded, ids, kinds=("heads", "resid", "attn", "mlp", "rope"))
    rope = {key[1]: record.pop(key) for key in [k for k in record if k[0] == "rope"]}
    return record, rope


# -- the parts of q and k ------------------------------------------------------------------------------------------

def _input_norm(block, parts: torch.Tensor, labels: list[str]) -> tuple[torch.Tensor, list[str], list[str]]:
    """The parts through the block's input norm frozen at their sum (its bias, if any, a part of its own); a block
    without one (OLMo 2 normalises after attention, not before) passes them on as they are."""
    for name in INPUT_NORM_NAMES:
        norm = getattr(block, name, None)
        if isinstance(norm, torch.nn.Module):
            frozen = freeze(norm, parts.sum(0))
            parts = frozen(parts)
            if frozen.bias is not None:
                parts, labels = torch.cat([parts, frozen.bias[None]]), [*labels, "input norm bias"]
            return parts, labels, [name]
    return parts, labels, []


def _qk_norm(norm, y: torch.Tensor, index: int, d: int, which: str) -> tuple[torch.Tensor, list[str]]:
    """[n_parts, d]: head `index`'s columns of the projected parts y [n_parts, heads * d], through the QK-norm frozen
    at their sum: per head (Gemma 3, Qwen 3), or over every head at once before the split (OLMo 2)."""
    cols = slice(index * d, (index + 1) * d)
    if not isinstance(norm, torch.nn.Module):
        return y[:, cols], []
    if norm.weight.numel() == y.shape[1] and y.shape[1] != d:
        frozen = freeze(norm, y.sum(0))
        out = frozen(y)[:, cols]
    else:
        frozen = freeze(norm, y[:, cols].sum(0))
        out = frozen(y[:, cols])
    if frozen.bias is not None:
        raise QKAttributionError(f"{type(norm).__name__} ({which}_norm) has a bias, which attnviz does not split.")
    return out, [f"{which}_norm"]


def _rotate(y: torch.Tensor, rope: dict, layer: int, p: int) -> torch.Tensor:
    """The parts y [n_parts, d] turned by the rotary rotation at position p (Llama's convention: plane (i, i + d/2)
    by angle theta_i p); unchanged for a layer that received no rotary tables."""
    if layer not in rope:
        return y
    cos, sin = (t[p] for t in rope[layer])
    d = y.shape[-1]
    if cos.shape[-1] != d:
        raise QKAttributionError(f"The rotary tables cover {cos.shape[-1]} of the head's {d} dimensions (partial "
                                 "rotary): attnviz splits only full rotations by frequency.")
    half = d // 2
    return y * cos + torch.cat([-y[:, half:], y[:, :half]], -1) * sin


def _side(loaded, record: dict, rope: dict, layer: int, p: int, which: str, index: int,
          d: int) -> tuple[list[str], torch.Tensor, list[str]]:
    """(labels, [n_parts, d] float64, frozen norms): each part's contribution to the query (which="q", head index)
    or the key ("k", KV head index) at position p, after the projection, QK-norm and rotation."""
    labels, parts, frozen = residual_parts(loaded, record, layer, p)
    parts, labels, names = _input_norm(iv.blocks(loaded.model)[layer], parts, labels)
    attn = numbered_attention(loaded.model)[layer]
    proj = getattr(attn, f"{which}_proj", None)
    if not isinstance(proj, torch.nn.Linear):
        raise QKAttributionError(f"{loaded.spec.name} has no separate {which}_proj: attnviz decomposes the families "
                                 "with q_proj and k_proj (Llama, Mistral, Qwen, Gemma, OLMo 2, ...).")
    y = parts @ proj.weight.detach().double().cpu().T
    if proj.bias is not None:
        y, labels = torch.cat([y, proj.bias.detach().double().cpu()[None]]), [*labels, f"{which} bias"]
    y, qk_names = _qk_norm(getattr(attn, f"{which}_norm", None), y, index, d, which)
    return labels, _rotate(y, rope, layer, p), frozen + names + qk_names


# -- the attribution -----------------------------------------------------------------------------------------------

def _token_ids(loaded, text_or_ids) -> list[int]:
    ids = (loaded.tokenizer(text_or_ids).input_ids if isinstance(text_or_ids, str)
           else [int(i) for i in text_or_ids])
    iv.check_text(loaded, ids, error=QKAttributionError, what="QK attribution")  # a decoder, two tokens or more
    return ids


def _positions(loaded, n: int, layer: int, head: int, query: int, key: int) -> tuple[int, int, int, int]:
    """(layer, head, query, key) as ints, positions counted from the end when negative; QKAttributionError naming
    the first that does not exist."""
    if not 0 <= int(layer) < loaded.shape.layers:
        raise QKAttributionError(f"Layer {layer} does not exist: {loaded.spec.name} has layers 0 to "
                                 f"{loaded.shape.layers - 1}.")
    if not 0 <= int(head) < loaded.shape.heads:
        raise QKAttributionError(f"Head {head} does not exist: {loaded.spec.name} has heads 0 to "
                                 f"{loaded.shape.heads - 1}.")
    for what, p in (("Query", query), ("Key", key)):
        if not -n <= int(p) < n:
            raise QKAttributionError(f"{what} position {p} is outside the text (positions 0 to {n - 1}).")
    return int(layer), int(head), int(query) % n, int(key) % n


def _model_score(loaded, ids: list[int], layer: int, head: int, query: int, key: int):
    """(the model's own pre-softmax score, the layer's LayerInputs) from attnviz.capture; QKAttributionError where
    the score is not a linear function of q . k, or where the key is hidden from the query."""
    capture = capture_attention(loaded, "", token_ids=ids, layers=[layer], store="qk")
    inputs = capture.inputs[layer]
    if inputs.softcap or inputs.key_bias is not None:
        what = "soft-caps its scores" if inputs.softcap else "adds a position bias to its scores"
        raise QKAttributionError(f"{loaded.spec.name} {what}: the score is not a sum of q . k terms, so it is not "
                                 "split.")
    score = float(capture.head_scores(layer, head, rows=(query, query + 1))[0, key])
    if not np.isfinite(score):
        raise QKAttributionError(f"Layer {layer} hides key {key} from query {query} (causal mask or sliding window): "
                                 "there is no score to explain.")
    return score, inputs


@torch.no_grad()
@refused_as(QKAttributionError)
def qk_attribution(loaded, text_or_ids, layer: int, head: int, query: int = -1, key: int = 0) -> QKAttribution:
    """Head `head` of layer `layer`: its score of `key` at `query` (positions of the text, or of the token ids),
    split into (query-side part, key-side part) terms and by rotary plane, every norm's scale frozen at this run.
    QKAttributionError when the terms do not add up to the model's own score."""
    ids = _token_ids(loaded, text_or_ids)
    layer, head, query, key = _positions(loaded, len(ids), layer, head, query, key)
    score, inputs = _model_score(loaded, ids, layer, head, query, key)
    kv, d = int(inputs.kv_head_of[head]), inputs.head_dim
    record, rope = _run(loaded, ids)
    q_labels, q, q_frozen = _side(loaded, record, rope, layer, query, "q", head, d)
    k_labels, k, k_frozen = _side(loaded, record, rope, layer, key, "k", kv, d)
    check_sum(loaded, "the query", q.sum(0), inputs.q[head, query].double())
    check_sum(loaded, "the key", k.sum(0), inputs.k[kv, key].double())
    product = q.sum(0) * k.sum(0) * inputs.scaling
    by_frequency = (product[:d // 2] + product[d // 2:]).numpy() if layer in rope and d % 2 == 0 else None
    out = QKAttribution(terms=(q @ k.T * inputs.scaling).numpy(), q_labels=q_labels, k_labels=k_labels,
                        by_frequency=by_frequency, score=score, layer=layer, head=head, kv_head=kv, query=query,
                        key=key, scaling=float(inputs.scaling), frozen=tuple(sorted(set(q_frozen + k_frozen))))
    check_sum(loaded, "the score", torch.tensor(out.total), torch.tensor(score, dtype=torch.float64),
           size=float(np.abs(out.terms).max()))
    return out
