"""Norm-based attention (Kobayashi et al. 2020, "Attention is Not Only a Weight: Analyzing Transformers with Vector
Norms", §3): what key j actually adds to query i's output in head h is the vector alpha_ij f_h(x_j), where
f_h(x_j) = v_j W_O^h is token j's value vector through the head's slice of the output projection. Its length
||alpha_ij f_h(x_j)|| = alpha_ij ||f_h(x_j)|| is the contribution; the weight alpha_ij alone ignores ||f_h(x_j)||.

Why it matters: a sink token (often the first) takes most of a head's weight while its value vectors are small, so
it adds almost nothing; raw weights then hide where the output comes from, and the norms show it.

v_j is the value vector the attention function received (one per KV head: GQA heads share it); W_O^h is the
columns h * d_v ... (h + 1) * d_v - 1 of the output projection's weight (attnviz.knockout.output_projection). The
projection's bias is left out, as in the paper: it is added once per query, not per key.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnviz.capture import CaptureError, capture_attention
from attnviz.errors import AttnvizError
from attnviz.projection import KnockoutError, output_projection, projection_weight


class NormError(AttnvizError, ValueError):
    """Norm-based attention cannot be computed for this model; the message says why."""


@dataclass
class NormAttention:
    """One layer's heads on one text.

    pattern:     [head, query, key] the attention weights alpha
    value_norms: [head, key] ||f_h(x_j)|| = ||v_j W_O^h||, the length of what key j would add at weight 1
    norms:       [head, query, key] alpha_ij ||f_h(x_j)||
    """

    layer: int
    tokens: list[str]
    pattern: np.ndarray
    value_norms: np.ndarray
    norms: np.ndarray

    def shares(self) -> np.ndarray:
        """[head, query, key] the norms of each row divided by their sum: the share of the output's (summed)
        vector lengths each key brings, comparable to the weights (each row sums to 1)."""
        total = self.norms.sum(-1, keepdims=True)
        return np.divide(self.norms, total, out=np.zeros_like(self.norms), where=total > 0)

    def sink_summary(self, head: int, key: int = 0) -> dict[str, float]:
        """For one head and one key (the first token by default), over the queries after it: the mean weight it
        gets, its mean share of the norms, and its value norm relative to the mean value norm of the others."""
        rows = slice(key + 1, None)
        others = np.delete(self.value_norms[head], key)
        return {"weight": float(self.pattern[head, rows, key].mean()),
                "norm_share": float(self.shares()[head, rows, key].mean()),
                "value_norm_ratio": float(self.value_norms[head, key] / others.mean()) if others.size else np.nan}


def norm_attention(loaded, text: str, layer: int) -> NormAttention:
    """NormAttention of every head of `layer` for `text` (one capture of that layer with its value vectors)."""
    if not 0 <= int(layer) < loaded.shape.layers:
        raise NormError(f"Layer {layer} does not exist: {loaded.spec.name} has layers 0 to {loaded.shape.layers - 1}.")
    try:
        capture = capture_attention(loaded, text, layers=[int(layer)], with_values=True)
        weight = projection_weight(output_projection(loaded.model, int(layer))).detach().float().cpu()
    except (CaptureError, KnockoutError) as exc:
        raise NormError(str(exc)) from exc
    values = capture.values[int(layer)]  # [kv_head, key, d_v]
    d_v = values.shape[-1]
    n_heads = capture.n_heads
    if weight.shape[1] != n_heads * d_v:
        raise NormError(f"The output projection takes {weight.shape[1]} inputs, not {n_heads} heads x {d_v}: "
                        "attnviz cannot tell each head's columns apart in this model.")
    value_norms = torch.stack([
        torch.linalg.vector_norm(values[kv].double() @ weight[:, h * d_v:(h + 1) * d_v].double().T, dim=-1)
        for h, kv in enumerate(capture.kv_head_of)]).numpy()  # [head, key]
    pattern = capture.pattern[0].astype(np.float64)
    return NormAttention(layer=int(layer), tokens=capture.tokens, pattern=pattern, value_norms=value_norms,
                         norms=pattern * value_norms[:, None, :])
