"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", §3).

Each layer's attention is averaged over its heads and mixed with the residual connection as an identity,
A'_l = 0.5 A_l + 0.5 I, its rows renormalised to 1; rollout is the product of those matrices from the first layer up:
R_l = A'_l R_(l-1), R_0 = A'_0. R_l[q, k] reads as the share of token k's information in position q after layer l.

What it assumes: information mixes linearly, every head counts equally, and the residual stream carries exactly
half. It misleads where heads differ in how much their output matters (a sink head's large weights move almost
nothing, see attnviz.norms), and where the MLPs or layer norms reweight tokens: rollout sees neither.

Called, this module is the front door: attnviz.rollout(model, text) is attnviz.front.rollout (attnviz.doors).
"""

from __future__ import annotations

import numpy as np



def layer_matrix(pattern: np.ndarray, residual: float = 0.5) -> np.ndarray:
    """[n, n] float64: the heads of one layer [head, query, key] averaged, mixed with the identity (weight
    `residual`), rows renormalised to sum to 1 (rows of a learned-sink model sum to less than 1 before)."""
    a = np.asarray(pattern, dtype=np.float64).mean(axis=0)
    a = (1.0 - residual) * a + residual * np.eye(a.shape[-1])
    return a / a.sum(axis=-1, keepdims=True)


def rollout(layers, residual: float = 0.5) -> np.ndarray:
    """[layer, n, n] float64: rollout after each layer, R_l = A'_l @ R_(l-1). `layers` is a sequence (or array)
    of per-layer patterns [head, query, key], first layer first."""
    out, joint = [], None
    for pattern in layers:
        a = layer_matrix(pattern, residual)
        joint = a if joint is None else a @ joint
        out.append(joint)
    if not out:
        raise ValueError("Rollout needs at least one layer.")
    return np.stack(out)


def capture_rollout(capture, residual: float = 0.5) -> np.ndarray:
    """Rollout over every captured layer of an attnviz AttentionCapture (both stores: each layer's weights are read
    through capture.layer_rows). The capture must hold every layer from 0, or rollout would skip some."""
    if list(capture.layers) != list(range(len(capture.layers))):
        raise ValueError(f"Rollout needs every layer from 0 up; the capture holds layers {capture.layers}.")
    return rollout((capture.layer_rows(layer) for layer in capture.layers), residual)
