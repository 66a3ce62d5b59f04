"""The rule of a mask transformers hands a layer: None, a bool or an additive float mask read into an
attnviz.attention.MaskRule (mask_rule), and, before any mask is built, the rule its mask function would give
(named_rule: causal, sliding window or chunked, probed row by row), carried to the layers as a RuleMask so that a
qk-store capture never builds an N x N mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnviz import attention as core
from attnviz.attention import MaskRule
from attnviz.capture.modules import CaptureError


@dataclass(frozen=True)
class RuleMask:
    """The attention mask handed to the layers in a qk-store capture when named_rule names it: the MaskRule itself,
    which the registered attention function reads (attnviz's core then skips the key tiles it hides)."""

    rule: MaskRule

    def eager(self, dtype, device) -> torch.Tensor:
        """The additive [1, 1, query, key] float mask a family's eager function takes (for a layer no capture
        records)."""
        visible = torch.from_numpy(self.rule.rows(0, self.rule.n_query)).to(device)
        return torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(
            ~visible, torch.finfo(dtype).min)[None, None]


PROBE_ROWS = 256  # named_rule checks every row up to here, and 64 rows spread over the rest


def named_rule(*, batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
               mask_function=None, attention_mask=None, **_) -> MaskRule | None:
    """The MaskRule (causal, sliding window, chunked) of the mask transformers would build from these arguments,
    or None when no rule reproduces it: the mask function is evaluated on the first PROBE_ROWS query rows and on 64
    rows spread over the rest, every key, and the rule is kept only where it equals them all. One text, no padding
    and no cache only (batch 1, queries and keys from position 0)."""
    if batch_size != 1 or q_offset or kv_offset or q_length != kv_length or mask_function is None:
        return None
    if attention_mask is not None and not bool(attention_mask.all()):
        return None
    rows = torch.unique(torch.cat([torch.arange(min(q_length, PROBE_ROWS)),
                                   torch.linspace(0, q_length - 1, 64).long()]))
    keys = torch.arange(kv_length)
    zero = torch.zeros((), dtype=torch.long)
    try:
        probed = mask_function(zero, zero, rows[:, None], keys[None, :]).expand(len(rows), kv_length).numpy()
    except Exception:  # a mask function that does not broadcast: let transformers build the mask
        return None
    for rule in core.named_rules_from_rows(probed, rows.numpy(), q_length, kv_length):
        if all(np.array_equal(rule.rows(int(r), int(r) + 1)[0], probed[i]) for i, r in enumerate(rows)):
            return rule
    return None


def mask_rule(attention_mask, n_query: int, n_key: int, causal_if_none: bool) -> MaskRule:
    """The MaskRule of what the model passed: None (causal or full, as SDPA reads it), a bool mask (True =
    attend) or an additive float mask (the dtype's minimum where masked). Only batch row 0 is read."""
    if attention_mask is None:
        return MaskRule(n_query, n_key, causal=causal_if_none)
    if isinstance(attention_mask, RuleMask):
        rule = attention_mask.rule
        if (rule.n_query, rule.n_key) != (n_query, n_key):
            raise CaptureError(f"The mask rule is for {rule.n_query} x {rule.n_key}, the layer saw {n_query} x "
                               f"{n_key}.")
        return rule
    mask = attention_mask[0, 0] if attention_mask.dim() == 4 else attention_mask[0]
    mask = mask[-n_query:, :n_key] if mask.dim() == 2 else mask
    if mask.dtype == torch.bool:
        visible = mask
    else:
        visible = mask > torch.finfo(mask.dtype).min / 2
        if bool((mask[visible] != 0).any()):
            raise CaptureError("The model's attention mask carries a bias, which attnviz does not read yet.")
    return MaskRule.from_bool(visible.cpu().numpy())
