"""Softmax, its entropy and Jacobian, and how it saturates with and without the 1/sqrt(d_k) of attention.

Vaswani et al. 2017, §3.2.1: if the entries of q and k are independent with mean 0 and variance 1, then
q.k = sum_i q_i k_i has mean 0 and variance d_k, so for large d_k the unscaled softmax is pushed "into regions
where it has extremely small gradients"; dividing by sqrt(d_k) brings the variance back to 1.

Vocabulary: `scores` are the logits before the softmax, `pattern` the weights after it; rows are queries,
columns keys. Numpy in -> numpy out, torch in -> torch out, unless a docstring says otherwise.

Over 300 lines on purpose: the random-q.k study and its measurement on real heads share every statistic and
sweep, so they are read together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import repeat

import numpy as np
import pandas as pd
import torch

from attnviz.attention import layer_scores, masked_softmax, scaled_dot_product_attention
from attnviz.cores import one_core

SATURATION_THRESHOLD = 0.99  # a row is "saturated" when one key takes more than 99 % of its weight
SCALED, UNSCALED = "scaled", "unscaled"


def softmax(x, axis: int = -1, temperature: float = 1.0):
    """softmax(x / T)_i = exp(x_i / T - m) / sum_j exp(x_j / T - m), with m = max_j x_j / T.

    Subtracting the maximum changes nothing mathematically and keeps exp from overflowing (Goodfellow et al.,
    Deep Learning, §4.1). T > 1 flattens the distribution, T < 1 sharpens it, T -> 0 tends to the argmax.
    x: any shape, normalised along `axis`; -inf entries (masked keys) get weight 0; a slice that is all -inf
    gets all zeros rather than NaN. Integer input is computed in float64.
    """
    temperature = _check_temperature(temperature)
    if isinstance(x, torch.Tensor):
        logits = (x if x.is_floating_point() else x.to(torch.float64)) / temperature
    else:
        logits = _as_float_array(x) / temperature
    return masked_softmax(logits, axis)[0]  # the attention core's softmax


def entropy(p, axis: int = -1):
    """Shannon entropy H(p) = -sum_i p_i log p_i in nats, with 0 log 0 = 0. Shape of p without `axis`.

    0 for a one-hot row (all weight on one key), log n for the uniform row over n keys.
    """
    if isinstance(p, torch.Tensor):
        t = p if p.is_floating_point() else p.to(torch.float64)
        return -torch.xlogy(t, t).sum(dim=axis)
    a = _as_float_array(p)
    positive = a > 0
    return -np.where(positive, a * np.log(np.where(positive, a, 1.0)), 0.0).sum(axis=axis)


def softmax_jacobian(p):
    """d softmax(x)_i / d x_j = p_i (delta_ij - p_j), i.e. J = diag(p) - p p^T.

    p: [..., n] a softmax output -> [..., n, n]. J is symmetric and positive semi-definite
    (v^T J v = sum_i p_i v_i^2 - (p.v)^2 is the variance of v under p), and J 1 = 0.
    """
    as_numpy = not isinstance(p, torch.Tensor)
    t = _as_float_tensor(p)
    jac = torch.diag_embed(t) - t.unsqueeze(-1) * t.unsqueeze(-2)  # [..., n, n]
    return jac.numpy() if as_numpy else jac


def jacobian_norm(p, ord: str = "fro"):
    """Per-row norm of the softmax Jacobian diag(p) - p p^T. p: [..., n] -> [...].

    ord="fro" (the one attnviz shows): ||J||_F^2 = sum_i p_i^2 - 2 sum_i p_i^3 + (sum_i p_i^2)^2, a closed form in
    O(n) per row (expand sum_ij (p_i delta_ij - p_i p_j)^2). It is the root-mean-square size of the gradient that
    reaches the logits: for an upstream gradient g with independent unit-variance entries, E ||J g||^2 = ||J||_F^2.
    ord="spectral": the largest eigenvalue of J (J is symmetric PSD), the worst-case gain; it needs an
    eigendecomposition, O(n^3) per row. Since J has rank at most n - 1, spectral <= fro <= sqrt(n - 1) spectral:
    both vanish together as the row saturates towards one-hot. Uniform p over n keys: fro = sqrt(n - 1) / n,
    spectral = 1 / n.
    """
    if ord == "fro":
        if isinstance(p, torch.Tensor):
            s2, s3 = (p**2).sum(-1), (p**3).sum(-1)
            return torch.sqrt(torch.clamp(s2 - 2 * s3 + s2**2, min=0.0))
        a = _as_float_array(p)
        s2, s3 = (a**2).sum(-1), (a**3).sum(-1)
        return np.sqrt(np.maximum(s2 - 2 * s3 + s2**2, 0.0))
    if ord == "spectral":
        as_numpy = not isinstance(p, torch.Tensor)
        norm = torch.linalg.eigvalsh(softmax_jacobian(_as_float_tensor(p))).amax(-1).clamp(min=0.0)
        return norm.numpy() if as_numpy else norm
    raise ValueError(f"ord must be 'fro' or 'spectral', not {ord!r}")


@dataclass(frozen=True)
class RowStats:
    """Saturation statistics of an attention pattern, one value per row (query). All arrays are [rows]."""

    max_weight: np.ndarray  # the largest weight in the row
    entropy: np.ndarray  # nats, between 0 and log(keys)
    saturated: np.ndarray  # bool: max_weight > threshold
    jacobian_norm: np.ndarray  # Frobenius norm of diag(p) - p p^T
    threshold: float

    @property
    def saturated_share(self) -> float:
        """The share of rows whose largest weight exceeds the threshold."""
        return float(np.mean(self.saturated)) if self.saturated.size else float("nan")


def row_stats(pattern, threshold: float = SATURATION_THRESHOLD) -> RowStats:
    """Per-row saturation statistics of pattern [..., rows, keys] (flattened to [rows] over leading dims)."""
    p = np.asarray(pattern.detach().cpu() if isinstance(pattern, torch.Tensor) else pattern, dtype=np.float64)
    p = p.reshape(-1, p.shape[-1])
    top = p.max(axis=-1)
    return RowStats(max_weight=top, entropy=entropy(p), saturated=top > threshold,
                    jacobian_norm=jacobian_norm(p), threshold=threshold)


def random_qk(n_queries: int, n_keys: int, d_k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Queries [n_queries, d_k] and keys [n_keys, d_k] with independent N(0, 1) entries, float64, reproducible by seed.

    The setting of Vaswani et al. 2017, footnote 4: Var(q.k) = d_k.
    """
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n_queries, d_k)), rng.standard_normal((n_keys, d_k))


def attention_scale(d_k: int, scaled: bool) -> float:
    """1/sqrt(d_k) for scaled dot-product attention, 1 for the unscaled variant."""
    return 1.0 / math.sqrt(d_k) if scaled else 1.0


def scores_and_pattern(q, k, *, scaled: bool, temperature: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """scores = q k^T * scale / T [n_query, n_key] and pattern = softmax(scores), in float64 numpy (attnviz's one
    softmax, attention.masked_softmax: small torch ops pay thread-pool overheads that dominate the Softmax page's
    sweeps, and on a loaded 2-core machine each cost milliseconds).

    q: [n_query, d_k], k: [n_key, d_k]; scale = 1/sqrt(d_k) when scaled, else 1.
    """
    q, k = np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64)
    scores = (q @ np.swapaxes(k, -1, -2)) * (attention_scale(q.shape[-1], scaled) / _check_temperature(temperature))
    return scores, softmax(scores)


def query_gradient(q, k, v, upstream, *, scale: float):
    """Gradient of L = sum(upstream * attention(q, k, v)) with respect to q, by torch.autograd. Returns [n_query, d_k].

    q: [n_query, d_k], k: [n_key, d_k], v: [n_key, d_v], upstream: [n_query, d_v] (the gradient the next layer
    would send back). Rows are independent, so row i of the result is the gradient reaching query i. By the
    chain rule it equals scale * K^T J_i (V g_i) with J_i the row's softmax Jacobian: a saturated row (J_i ~ 0)
    passes almost nothing back, whatever the scale.
    """
    q_t = torch.as_tensor(np.asarray(q, dtype=np.float64)).clone().requires_grad_(True)
    k_t, v_t, g_t = (torch.as_tensor(np.asarray(x, dtype=np.float64)) for x in (k, v, upstream))
    out, _ = scaled_dot_product_attention(q_t, k_t, v_t, scale=scale)
    (grad,) = torch.autograd.grad((out * g_t).sum(), q_t)
    return grad.numpy()


def query_gradient_chain_rule(q, k, v, upstream, *, scale: float) -> np.ndarray:
    """The same gradient as query_gradient, from the chain rule instead of autograd: row i is
    scale * K^T J_i (V g_i), with J_i u = p_i * (u - p_i.u) (no n x n matrix is formed). Returns [n_query, d_k].
    """
    q, k, v, g = (np.asarray(x, dtype=np.float64) for x in (q, k, v, upstream))
    p = softmax((q @ k.T) * scale)  # [n_query, n_key]
    u = g @ v.T  # dL/dp: [n_query, n_key]
    dscores = p * (u - (p * u).sum(-1, keepdims=True))  # J_i u_i, row by row
    return scale * dscores @ k


def gradient_demo(d_k: int, n_keys: int, *, n_queries: int = 64, d_v: int = 16, seed: int = 0,
                  temperature: float = 1.0, method: str = "autograd") -> dict[str, np.ndarray]:
    """||dL/dq|| per query row, scaled and unscaled, for seeded random q, k, v and upstream gradient.

    method: "autograd" (query_gradient) or "chain rule" (query_gradient_chain_rule, cheaper, for sweeps).
    Returns {"scaled": [n_queries], "unscaled": [n_queries]}: Euclidean norms of the gradient's rows.
    """
    gradient = {"autograd": query_gradient, "chain rule": query_gradient_chain_rule}[method]
    q, k = random_qk(n_queries, n_keys, d_k, seed)
    v, g = _values_and_upstream(n_queries, n_keys, d_v, seed)
    out = {}
    with one_core():  # small products: a second torch thread only waits (attnviz.cores.one_core)
        for variant, scaled in ((SCALED, True), (UNSCALED, False)):
            scale = attention_scale(d_k, scaled) / _check_temperature(temperature)
            out[variant] = np.linalg.norm(gradient(q, k, v, g, scale=scale), axis=-1)
    return out


def saturation_sweep(d_ks, *, n_queries: int, n_keys: int, seed: int = 0, temperature: float = 1.0,
                     threshold: float = SATURATION_THRESHOLD, with_gradient: bool = True) -> pd.DataFrame:
    """Saturation statistics against d_k, scaled and unscaled: one row per (d_k, variant).

    For each d_k, q and k are random_qk(n_queries, n_keys, d_k, seed). Columns: d_k, variant, logit_var (the
    sample variance of the logits q.k * scale / T the softmax takes: d_k / T² unscaled, 1 / T² scaled, in
    expectation),
    max_weight, entropy (means over rows), saturated_share, jac_p10 / jac_p50 / jac_p90 (percentiles of the
    per-row Frobenius Jacobian norm), and, with_gradient, grad_q_p50 (median ||dL/dq|| of gradient_demo, here by
    the chain rule of query_gradient_chain_rule, which the tests check against autograd).
    """
    return saturation_sweeps(d_ks, [temperature], n_queries=n_queries, n_keys=n_keys, seed=seed,
                             threshold=threshold, with_gradient=with_gradient)[0]


def saturation_sweeps(d_ks, temperatures, *, n_queries: int, n_keys: int, seed: int = 0,
                      threshold: float = SATURATION_THRESHOLD, with_gradient: bool = True) -> list[pd.DataFrame]:
    """saturation_sweep at each of the temperatures, in their order: each d_k's q and k drawn and multiplied once
    for all of them (the draws are most of a sweep's time), every temperature's softmax in one array op."""
    temperatures = np.array([_check_temperature(t) for t in temperatures], dtype=np.float64)
    v, g = _values_and_upstream(n_queries, n_keys, 16, seed)
    dl_dp = g @ v.T  # [n_query, n_key], the same for every d_k
    records = [[] for _ in temperatures]
    for d_k in d_ks:
        d_k = int(d_k)
        q, k = random_qk(n_queries, n_keys, d_k, seed)
        raw = q @ k.T  # [n_query, n_key]: computed once, shared by both variants and every temperature
        for variant, scaled in ((SCALED, True), (UNSCALED, False)):
            logit_var = float(np.var(raw * attention_scale(d_k, scaled)))  # at T = 1
            scales = attention_scale(d_k, scaled) / temperatures
            columns = _saturation_columns(raw, k, scales, dl_dp, threshold, with_gradient)
            for i, out in enumerate(records):
                out.append(dict(d_k=d_k, variant=variant, logit_var=logit_var / temperatures[i] ** 2,
                                **{name: float(values[i]) for name, values in columns.items()}))
    return [pd.DataFrame.from_records(out) for out in records]


def _saturation_columns(raw, k, scales, dl_dp, threshold: float, with_gradient: bool) -> dict:
    """saturation_sweep's statistics past the logit variance at each scale ([n_scales] arrays): the softmax of
    raw * scale, its row statistics (row_stats), and the gradient reaching q (query_gradient_chain_rule)."""
    pattern = softmax(raw[None] * scales[:, None, None])  # [n_scales, n_query, n_key]
    top, norms = pattern.max(axis=-1), jacobian_norm(pattern)
    p10, p50, p90 = np.percentile(norms, [10, 50, 90], axis=-1)
    columns = dict(max_weight=top.mean(-1), entropy=entropy(pattern).mean(-1),
                   saturated_share=(top > threshold).mean(-1), jac_p10=p10, jac_p50=p50, jac_p90=p90)
    if with_gradient:
        dscores = pattern * (dl_dp - (pattern * dl_dp).sum(-1, keepdims=True))  # J_i (V g_i), row by row
        if k.shape[0] < k.shape[1]:  # ‖dscores_i K‖ by the keys' Gram matrix K Kᵀ: fewer FLOPs with fewer keys than d_k
            norms = np.sqrt(np.maximum(np.einsum("tqj,tqj->tq", dscores @ (k @ k.T), dscores), 0.0))
        else:
            norms = np.linalg.norm(dscores @ k, axis=-1)
        columns["grad_q_p50"] = np.median(scales[:, None] * norms, axis=-1)
    return columns


def _values_and_upstream(n_queries: int, n_keys: int, d_v: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random values v [n_keys, d_v] and upstream gradient g [n_queries, d_v] for the gradient demonstration."""
    rng = np.random.default_rng((seed, 1))
    return rng.standard_normal((n_keys, d_v)), rng.standard_normal((n_queries, d_v))


def log_spaced_dims(lo: int = 1, hi: int = 1024, per_octave: int = 2) -> list[int]:
    """Integers from lo to hi spaced evenly in log2 (per_octave per doubling), deduplicated: 1, 2, 3, 4, 6, 8, ..."""
    n = int(round(math.log2(hi / lo) * per_octave))
    return sorted({int(round(lo * 2 ** (i / per_octave))) for i in range(n + 1)} | {lo, hi})


def raw_qk(inputs, heads=None) -> np.ndarray:
    """A real layer's raw q.k: every query head against the keys of the KV head it reads, with no scaling, no
    soft-cap and no bias, in float64, -inf where the layer's mask hides the key.

    inputs: an attnviz.attention.LayerInputs (capture.inputs[layer]); heads: None for all, or a list of query
    heads. Returns [len(heads), query, key]. This is what head_variants, scale_sweep and head_saturation rescale:
    dividing the captured scores by the scaling instead would also divide an additive bias (BLOOM's ALiBi) and
    undo no soft-cap.
    """
    plain = replace(inputs, scaling=1.0, softcap=None, key_bias=None)
    return layer_scores(plain, heads=heads, key_end=inputs.n_key, dtype=torch.float64).numpy()


def head_logits(inputs, head: int) -> tuple[np.ndarray, np.ndarray | None, float | None]:
    """One query head's (raw q.k [query, key] as raw_qk gives it, its additive bias [key] or None, the layer's
    soft-cap or None): what head_variants and scale_sweep take. inputs: capture.inputs[layer]."""
    bias = None if inputs.key_bias is None else inputs.key_bias[head].double().numpy()
    return raw_qk(inputs, heads=[head])[0], bias, float(inputs.softcap) if inputs.softcap else None


def logits_at(raw, factor: float, *, bias=None, softcap: float | None = None) -> np.ndarray:
    """The logits a head would feed its softmax with `factor` on its raw q.k in place of its own scaling:
    softcap(raw * factor) + bias, as the model orders them (c tanh(x / c) for a soft-cap c), -inf where raw is.

    raw: [..., query, key] q.k, -inf where masked (raw_qk); bias: None or [..., key], one additive value per key
    (LayerInputs.key_bias: BLOOM's ALiBi slope times the key position), added unscaled whatever the factor.
    At factor = the model's scaling this is the model's own scores.
    """
    r = np.asarray(raw, dtype=np.float64)
    visible = np.isfinite(r)
    x = np.where(visible, r, 0.0) * float(factor)
    if softcap:
        x = float(softcap) * np.tanh(x / float(softcap))
    if bias is not None:
        x = x + np.asarray(bias, dtype=np.float64)[..., None, :]
    return np.where(visible, x, -np.inf)


def head_variants(raw, scaling: float, temperature: float, *, bias=None,
                  softcap: float | None = None) -> dict[str, np.ndarray]:
    """A real head's softmax three ways, from its raw q.k (raw_qk) and what the model adds to it.

    raw: [query, key] q.k, -inf where masked; bias, softcap: as in logits_at. Returns patterns [query, key] for
    "own scale" (softmax(q.k * scaling + bias): the model's own pattern), "unscaled" (softmax(q.k + bias): the
    scaling removed, the bias kept as the model adds it; for scaling = 1/sqrt(d_k), q.k is the scaled score times
    sqrt(d_k)) and "temperature" (the own-scale logits, bias included, divided by T).
    """
    own = logits_at(raw, scaling, bias=bias, softcap=softcap)
    return {
        "own scale": softmax(own),
        "unscaled": softmax(logits_at(raw, 1.0, bias=bias, softcap=softcap)),
        "temperature": softmax(own, temperature=temperature),
    }


def valid_keys(scores) -> np.ndarray:
    """Number of keys each row may attend to: finite scores above -1e30 (masks use -inf or the dtype's minimum).

    scores: [..., query, key] -> [..., query].
    """
    s = np.asarray(scores, dtype=np.float64)
    return (np.isfinite(s) & (s > -1e30)).sum(axis=-1)


def head_saturation(raw, scaling: float, temperature: float, *, bias=None, softcap: float | None = None,
                    threshold: float = SATURATION_THRESHOLD) -> dict[str, np.ndarray]:
    """The saturated share of every head under each of head_variants' three softmaxes.

    raw: [layer, head, query, key] q.k, or any iterable of per-layer [head, query, key] arrays (a generator keeps
    one layer in memory at a time); bias: None, or [layer, head, key] / an iterable of per-layer [head, key] (None
    for a layer without one). Returns {variant: [layer, head]}: the share of a head's rows whose largest weight
    exceeds threshold, over the rows with at least two valid keys.
    """
    out: dict[str, list] = {}
    biases = repeat(None) if bias is None else bias
    for layer_raw, layer_bias in zip(raw, biases):  # one layer at a time keeps the float64 copies small
        layer_raw = np.asarray(layer_raw, dtype=np.float64)
        keep = valid_keys(layer_raw) >= 2  # [head, query]
        rows = np.maximum(keep.sum(-1), 1)
        for name, pattern in head_variants(layer_raw, scaling, temperature, bias=layer_bias,
                                           softcap=softcap).items():
            out.setdefault(name, []).append(((pattern.max(-1) > threshold) & keep).sum(-1) / rows)
    return {name: np.stack(shares) for name, shares in out.items()}


def scale_sweep(raw, factors, *, bias=None, softcap: float | None = None,
                threshold: float = SATURATION_THRESHOLD) -> pd.DataFrame:
    """A real head's statistics when its raw q.k is multiplied by each factor instead of by its own scaling; the
    bias (and soft-cap) stay as the model applies them (logits_at).

    raw: [query, key] as in head_variants; bias: None or [key]. Rows with fewer than two valid keys (the first
    query of a causal model) are left out: their single weight is 1 whatever the scale. Columns: factor,
    max_weight, entropy (means), saturated_share, jac_p50.
    """
    r = np.asarray(raw, dtype=np.float64)
    keep = valid_keys(r) >= 2
    records = []
    for factor in factors:
        pattern = softmax(logits_at(r, float(factor), bias=bias, softcap=softcap))[keep]
        stats = row_stats(pattern, threshold)
        records.append(dict(factor=float(factor), max_weight=float(stats.max_weight.mean()),
                            entropy=float(stats.entropy.mean()), saturated_share=stats.saturated_share,
                            jac_p50=float(np.median(stats.jacobian_norm))))
    return pd.DataFrame.from_records(records)


def _check_temperature(temperature) -> float:
    t = float(temperature)
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"temperature must be a positive finite number, not {temperature!r}")
    return t


def _as_float_tensor(x) -> torch.Tensor:
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    return t if t.is_floating_point() else t.to(torch.float64)


def _as_float_array(x) -> np.ndarray:
    a = np.asarray(x)
    return a if np.issubdtype(a.dtype, np.floating) else a.astype(np.float64)
