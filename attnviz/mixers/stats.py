"""Statistics of an implicit map that still mean something when its weights are signed and rows do not sum to 1.

Each is read on the shares a = |w| / (row sum of |w|): for query t, the fraction of its absolute weight that key s
carries, a causal row summing to 1 as a softmax row does. On those shares the softmax heads' own definitions apply
unchanged: attnviz.stats.previous_token_score, attnviz.stats.induction_score (targets from the text's repeats,
attnviz.stats.induction_targets) and attnviz.distance.attention_by_distance. Decay with distance is summed up by
the half-mass distance: the smallest r at which the mean row holds half its share within r tokens back."""

from __future__ import annotations

import numpy as np

from attnviz import stats
from attnviz.distance import attention_by_distance


def shares(w) -> np.ndarray:
    """|w| / row sum of |w|, float64, [head, query, key]; a row whose weights are all 0 stays 0."""
    a = np.abs(np.asarray(w, dtype=np.float64))
    total = a.sum(-1, keepdims=True)
    return np.divide(a, total, out=np.zeros_like(a), where=total > 0)


def half_mass_distance(profile: np.ndarray) -> np.ndarray:
    """profile [..., distance]: mean share at each distance r (attention_by_distance); the smallest r whose
    cumulative share reaches half the total, [...] ints."""
    cumulative = np.cumsum(profile, axis=-1)
    return np.argmax(cumulative >= 0.5 * cumulative[..., -1:], axis=-1)


def map_stats(w, token_ids) -> dict[str, np.ndarray]:
    """Per head of an implicit map w [head, query, key] over a text's token ids: prev_token and induction on the
    shares, the distance profile [head, distance] and the half-mass distance [head]."""
    a = shares(w)
    profile = attention_by_distance(a, per_head=True)
    return {"prev_token": stats.previous_token_score(a),
            "induction": stats.induction_score(a, stats.induction_targets(list(token_ids))),
            "distance_profile": profile, "half_mass_distance": half_mass_distance(profile)}
