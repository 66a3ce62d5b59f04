"""Attention sinks: how much attention the first tokens soak up, and what happens when they are evicted.

Gu et al., ICLR 2025, "When Attention Sink Emerges in Language Models": the sink score of key k is the mean,
over the queries that can see it, of the attention they give it; a head is a sink head when the score of
token 0 exceeds 0.3. Xiao et al., ICLR 2024, "Efficient Streaming Language Models with Attention Sinks"
(StreamingLLM): a sliding-window KV cache fails once the first tokens are evicted, and keeping them fixes it.
"""

from __future__ import annotations

import numpy as np
import torch


def without_sinks(pattern, sink_keys=(0,)):
    """The pattern with the given key columns zeroed and every row renormalised to sum to 1.

    pattern: [..., query, key] (numpy or torch; the same kind comes back). sink_keys: key positions to hide
    (negative indices count from the end). A row whose remaining mass is 0 (a query that saw only the hidden
    keys) stays all zero rather than NaN. Shows the rest of a map whose colour scale the sink would swamp.
    """
    as_numpy = not isinstance(pattern, torch.Tensor)
    p = torch.as_tensor(np.asarray(pattern)) if as_numpy else pattern
    if not p.is_floating_point():
        p = p.to(torch.float64)
    n_key = p.shape[-1]
    keep = torch.ones(n_key, dtype=torch.bool)
    for k in sink_keys:
        k = int(k)
        if -n_key <= k < n_key:
            keep[k] = False
    kept = p * keep.to(p.dtype)
    total = kept.sum(dim=-1, keepdim=True)
    safe = torch.where(total > 0, total, torch.ones_like(total))
    out = torch.where(total > 0, kept / safe, torch.zeros_like(kept))
    return out.numpy() if as_numpy else out
