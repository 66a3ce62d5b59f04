"""Per-head statistics of a captured attention pattern, one row per (layer, head), and the top heads of each role.

Notation: P = pattern[layer, head] is [query, key], row q sums to 1; n tokens; "mean over q" is the plain average
over the query rows named. Token 0 is the first token (BOS for the toy models, the first word for smollm2).

- entropy        mean over all q of H(P[q]) = -sum_k P[q,k] ln P[q,k], in nats. 0 = every query looks at one key;
                 ln(n) = uniform over n keys (a causal row q can reach at most ln(q+1)).
- sink_mass      mean over q >= 1 of P[q, 0]: the share of attention parked on the first token (query 0 is left
                 out: in a causal model it can only look at itself). Xiao et al. 2023, "attention sinks".
- mean_distance  mean over all q of sum_k P[q,k] |q - k|, in tokens: how far a head looks on average.
- prev_token     mean over q >= 1 of P[q, q-1]: a previous-token head scores near 1.
- self           mean over all q of P[q, q]: attention to the query's own token.
- induction      mean over the queries q that have an earlier copy of their own token (token_ids[j] == token_ids[q],
                 j + 1 < q) of sum over the distinct targets t = j + 1 of P[q, t]: attention to the token that came
                 after the earlier copy, the "[A][B] ... [A] -> [B]" pattern of Olsson et al. 2022, "In-context
                 learning and induction heads". NaN when no token repeats.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = ("entropy", "sink_mass", "mean_distance", "prev_token", "self", "induction")

# role -> (column, ascending?, what a high rank means)
ROLES: dict[str, tuple[str, bool, str]] = {
    "Sink": ("sink_mass", False, "most attention on the first token"),
    "Previous token": ("prev_token", False, "each token looks at the one before it"),
    "Induction": ("induction", False, "looks at what followed the earlier copy of the current token"),
    "Self": ("self", False, "each token looks at itself"),
    "Broad": ("entropy", False, "attention spread over many tokens"),
    "Long range": ("mean_distance", False, "looks furthest back (or ahead)"),
}


def head_stats(capture) -> pd.DataFrame:
    """One row per captured (layer, head): layer, head, kv_head and the columns of COLUMNS (see module docstring).

    capture: an AttentionCapture (pattern [layer, head, query, key], layers, token_ids, kv_head_of).
    """
    pattern = capture.pattern
    n = pattern.shape[-1]
    targets = induction_targets(capture.token_ids)
    rows = []
    for li, layer in enumerate(capture.layers):
        for h in range(pattern.shape[1]):
            # one head at a time in float64: [1, query, key], small even for 2,000-token texts
            stats = pattern_stats(np.asarray(pattern[li, h][None], dtype=np.float64), targets)
            rows.append({"layer": int(layer), "head": h, "kv_head": int(capture.kv_head_of[h]),
                         **{c: float(stats[c][0]) for c in COLUMNS}})
    frame = pd.DataFrame(rows, columns=["layer", "head", "kv_head", *COLUMNS])
    frame.attrs["n_tokens"] = n
    return frame


def pattern_stats(p: np.ndarray, targets: list[list[int]] | None = None) -> dict[str, np.ndarray]:
    """The statistics of heads p [head, query, key] (float64 advised), each an array [head].

    targets[q] lists the induction targets of query q (see induction_targets); None or all empty gives NaN.
    """
    n = p.shape[-1]
    q_idx = np.arange(n)
    plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    distance = np.abs(q_idx[:, None] - q_idx[None, :])  # [query, key]
    out = {
        "entropy": -plogp.sum(-1).mean(-1),
        "sink_mass": p[:, 1:, 0].mean(-1) if n > 1 else np.full(p.shape[0], np.nan),
        "mean_distance": (p * distance).sum(-1).mean(-1),
        "prev_token": p[:, q_idx[1:], q_idx[:-1]].mean(-1) if n > 1 else np.full(p.shape[0], np.nan),
        "self": p[:, q_idx, q_idx].mean(-1),
    }
    queries = [q for q in range(n) if targets and targets[q]]
    if queries:
        out["induction"] = np.mean([p[:, q, targets[q]].sum(-1) for q in queries], axis=0)
    else:
        out["induction"] = np.full(p.shape[0], np.nan)
    return out


def induction_targets(token_ids) -> list[list[int]]:
    """For each query q, the distinct positions j + 1 < q with token_ids[j] == token_ids[q], j < q."""
    seen: dict[int, list[int]] = {}
    targets = []
    for q, tok in enumerate(token_ids):
        earlier = seen.setdefault(int(tok), [])
        targets.append(sorted({j + 1 for j in earlier if j + 1 < q}))
        earlier.append(q)
    return targets


def top_heads(stats: pd.DataFrame, role: str, k: int = 5) -> pd.DataFrame:
    """The k heads ranked best for a role of ROLES (NaN scores never rank)."""
    column, ascending, _ = ROLES[role]
    ranked = stats.dropna(subset=[column]).sort_values(column, ascending=ascending, kind="stable")
    return ranked.head(k)[["layer", "head", column]].reset_index(drop=True)
