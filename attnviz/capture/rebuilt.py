"""Families whose attention does not dispatch through transformers' attention interface (BLOOM, Falcon, GPT-J):
each layer's q and k (after RoPE) and ALiBi bias rebuilt, in a forward pre-hook, from the module's own projections
and the family's own functions (REBUILT: attention module class name -> its rebuilding function).
"""

from __future__ import annotations

import math
import sys

import torch

from attnviz import attention as core
from attnviz.attention import LayerInputs, MaskRule
from attnviz.capture.masks import mask_rule
from attnviz.capture.modules import CaptureError


def _bloom_inputs(module, args, kwargs) -> LayerInputs:
    """BloomAttention's q, k and ALiBi bias from its own projection (BLOOM does not use the attention interface):
    scores = beta * alibi + inv_norm_factor * q.k, alibi[head, key] = slope_h * key position."""
    q, k, _ = module._reshape(module.query_key_value(_hidden(args, kwargs)))  # each [batch, head, n, head_dim]
    n_query, n_key = q.shape[-2], k.shape[-2]
    alibi = kwargs["alibi"].reshape(q.shape[0], module.num_heads, -1)[0, :, -n_key:]  # [head, key]
    n_heads = module.num_heads
    return LayerInputs(q=_kept(q[0]), k=_kept(k[0]), kv_head_of=tuple(range(n_heads)),
                       scaling=float(module.inv_norm_factor),
                       mask=mask_rule(kwargs.get("attention_mask"), n_query, n_key, True),
                       key_bias=_kept(alibi) * float(module.beta))


def _falcon_inputs(module, args, kwargs) -> LayerInputs | None:
    """FalconAttention's q and k (Falcon does not use the attention interface), made by its own fused projection,
    head split and rotary function, as its forward makes them. One path serves every layout FalconAttention has:
    new_decoder_architecture (Falcon-40B/180B: num_kv_heads KV heads, repeated per query head before attention;
    the copies are dropped here), multi_query (Falcon-7B: one KV head) or one KV head per head (Falcon-RW), and
    parallel_attn or not (which only changes what the layer does with the output). RoPE layers: scores = q.k /
    sqrt(d). ALiBi layers (Falcon-RW): scores = (q.k + alibi) * inv_norm_factor + mask, where the model's mask
    carries alibi / sqrt(d) a second time; both parts go into key_bias."""
    if kwargs.get("layer_past") is not None:
        return None  # earlier keys sit in a KV cache (generation): only whole-text passes are rebuilt
    q, k, _ = module._split_heads(module.query_key_value(_hidden(args, kwargs)))  # each [batch, n, head, d]
    q, k = q.transpose(1, 2), k.transpose(1, 2)  # [batch, head, n, d]
    k = k[:, ::k.shape[1] // module.num_kv_heads]  # one copy of each KV head (the new architecture repeats them)
    n_query, n_key = q.shape[-2], k.shape[-2]
    alibi, mask = kwargs.get("alibi"), kwargs.get("attention_mask")
    if alibi is None:
        cos, sin = kwargs["position_embeddings"]
        q, k = sys.modules[type(module).__module__].apply_rotary_pos_emb(q, k, cos, sin)
        rule, key_bias, scaling = mask_rule(mask, n_query, n_key, True), None, 1 / math.sqrt(module.head_dim)
    else:
        rule, mask_bias = _mask_and_key_bias(mask, n_query, n_key) if mask is not None else (
            mask_rule(None, n_query, n_key, True), 0.0)
        scaling = float(module.inv_norm_factor)
        alibi = alibi.reshape(q.shape[0], module.num_heads, -1)[0, :, -n_key:]  # [head, key]
        key_bias = _kept(alibi) * scaling + mask_bias
    return LayerInputs(q=_kept(q[0]), k=_kept(k[0]),
                       kv_head_of=tuple(core.kv_head_of(module.num_heads, k.shape[1])), scaling=scaling,
                       mask=rule, key_bias=key_bias)


def _gptj_inputs(module, args, kwargs) -> LayerInputs | None:
    """GPTJAttention's q and k (GPT-J does not use the attention interface), rotated as its forward rotates them:
    the first rotary_dim dimensions of each head (all of them when rotary_dim is None) by GPT-J's interleaved
    RoPE (pairs 2i, 2i + 1), with its own sin/cos table and rotary function; scores = q.k / sqrt(d)."""
    if kwargs.get("layer_past") is not None:
        return None  # earlier keys sit in a KV cache (generation): only whole-text passes are rebuilt
    hidden = _hidden(args, kwargs)
    rotate = sys.modules[type(module).__module__].apply_rotary_pos_emb
    heads, d = module.num_attention_heads, module.head_dim
    position_ids = kwargs["position_ids"]
    table = module._get_embed_positions(position_ids)
    sincos = torch.gather(table, 1, position_ids.unsqueeze(-1).repeat(1, 1, table.shape[-1])).to(hidden.dtype)
    sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)
    width = module.rotary_dim or d
    q, k = (module._split_heads(proj(hidden), heads, d, True) for proj in (module.q_proj, module.k_proj))
    q, k = (torch.cat([rotate(x[..., :width], sin, cos), x[..., width:]], dim=-1).transpose(1, 2)
            for x in (q, k))  # [batch, head, n, d]
    n_query, n_key = q.shape[-2], k.shape[-2]
    return LayerInputs(q=_kept(q[0]), k=_kept(k[0]), kv_head_of=tuple(range(heads)),
                       scaling=1 / float(module.scale_attn),
                       mask=mask_rule(kwargs.get("attention_mask"), n_query, n_key, True))


def _mask_and_key_bias(attention_mask, n_query: int, n_key: int) -> tuple[MaskRule, torch.Tensor]:
    """The MaskRule of an additive float mask that also carries a bias (Falcon-RW adds ALiBi / sqrt(d) to it), and
    that bias as [head, key] float32 on the CPU. Refused unless each head's bias is one value per key, the same for
    every query that sees the key (as ALiBi's is), and every head masks the same places."""
    mask = attention_mask[0, :, -n_query:, :n_key]  # [head or 1, query, key]
    visible = mask > torch.finfo(mask.dtype).min / 2
    if not bool((visible == visible[:1]).all()):
        raise CaptureError("The model's attention mask hides different keys in different heads, which attnviz "
                           "does not read yet.")
    visible = visible[0]
    # each key's bias read in the last query row that sees it (a causal mask's last row sees every key)
    last = (visible * torch.arange(1, n_query + 1, device=mask.device)[:, None]).argmax(0)  # [key]
    bias = torch.where(visible.any(0), mask[:, last, torch.arange(n_key, device=mask.device)], 0)  # [head, key]
    for head in range(mask.shape[0]):  # a head at a time: one N x N temporary
        if bool(((mask[head] - bias[head]) != 0)[visible].any()):
            raise CaptureError("The model's attention mask carries a bias that changes from query to query, which "
                               "attnviz does not read yet.")
    return MaskRule.from_bool(visible.cpu().numpy()), _kept(bias)


def _hidden(args, kwargs) -> torch.Tensor:
    """The hidden states an attention module was called with, by keyword or first in place."""
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


def _kept(x: torch.Tensor) -> torch.Tensor:
    """A float32 CPU copy of x, detached: what a recorder keeps past the forward pass."""
    return x.detach().float().cpu().clone()


REBUILT = {"BloomAttention": _bloom_inputs, "FalconAttention": _falcon_inputs, "GPTJAttention": _gptj_inputs}
