"""The tests' second reading of DeepSeek-V3.2's indexed sparse attention (DSA), independent of attnviz's capture:
which keys each query's indexer kept, the pattern the layer used over them, and what dense attention would have
added. tests/test_hybrid_capture.py checks the capture's indexed view (attnviz.capture.linear.indexed_view, read
from the q, k and folded mask the capture recorded) against it; tests/test_indexer.py checks it against the layer's
own output, transformers' own attention weights and a float64 recomputation of the indexer's scores.

In transformers' deepseek_v32, every attention layer holds an indexer, a small attention of its own (index heads
with ReLU scores, weighted per query and summed over heads, after the model's causal mask is added) whose top
min(index_topk, N) keys per query are kept. Under the eager and SDPA implementations the layer then sets every other
key's entry of the attention mask to the dtype's minimum, so its softmax runs over the kept keys only; the flash
path hands the indices to its kernel instead, and any other attention function receives them as an `indices`
keyword it may ignore. Two consequences:
- at N <= index_topk (2,048 in the released model) every key is kept and the layer is dense;
- the top-k is taken after the causal mask, so a query with fewer than index_topk earlier keys keeps them all, and
  the rest of its top-k names later keys (at the mask's minimum), which the causal mask still hides.

`indexed_selection` runs one forward pass under eager attention (set by transformers' set_attn_implementation and
put back) and records, per indexed layer, the indexer's returned indices and the mask it scored against (a forward
hook), and the q, k, v, scaling and mask the layer's eager_attention_forward received (its modeling module's name
patched with a pass-through for the pass). It checks that the mask the attention used keeps exactly the indexer's
keys that the causal mask allows, and refuses the layer otherwise, never giving a selection the layer did not use.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from dataclasses import dataclass
from unittest import mock

import torch

from attnviz.mixers.layers import layer_stack


class IndexerError(ValueError):
    """An indexed layer's selection cannot be read exactly; the message says why."""


@dataclass(frozen=True)
class Selection:
    """One indexed layer on one text. picked [query, topk]: the indexer's key indices as it returned them (later
    keys included where a query has fewer than topk earlier ones); allowed [query, key]: the model's own (causal)
    mask; kept [query, key]: picked and allowed, the keys the layer attended to; pattern [head, query, key]: the
    softmax over the kept keys, what the layer used; dense [head, query, key]: the softmax of the same scores over
    every allowed key, what it would have used without the indexer; outside [head, query]: the dense pattern's mass
    on allowed keys that were not kept, what dense attention would have added; value [head, key, d_v]: the values
    the pattern weighs (GQA's key-value heads repeated to the query heads)."""

    layer: int
    picked: torch.Tensor
    allowed: torch.Tensor
    kept: torch.Tensor
    pattern: torch.Tensor
    dense: torch.Tensor
    outside: torch.Tensor
    value: torch.Tensor
    kind = "indexed"

    def output(self) -> torch.Tensor:
        """The layer's attention output [query, head, d_v] (before the output projection): pattern @ value."""
        return torch.einsum("hts,hsd->thd", self.pattern, self.value.to(self.pattern.dtype))


def _visible(mask: torch.Tensor) -> torch.Tensor:
    """[query, key] bool, True where a mask (bool, or float with the dtype's minimum or -inf where hidden) lets a
    query see a key; batch row 0 and its first head."""
    while mask.dim() > 2:
        mask = mask[0]
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2


def selection_of(layer: int, query, key, value, scaling: float, picked, allowed, *,
                 dtype=torch.float32) -> Selection:
    """A Selection from what the layer's attention received: query [head, N, d]; key, value [kv head, N, d];
    scaling: the factor on q.k; picked [N, topk] the indexer's indices; allowed [N, N] bool, the model's mask."""
    heads, n = query.shape[0], query.shape[1]
    if heads % key.shape[0]:
        raise IndexerError(f"Layer {layer}: {heads} query heads do not share {key.shape[0]} key heads evenly.")
    key, value = (x.repeat_interleave(heads // x.shape[0], dim=0) for x in (key, value))
    kept = torch.zeros(n, key.shape[1], dtype=torch.bool, device=picked.device).scatter(1, picked.long(), True)
    kept &= allowed
    if not kept.any(-1).all():
        raise IndexerError(f"Layer {layer}: a query kept no key it may see, so its attention is not defined.")
    scores = (query.to(dtype) @ key.to(dtype).transpose(-1, -2)) * scaling  # [head, query, key]
    pattern = scores.masked_fill(~kept, float("-inf")).softmax(-1)
    dense = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    outside = (dense * (allowed & ~kept)).sum(-1)
    return Selection(layer=layer, picked=picked.long(), allowed=allowed, kept=kept, pattern=pattern, dense=dense,
                     outside=outside, value=value)


def indexed_layers(model) -> dict[int, torch.nn.Module]:
    """{decoder layer: its attention module} for the layers whose attention holds an indexer."""
    found = {}
    for i, layer in enumerate(layer_stack(model)):
        for module in layer.modules():
            if "Indexer" in type(getattr(module, "indexer", None)).__name__:
                found[i] = module
                break
    return found


def _recording(original, calls: dict, layer_of: dict):
    """`original` (a family's eager_attention_forward), passing every call through and keeping the arguments of a
    call from a known attention module."""

    @functools.wraps(original)
    def eager(module, query, key, value, attention_mask, scaling, *args, **kwargs):
        out = original(module, query, key, value, attention_mask, scaling, *args, **kwargs)
        if id(module) in layer_of:
            calls.setdefault(layer_of[id(module)], {}).update(
                query=query[0].detach(), key=key[0].detach(), value=value[0].detach(), scaling=float(scaling),
                used=None if attention_mask is None else _visible(attention_mask.detach()))
        return out

    return eager


def _indexer_hooks(layers: dict, calls: dict) -> list:
    """Forward hooks that keep each indexer's returned indices and the mask it scored against."""
    def keep(layer, _module, args, kwargs, out):
        mask = kwargs["attention_mask"] if "attention_mask" in kwargs else args[3]
        calls.setdefault(layer, {}).update(picked=out[0].detach().long(), allowed=_visible(mask.detach()))

    return [module.indexer.register_forward_hook(functools.partial(keep, layer), with_kwargs=True)
            for layer, module in layers.items()]


@contextlib.contextmanager
def _recorded(model, layers: dict):
    """Within the block, the model runs eager attention (transformers' set_attn_implementation) and its forward
    passes fill the yielded dict {layer: {picked, allowed, query, key, value, scaling, used}}; afterwards the model
    and its modeling module are as they were."""
    names = sorted({type(module).__module__ for module in layers.values()})
    if any(not hasattr(sys.modules[name], "eager_attention_forward") for name in names):
        raise IndexerError("This model's indexed attention has no eager attention function to read it from.")
    calls: dict = {}
    layer_of = {id(module): layer for layer, module in layers.items()}
    implementation = model.config._attn_implementation
    with contextlib.ExitStack() as stack:
        for name in names:
            source = sys.modules[name]
            stack.enter_context(mock.patch.object(
                source, "eager_attention_forward", _recording(source.eager_attention_forward, calls, layer_of)))
        handles = _indexer_hooks(layers, calls)
        try:
            model.set_attn_implementation("eager")
            yield calls
        finally:
            model.set_attn_implementation(implementation)
            for handle in handles:
                handle.remove()


def indexed_selection(model, input_ids: torch.Tensor, *, dtype=torch.float32) -> dict[int, Selection]:
    """{layer: Selection} of every indexed layer of `model` on input_ids [1, N] (one forward pass, no cache)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise IndexerError("Indexed layers are read for one text at a time (input ids of shape [1, N]).")
    layers = indexed_layers(model)
    if not layers:
        raise IndexerError("This model has no indexed (top-k) attention layer.")
    with _recorded(model, layers) as calls, torch.no_grad():
        model(input_ids=input_ids, use_cache=False)
    selections = {}
    for layer in sorted(layers):
        call = calls.get(layer, {})
        if not {"picked", "allowed", "query", "used"} <= set(call):
            raise IndexerError(f"Layer {layer}'s indexer or attention did not run as this reading expects.")
        selection = selection_of(layer, call["query"], call["key"], call["value"], call["scaling"], call["picked"],
                                 call["allowed"], dtype=dtype)
        if call["used"] is None or not torch.equal(call["used"], selection.kept):
            raise IndexerError(f"Layer {layer}'s attention did not attend to exactly the keys its indexer kept.")
        selections[layer] = selection
    return selections
