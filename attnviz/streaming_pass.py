"""StreamingLLM's single pass (attnviz.streaming.streaming_token_losses): a Llama or Gemma 3 decoder run layer by
layer, each query reading only the keys a rolling cache would hold, with the sinks' queries rotated to their cache
positions, over chunks of queries that read the same keys; then the next-token losses a block at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from attnviz.attention import kv_head_of


def may_read(t, j, window, n_sinks, layer_window=None, slot=None):
    """window_mask's rule on broadcast query positions t, key positions j and query slots (numpy or torch)."""
    if window is None:
        seen = j <= t
        distance = t - j
    else:
        seen = (j <= t) & ((j > t - window) | (j < n_sinks))
        # a window key sits as far behind the query in the cache as in the text; a sink, slot - j
        distance = t - j + (j <= t - window) * ((t if slot is None else slot) - t)
    return seen if layer_window is None else seen & (distance < layer_window)


FAMILIES = ("llama", "gemma3_text")  # transformers' model_type of the causal LMs whose layers these functions run


def decoder(model):
    """The decoder stack of a transformers LlamaForCausalLM or Gemma3ForCausalLM, whose layers these functions call
    one by one."""
    inner = getattr(model, "model", None)
    cfg = model.config
    if getattr(cfg, "model_type", None) not in FAMILIES or inner is None or not hasattr(model, "lm_head"):
        raise ValueError("the eviction experiment needs a Llama or Gemma 3 causal LM "
                         "(e.g. smollm2-135m or gemma3-270m)")
    if getattr(cfg, "attn_logit_softcapping", None) is not None:  # Gemma 2's soft-cap; Gemma 3 has none
        raise ValueError("the eviction experiment does not soft-cap attention scores")
    return inner


def layer_type(layer) -> str | None:
    """Gemma 3's "sliding_attention" or "full_attention" (which RoPE the layer uses); None for Llama."""
    return getattr(layer.self_attn, "layer_type", None)


def layer_window(layer) -> int | None:
    """How many positions back a layer reads (Gemma 3's sliding layers: 512); None for full attention."""
    return getattr(layer.self_attn, "sliding_window", None)


def rope_for(inner, h, positions, kind):
    """The model's own cos, sin at positions [1, n]: [1, n, d_head] each. Gemma 3 keeps one RoPE per layer kind
    (base 1e4 on sliding layers, 1e6 on full ones)."""
    return inner.rotary_emb(h, positions) if kind is None else inner.rotary_emb(h, positions, kind)


def qkv(attn, x):
    """One layer's q [b, head, n, d_head], k and v [b, kv_head, n, d_head] before RoPE, from its normed input x.
    Gemma 3 normalises each head's q and k first (QK-norm), as its attention does."""
    b, n, _ = x.shape
    q, k, v = (proj(x).view(b, n, -1, attn.head_dim).transpose(1, 2)
               for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    return q, k, v


def add_blocks(layer, h, attended):
    """The residual stream after a layer, given its attention's heads concatenated [b, n, head * d_head]: Llama adds
    the attention's and the MLP's outputs; Gemma 3 norms each output before adding it (its post-block norms)."""
    out = layer.self_attn.o_proj(attended)
    if hasattr(layer, "pre_feedforward_layernorm"):
        h = h + layer.post_attention_layernorm(out)
        return h + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))
    h = h + out
    return h + layer.mlp(layer.post_attention_layernorm(h))


def rotate(x, cos, sin):
    """x rotated by the model's own RoPE (transformers' apply_rotary_pos_emb, rotate-half layout).
    x: [b, head, n, d]; cos, sin: [b, n, d] from the model's rotary_emb."""
    return apply_rotary_pos_emb(x, x, cos, sin)[0]


def repeat_kv(x, n_rep: int):
    """[b, kv_head, n, d] -> [b, kv_head * n_rep, n, d]: each query head reads its group's KV head (GQA), as
    attnviz.attention.kv_head_of assigns them."""
    return x if n_rep == 1 else x[:, kv_head_of(x.shape[1] * n_rep, x.shape[1])]


@dataclass(frozen=True)
class Chunk:
    """Queries lo..hi-1 and the keys they may read: the sinks 0..n_sink_cols-1, then the span start..hi-1."""
    lo: int
    hi: int
    n_sink_cols: int
    start: int
    bias: torch.Tensor  # [hi - lo, n_sink_cols + hi - start], 0 where the query may read the key, -inf elsewhere


def plan_chunks(n: int, window: int | None, n_sinks: int, query_chunk: int, layer_window: int | None = None,
                 slots: torch.Tensor | None = None) -> list[Chunk]:
    """Chunks of queries with the keys they may read (may_read); slots [n]: the queries' positions in the cache
    (None: their text positions), which a sliding layer's reach of the sinks depends on."""
    reach = min(w for w in (window, layer_window, n) if w is not None)
    chunks = []
    for lo in range(0, n, query_chunk):
        hi = min(n, lo + query_chunk)
        sinks = min(n_sinks, hi)
        start = max(sinks, lo - reach + 1)
        keys = torch.cat([torch.arange(sinks), torch.arange(start, hi)])
        t = torch.arange(lo, hi)[:, None]
        slot = None if slots is None else slots[lo:hi, None]
        allowed = may_read(t, keys[None, :], window, n_sinks, layer_window, slot)
        chunks.append(Chunk(lo, hi, sinks, start, torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))))
    return chunks


def layer_forward(layer, h, rope, rope_cache, chunks: list[Chunk] | None):
    """One decoder layer on the whole sequence, h [1, n, d_model] -> the same. chunks=None: plain causal attention.
    Otherwise each chunk of queries reads only its sinks and window span (so a small window costs O(n * window),
    not O(n^2)); when rope_cache is given, the sink columns are scored with the queries rotated to their position
    inside the cache, passed to SDPA as an additive per-head bias on zeroed sink keys (SDPA has no way to take two
    query versions).
    """
    attn = layer.self_attn
    cfg = attn.config
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    b, n, _ = h.shape
    q_raw, k, v = qkv(attn, layer.input_layernorm(h))  # [1, head, n, d_head], [1, kv_head, n, d_head] x 2
    q = rotate(q_raw, *rope)
    k = rotate(k, *rope)
    if chunks is None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=attn.scaling, enable_gqa=True)
        return add_blocks(layer, h, out.transpose(1, 2).reshape(b, n, -1))
    k = repeat_kv(k, n_heads // n_kv)  # [1, head, n, d_head]
    v = repeat_kv(v, n_heads // n_kv)
    q_sink = None if rope_cache is None else rotate(q_raw, *rope_cache)
    out = torch.empty_like(q)
    for c in chunks:
        s = c.n_sink_cols
        k_c = torch.cat([k[:, :, :s], k[:, :, c.start:c.hi]], dim=2)  # [1, head, m, d_head]
        v_c = torch.cat([v[:, :, :s], v[:, :, c.start:c.hi]], dim=2)
        bias = c.bias
        if q_sink is not None and s > 0:
            # [1, head, chunk, s]: the sink columns, scored with the query at its slot in the cache
            scores_on_sinks = q_sink[:, :, c.lo:c.hi] @ k_c[:, :, :s].transpose(-1, -2) * attn.scaling
            bias = bias.expand(1, n_heads, *bias.shape).clone()  # [1, head, chunk, m]
            bias[..., :s] += scores_on_sinks
            k_c[:, :, :s] = 0.0
        out[:, :, c.lo:c.hi] = F.scaled_dot_product_attention(q[:, :, c.lo:c.hi], k_c, v_c, attn_mask=bias,
                                                              scale=attn.scaling)
    return add_blocks(layer, h, out.transpose(1, 2).reshape(b, n, -1))


def next_token_losses(model, final_hidden, ids, chunk: int = 512) -> np.ndarray:
    """Cross-entropy of token i + 1 given the final hidden state at i. final_hidden: [n, d_model]. Returns [n - 1]."""
    out = []
    for lo in range(0, ids.shape[0] - 1, chunk):
        hi = min(ids.shape[0] - 1, lo + chunk)
        logits = model.lm_head(final_hidden[lo:hi]).float()  # [chunk, vocab]
        if cap := getattr(model.config, "final_logit_softcapping", None):  # Gemma's, None in Gemma 3
            logits = torch.tanh(logits / cap) * cap
        out.append(F.cross_entropy(logits, ids[lo + 1:hi + 1], reduction="none"))
    return torch.cat(out).double().numpy()
