"""StreamingLLM's eviction experiment (Xiao et al., ICLR 2024, "Efficient Streaming Language Models with Attention
Sinks"): a sliding-window KV cache fails once the first tokens are evicted, and keeping them fixes it.

How the eviction experiment runs. StreamingLLM decodes one token at a time against a cache holding the first
`n_sinks` tokens and the `window` most recent ones, and gives every cached key its position *inside the cache*,
not in the text. Decoding that way costs one forward call per token (`rolling_cache_token_losses`, kept as the
reference): each call pays for all the weights to process one token, tens of milliseconds on a quiet 2-core CPU
and seconds on a busy one, so minutes to hours for a few thousand tokens and three settings
(benchmarks/sinks.py measures it). `streaming_token_losses` gets the same numbers from one forward pass:

- Token t's keys and values, at every layer, were computed when t was the newest token, so they depend only on
  what t could see then. A mask that lets query t see keys {j < n_sinks} and {t - window < j <= t} reproduces
  exactly that, for every token at once.
- RoPE scores depend only on the distance between query and key. The window keys sit contiguously in the cache
  behind the query, so their distances in the cache equal their distances in the text. Only the sink keys move:
  in the cache, query t sits at p_t = min(t, n_sinks + window - 1) and sink j at j, so the sink columns are scored
  with the query rotated to p_t instead of t. One extra query rotation per layer; nothing else changes.

So the single pass equals the rolling cache up to float rounding (the tests check this token by token), and
`positions="original"` gives the cheaper variant that keeps text positions for the sinks too. It is written for
Llama (SmolLM2) and Gemma 3, whose layers it calls one by one, with the family's own RoPE (transformers'
apply_rotary_pos_emb; Gemma 3 has one per layer kind) and norms (Gemma 3's QK-norm and the norms around each block).

Gemma 3's sliding-window layers read only the keys less than `sliding_window` (512) positions behind the query.
A model that reads a cache takes the cache for its whole text, so such a layer keeps its rule inside the cache:
it reads the cached keys less than 512 slots behind the query. A window key's slot distance is its text
distance; a sink's is p_t - j. With full attention the rule is the model's own (text distance under 512).
The sink metrics live in attnviz.sinks.

The single pass's layer-by-layer machinery (each family's decoder layers, RoPE, norms, and the chunks of queries
that read the same keys) lives in attnviz.streaming_pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from attnviz import streaming_pass as sp

DEFAULT_SINKS = 4  # Xiao et al. 2024 keep four initial tokens
DEFAULT_WINDOW = 256
STREAMING_TEXT = Path(__file__).resolve().parent.parent / "data" / "declaration_and_lincoln.txt"

def window_mask(n: int, window: int | None, n_sinks: int = 0, *, layer_window: int | None = None,
                positions: str = "cache") -> np.ndarray:
    """[query, key] bool, True where query t may read key j: j <= t and (j > t - window or j < n_sinks), and on a
    sliding-window layer (layer_window L) a distance inside the cache under L (see the module docstring).

    window counts the most recent tokens kept, the current one included; None keeps everything (full attention).
    positions: where the sinks sit, as in streaming_token_losses.
    """
    t = np.arange(n)[:, None]
    slot = cache_positions(n, window, n_sinks)[:, None] if positions == "cache" else t
    return sp.may_read(t, np.arange(n)[None, :], window, n_sinks, layer_window, slot)


def cache_positions(n: int, window: int | None, n_sinks: int = 0) -> np.ndarray:
    """[n] the position each token's query has inside a StreamingLLM cache: min(t, n_sinks + window - 1).

    Until the cache is full a token sits where it sits in the text; after that it is always the last slot.
    """
    t = np.arange(n)
    return t if window is None else np.minimum(t, n_sinks + window - 1)


@torch.no_grad()
def streaming_token_losses(model, input_ids, *, window: int | None = None, n_sinks: int = 0,
                           positions: str = "cache", query_chunk: int = 256,
                           progress: Callable[[float], None] | None = None) -> np.ndarray:
    """Per-token cross-entropy (nats) of a Llama or Gemma 3 causal LM that reads only the first n_sinks tokens and
    the last `window` tokens, in one forward pass. Returns [n - 1]: entry i is the loss of token i + 1.

    window=None is full attention (loss equal to the model's own labels= loss). positions="cache" scores sink keys
    as StreamingLLM does (query at its position inside the cache, see the module docstring); "original" keeps the
    text positions. input_ids: [n] or [1, n]. query_chunk bounds the memory of the score matrix.
    progress(fraction) is called after every layer.
    """
    if positions not in ("cache", "original"):
        raise ValueError(f"positions must be 'cache' or 'original', not {positions!r}")
    ids = torch.as_tensor(input_ids).reshape(1, -1)
    n = ids.shape[1]
    n_sinks = 0 if window is None else int(n_sinks)
    inner = sp.decoder(model)
    h = inner.embed_tokens(ids)  # [1, n, d_model] (Gemma 3's embedding scales by sqrt(d_model) itself)
    slots = torch.as_tensor(cache_positions(n, window, n_sinks)) if positions == "cache" and n_sinks > 0 else None
    ropes, plans = {}, {}  # per layer kind: Gemma 3's sliding and full layers differ in RoPE base and reach
    for i, layer in enumerate(inner.layers):
        kind, reach = sp.layer_type(layer), sp.layer_window(layer)
        if kind not in ropes:
            ropes[kind] = (sp.rope_for(inner, h, torch.arange(n)[None], kind),
                           None if slots is None else sp.rope_for(inner, h, slots[None], kind))
        if reach not in plans:
            plans[reach] = (None if window is None and reach is None
                            else sp.plan_chunks(n, window, n_sinks, query_chunk, reach, slots))
        h = sp.layer_forward(layer, h, *ropes[kind], plans[reach])
        if progress is not None:
            progress((i + 1) / len(inner.layers))
    return sp.next_token_losses(model, inner.norm(h)[0], ids[0])


@torch.no_grad()
def rolling_cache_token_losses(model, input_ids, *, window: int, n_sinks: int = 0,
                               progress: Callable[[float], None] | None = None) -> np.ndarray:
    """The StreamingLLM reference: decode one token at a time against a cache of the first n_sinks tokens and the
    last `window` tokens, keys stored before RoPE and rotated to their positions inside the cache at every step
    (Xiao et al. 2024, "rolling KV cache with attention sinks"). Slow (one forward call per token);
    streaming_token_losses gives the same numbers in one pass. Returns [n - 1] per-token cross-entropy in nats.
    """
    ids = torch.as_tensor(input_ids).reshape(-1)
    n = ids.shape[0]
    inner = sp.decoder(model)
    cfg = model.config
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    d_head = inner.layers[0].self_attn.head_dim
    kept: list[int] = []  # text positions of the cached tokens, in cache order
    keys = [torch.empty(1, n_kv, 0, d_head) for _ in inner.layers]  # before RoPE
    values = [torch.empty(1, n_kv, 0, d_head) for _ in inner.layers]
    finals = []
    for t in range(n):
        drop = [i for i, pos in enumerate(kept) if n_sinks <= pos <= t - window]
        keep_idx = torch.tensor([i for i in range(len(kept)) if i not in drop], dtype=torch.long)
        kept = [kept[i] for i in keep_idx.tolist()] + [t]
        h = inner.embed_tokens(ids[t].reshape(1, 1))  # [1, 1, d_model]
        slots = torch.arange(len(kept))[None]  # positions inside the cache
        for li, layer in enumerate(inner.layers):
            attn = layer.self_attn
            cos, sin = sp.rope_for(inner, h, slots, sp.layer_type(layer))
            q, k, v = sp.qkv(attn, layer.input_layernorm(h))  # [1, head, 1, d_head], [1, kv_head, 1, d_head] x 2
            keys[li] = torch.cat([keys[li].index_select(2, keep_idx), k], dim=2)  # [1, kv_head, cache, d_head]
            values[li] = torch.cat([values[li].index_select(2, keep_idx), v], dim=2)
            q_rot = sp.rotate(q, cos[:, -1:], sin[:, -1:])
            k_rot = sp.rotate(keys[li], cos, sin)
            # [1, head, 1, cache]
            scores = q_rot @ sp.repeat_kv(k_rot, n_heads // n_kv).transpose(-1, -2) * attn.scaling
            if (reach := sp.layer_window(layer)) is not None:  # a sliding layer reads the slots under `reach` behind
                scores = scores.masked_fill(slots[0] <= len(kept) - 1 - reach, float("-inf"))
            out = scores.softmax(dim=-1) @ sp.repeat_kv(values[li], n_heads // n_kv)  # [1, head, 1, d_head]
            h = sp.add_blocks(layer, h, out.transpose(1, 2).reshape(1, 1, -1))
        finals.append(inner.norm(h)[0, 0])
        if progress is not None:
            progress((t + 1) / n)
    return sp.next_token_losses(model, torch.stack(finals), ids)


def shipped_text() -> str:
    """The public-domain text of the eviction experiment (data/README.md says where it comes from)."""
    return STREAMING_TEXT.read_text(encoding="utf-8")


def perplexity(losses) -> float:
    """exp(mean per-token cross-entropy in nats)."""
    return float(np.exp(np.mean(np.asarray(losses, dtype=np.float64))))


def rolling_mean(values, width: int) -> np.ndarray:
    """Trailing mean over the last `width` values (fewer at the start). [n] -> [n]. Smooths per-token losses."""
    v = np.asarray(values, dtype=np.float64)
    c = np.concatenate([[0.0], np.cumsum(v)])
    idx = np.arange(1, len(v) + 1)
    lo = np.maximum(0, idx - int(width))
    return (c[idx] - c[lo]) / (idx - lo)


SETTINGS = ("full attention", "window only", "window + sinks")


@dataclass
class StreamingResult:
    """Per-token losses of StreamingLLM's three settings on one text: full attention, window, window + sinks.

    positions: [n - 1] text position of each predicted token (1 .. n-1); losses: setting -> [n - 1] nats;
    perplexity: setting -> exp(mean loss); seconds: setting -> wall time of its forward pass.
    """
    window: int
    n_sinks: int
    n_tokens: int
    positions: np.ndarray
    losses: dict[str, np.ndarray]
    perplexity: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_losses(cls, window: int, n_sinks: int, losses: dict, seconds: dict | None = None) -> StreamingResult:
        n = len(next(iter(losses.values()))) + 1
        return cls(window=window, n_sinks=n_sinks, n_tokens=n, positions=np.arange(1, n),
                   losses={k: np.asarray(v, dtype=np.float64) for k, v in losses.items()},
                   perplexity={k: perplexity(v) for k, v in losses.items()}, seconds=dict(seconds or {}))


def describe_experiment(result: StreamingResult, model_name: str = "the model") -> str:
    """One sentence saying what the three perplexities show, whatever they show."""
    full, window_only, with_sinks = (result.perplexity[k] for k in SETTINGS)
    w, s = result.window, result.n_sinks
    if w >= result.n_tokens:
        return (f"The window ({w} tokens) holds the whole text ({result.n_tokens} tokens), so nothing is evicted and "
                f"the three settings agree (perplexity {full:.2f}); make the window smaller than the text.")
    said = (f"Over {result.n_tokens:,} tokens with a window of {w}, {model_name} has perplexity {full:.2f} with full "
            f"attention and {window_only:.2f} once the first tokens are evicted ({window_only / full:.2f}× full)")
    if s == 0:
        return said + "; with no sink tokens kept, the third setting is the second one."
    tokens = f"{s} token{'s' if s > 1 else ''}"
    said += f"; keeping the first {tokens} gives {with_sinks:.2f} ({with_sinks / full:.2f}× full)"
    gap = window_only - full
    if window_only / full < 1.05:
        return said + ": evicting the first tokens barely hurts here, so there is little for the sinks to repair."
    repaired = (window_only - with_sinks) / gap
    if repaired >= 0.9 and with_sinks <= full:
        return said + (". StreamingLLM's finding holds: keeping the sink tokens repairs all of the damage, and here "
                       "even edges out full attention.")
    if repaired >= 0.9:
        return said + f". StreamingLLM's finding holds: the sink tokens repair {repaired:.0%} of the damage."
    if repaired > 0.1:
        return said + f": the sink tokens repair {repaired:.0%} of the damage, not all of it."
    return said + ": keeping the first tokens does not repair the damage here."


def streaming_experiment(model, input_ids, *, window: int, n_sinks: int = DEFAULT_SINKS,
                         full_losses=None, progress: Callable[[float, str], None] | None = None,
                         positions: str = "cache", cached=None) -> StreamingResult:
    """(a) full attention, (b) a window of the last `window` tokens, (c) the same window plus the first n_sinks
    tokens, on one text, each as one masked forward pass (see streaming_token_losses). full_losses, when given,
    is reused for (a) (it does not depend on the window). progress(fraction, message) is called after every layer.
    cached(index, name, window, n_sinks, compute), when given, returns each setting's losses, calling
    compute(report) (report(fraction of its layers), or None) for those it does not have: the app keeps them for
    every visitor, and shows each setting's own progress.
    """
    ids = torch.as_tensor(input_ids).reshape(-1)
    n = ids.shape[0]
    if n < 2:
        raise ValueError("the text needs at least two tokens")
    if window < 1:
        raise ValueError("the window must keep at least one token")
    runs = [(SETTINGS[0], None, 0), (SETTINGS[1], window, 0), (SETTINGS[2], window, n_sinks)]
    losses, seconds = {}, {}
    for i, (name, w, s) in enumerate(runs):
        if name == SETTINGS[0] and full_losses is not None:
            losses[name] = np.asarray(full_losses, dtype=np.float64)
            continue
        report = None
        if progress is not None:
            def report(f, i=i, name=name):
                progress((i + f) / len(runs), f"{name} ({i + 1}/{len(runs)})")

        def compute(report=report, w=w, s=s):
            return streaming_token_losses(model, ids, window=w, n_sinks=s, positions=positions, progress=report)

        start = time.perf_counter()
        losses[name] = compute() if cached is None else np.asarray(cached(i, name, w, s, compute))
        seconds[name] = time.perf_counter() - start
    return StreamingResult(window=window, n_sinks=n_sinks, n_tokens=n, positions=np.arange(1, n), losses=losses,
                           perplexity={k: perplexity(v) for k, v in losses.items()}, seconds=seconds)


