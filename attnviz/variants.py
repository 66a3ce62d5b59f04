"""Toy multi-head, grouped-query and multi-query attention layers that see the same input.

MHA (Vaswani et al. 2017): every query head has its own key and value head.
GQA (Ainslie et al. 2023): query heads in consecutive groups share one key/value head.
MQA (Shazeer 2019): all query heads share a single key/value head.
To compare the three on equal terms, GQA and MQA are made from the MHA layer the way Ainslie et al. (§2.1)
convert a multi-head checkpoint: the key and value projection of each group is the mean of its heads'
projections. Query and output projections are left as they are.
"""

from __future__ import annotations

import math

import numpy as np

from attnviz.attention import causal_mask, kv_head_of, scaled_dot_product_attention


def toy_weights(d_model: int, n_heads: int, *, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random MHA projections w_q, w_k, w_v, w_o, each float64 [d_model, d_model], std 1/sqrt(d_model)
    so that projected features of a unit-variance input have unit variance."""
    if d_model % n_heads:
        raise ValueError(f"d_model {d_model} is not divisible by {n_heads} heads")
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal((d_model, d_model)) / math.sqrt(d_model) for name in ("w_q", "w_k", "w_v", "w_o")}


def toy_input(n_tokens: int, d_model: int, *, seed: int = 0) -> np.ndarray:
    """Seeded unit-variance token vectors x [n_tokens, d_model]."""
    return np.random.default_rng(seed + 1).standard_normal((n_tokens, d_model))


def pool_kv_heads(w: np.ndarray, n_heads: int, n_kv_heads: int) -> np.ndarray:
    """Mean-pools the per-head column blocks of a K or V projection w [d_model, n_heads * d_head] within each group
    of query heads (Ainslie et al. 2023, §2.1). Returns [d_model, n_kv_heads * d_head]."""
    d_in, d_out = w.shape
    d_head = d_out // n_heads
    kv_head_of(n_heads, n_kv_heads)  # ValueError unless the KV heads split the query heads evenly
    groups = w.reshape(d_in, n_kv_heads, n_heads // n_kv_heads, d_head)  # [d, kv_head, head in group, d_head]
    return groups.mean(axis=2).reshape(d_in, n_kv_heads * d_head)


def grouped_query_attention(x, w_q, w_k, w_v, w_o, *, n_heads: int, n_kv_heads: int, causal: bool = False):
    """One attention layer with n_kv_heads key/value heads shared by n_heads query heads.

    x [n, d_model]; w_q [d_model, n_heads d_head]; w_k, w_v [d_model, n_kv_heads d_head]; w_o [n_heads d_head,
    d_model]. Returns (output [n, d_model], pattern [n_heads, n, n]).
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    d_head = w_q.shape[1] // n_heads
    q = (x @ w_q).reshape(n, n_heads, d_head).transpose(1, 0, 2)  # [head, n, d_head]
    k = (x @ w_k).reshape(n, n_kv_heads, d_head).transpose(1, 0, 2)  # [kv_head, n, d_head]
    v = (x @ w_v).reshape(n, n_kv_heads, d_head).transpose(1, 0, 2)  # [kv_head, n, d_head]
    shared = kv_head_of(n_heads, n_kv_heads)
    mask = causal_mask(n) if causal else None
    heads, pattern = scaled_dot_product_attention(q, k[shared], v[shared], mask=mask)  # [head, n, d_head], [head, n, n]
    return heads.transpose(1, 0, 2).reshape(n, n_heads * d_head) @ w_o, pattern


def compare_variants(x, weights: dict[str, np.ndarray], *, n_heads: int, kv_heads: dict[str, int],
                     causal: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Runs x through the MHA layer `weights` and its mean-pooled versions with the given KV head counts,
    e.g. {"MHA": 8, "GQA": 2, "MQA": 1}. Returns name -> (output [n, d_model], pattern [n_heads, n, n])."""
    results = {}
    for name, n_kv in kv_heads.items():
        w_k = pool_kv_heads(weights["w_k"], n_heads, n_kv)
        w_v = pool_kv_heads(weights["w_v"], n_heads, n_kv)
        results[name] = grouped_query_attention(x, weights["w_q"], w_k, w_v, weights["w_o"], n_heads=n_heads,
                                                n_kv_heads=n_kv, causal=causal)
    return results


def variant_kv_heads(n_heads: int, n_kv: int) -> dict[str, int]:
    """MHA, the chosen GQA (when it is neither MHA nor MQA) and MQA, with their KV head counts."""
    kv = {"MHA": n_heads}
    if 1 < n_kv < n_heads:
        kv[f"GQA ({n_kv} KV)"] = n_kv
    kv["MQA"] = 1
    return kv


def differences_from(results: dict[str, tuple[np.ndarray, np.ndarray]], reference: str = "MHA"
                     ) -> dict[str, tuple[float, float]]:
    """How far each variant of compare_variants moved from `reference`: name -> (mean total-variation distance
    between a head's attention row and the reference's, 1/2 sum_j |p_j - p'_j| averaged over heads and rows (0 the
    same, 1 disjoint); the output's relative Frobenius distance ||O - O'|| / ||O'||)."""
    out_ref, pattern_ref = results[reference]
    return {name: (float(0.5 * np.abs(pattern - pattern_ref).sum(-1).mean()),
                   float(np.linalg.norm(out - out_ref) / np.linalg.norm(out_ref)))
            for name, (out, pattern) in results.items()}
