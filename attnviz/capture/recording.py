"""How attnviz sees inside a model's attention while it runs: the function registered in transformers' attention
interface (and its mask function), the hooks of the families that do not dispatch through it, and the per-thread
recorder they report to. attnviz.capture.run builds an AttentionCapture on top of this; attnviz.capture.loading
makes a model use the registered function.

Families whose attention modules dispatch through transformers' attention interface (every family that imports
ALL_ATTENTION_FUNCTIONS: Llama, Mistral, Qwen, Gemma, GPT-2, GPT-NeoX, OPT, BERT, gpt-oss, ...) are loaded with
attn_implementation="attnviz": a function registered in that interface which wraps the family's own eager function.
Outside a capture it is the family's eager attention, unchanged. During a capture it also records, for each wanted
layer, the query and key vectors the function received (after RoPE, before the GQA repeat) and the scaling,
soft-cap, sink logits and mask that went with them, as an attnviz.attention.LayerInputs. Families that do not
dispatch through the interface (BLOOM, Falcon, GPT-J) keep eager attention and forward hooks: their pattern is the
module's returned weights, and their q, k (after RoPE) and ALiBi bias are rebuilt from the module's own
projections and the family's own functions (REBUILT).

Threads. A cached model is shared by every Streamlit session, so two captures may run on it at the same moment.
Nothing global holds per-capture state: the registered function and the hooks look up the recorder of the current
thread in a ContextVar and do nothing more than the model's own attention when there is none. Hooks are registered
by the first capture that needs them and removed by the last one to finish (a reference count under a lock).

The rule of each mask is read by attnviz.capture.masks; the hooks' rebuilding of BLOOM, Falcon and GPT-J by
attnviz.capture.rebuilt.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from attnviz import attention as core
from attnviz.attention import LayerInputs, MaskRule
from attnviz.capture.hooks import SharedHooks
from attnviz.capture.masks import RuleMask, named_rule
from attnviz.capture.masks import mask_rule as _mask_rule
from attnviz.capture.modules import CaptureError, attention_modules, numbered_attention, uses_interface
from attnviz.capture.rebuilt import REBUILT

ATTN_IMPLEMENTATION = "attnviz"


_REGISTERED = False
_REGISTER_LOCK = threading.Lock()


def register() -> None:
    global _REGISTERED
    with _REGISTER_LOCK:
        if _REGISTERED:
            return
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(ATTN_IMPLEMENTATION, _attention)
        AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _mask)
        _REGISTERED = True


def _mask(*args, **kwargs):
    """The mask for the "attnviz" implementation: the eager float mask (what the family's eager attention adds),
    except in a qk-store capture, where it is SDPA's bool mask, or None for a plain causal or full mask (so no
    N x N mask is built at all)."""
    from transformers.masking_utils import eager_mask, sdpa_mask

    rec = _ACTIVE.get()
    if rec is not None and rec.store == "qk":
        kwargs.pop("dtype", None)
        rule = None if args else named_rule(**kwargs)
        if rule is not None and rule.kind in ("sliding", "chunked"):
            return RuleMask(rule)  # a window or chunk by its rule: no N x N mask is built
        return sdpa_mask(*args, **kwargs)
    return eager_mask(*args, **kwargs)


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The registered attention function: the family's own eager attention, recording q, k and the rules first
    when a capture of this thread wants this layer."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise CaptureError(f"{type(module).__name__}'s modeling file has no eager_attention_forward.")
    attention_mask = _with_selection(attention_mask, kwargs.pop("indices", None), query)
    rec = _ACTIVE.get()
    layer = None if rec is None else rec.layer_of.get(id(module))
    if layer is None or layer > rec.last:
        if isinstance(attention_mask, RuleMask):
            attention_mask = attention_mask.eager(query.dtype, query.device)
        return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    softcap = kwargs.get("softcap")
    sink = kwargs.get("s_aux")
    if sink is None:
        sink = getattr(module, "sinks", None)
    if kwargs.get("position_bias") is not None:
        raise CaptureError(f"{type(module).__name__} adds a relative position bias, which attnviz does not read yet.")
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    if layer in rec.wanted:
        n_query, n_key = query.shape[-2], key.shape[-2]
        causal = bool(kwargs.get("is_causal", getattr(module, "is_causal", True)))
        mask = rec.mask_rule(attention_mask, n_query, n_key, causal and n_query > 1)
        n_heads = query.shape[1]
        # a copy outlives the forward pass; inputs dropped after the layer (keep_inputs=False) may be views
        own = (lambda x: x.clone()) if rec.keep_inputs else (lambda x: x)
        rec.inputs[layer] = LayerInputs(
            q=own(rec.kept(query[0])), k=own(rec.kept(key[0])),
            kv_head_of=tuple(core.kv_head_of(n_heads, key.shape[1])), scaling=scale, mask=mask,
            softcap=float(softcap) if softcap else None,
            sink=None if sink is None else sink.detach().float().cpu().reshape(-1).clone())
        if rec.with_values:
            rec.values[layer] = value[0].detach().float().cpu().clone()
    if rec.store == "pattern":
        out, weights = eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        if layer in rec.wanted:
            if weights is None:
                raise CaptureError(f"{type(module).__name__} returned no attention weights.")
            rec.pattern[layer] = weights[0].detach().float().cpu().numpy().astype(rec.dtype, copy=False)
    elif rec.attend is not None and layer in rec.wanted and query.shape[0] == 1:
        # the caller's blocked attention computes this layer's output from what it saw (and its statistics on the
        # way): the scores are made once, for both
        out = rec.attend(layer, rec.inputs[layer], rec.kept(value[0]))  # [head, query, d_v]
        out = out.to(device=query.device, dtype=query.dtype).unsqueeze(0).transpose(1, 2).contiguous()
        weights = None
    elif softcap or sink is not None or isinstance(attention_mask, RuleMask):
        # SDPA has neither soft-cap nor sink, and would need the window as an N x N mask: attnviz's core computes
        # the output a block at a time, skipping the key tiles the rule hides
        out = _core_output(module, query, key, value, attention_mask, scale, softcap, sink)
        weights = None
    else:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        out, weights = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                              scaling=scaling, **kwargs)
    rec.layer_done(layer)
    return out, weights


def _with_selection(attention_mask, indices, query):
    """The mask with a top-k key selection folded in (DeepSeek-V3.2's indexer hands a kernel other than eager or
    SDPA its kept keys [batch, query, topk] as `indices`, and folds them into the mask itself for eager and SDPA:
    done here as it does it, so the registered function attends to the kept keys only)."""
    if indices is None:
        return attention_mask
    if isinstance(attention_mask, RuleMask):
        attention_mask = attention_mask.eager(query.dtype, query.device)
    if attention_mask is None:
        raise CaptureError("A top-k key selection came without an attention mask to fold it into.")
    n_key = attention_mask.shape[-1]
    hidden = torch.ones((*indices.shape[:2], n_key), dtype=torch.bool, device=indices.device).scatter(
        -1, indices.long(), False).unsqueeze(1)  # [batch, 1, query, key]; True = not selected
    if attention_mask.dtype == torch.bool:
        return attention_mask & ~hidden
    return attention_mask.masked_fill(hidden, torch.finfo(attention_mask.dtype).min)


def _core_output(module, query, key, value, attention_mask, scale, softcap, sink):
    """[batch, query, head, d_v] attention output by attnviz.attention.layer_output, batch by batch, computed on
    the CPU (where the core's masks live) and handed back on the model's device."""
    device = query.device
    query, key, value = (x.detach().cpu() for x in (query, key, value))
    by_rule = isinstance(attention_mask, RuleMask)  # one text: the same rule for its one batch row
    attention_mask = attention_mask.cpu() if attention_mask is not None and not by_rule else attention_mask
    sink = None if sink is None else sink.detach().cpu()
    outs = []
    causal = bool(getattr(module, "is_causal", True)) and query.shape[-2] > 1
    for b in range(query.shape[0]):
        mask = _mask_rule(attention_mask if by_rule or attention_mask is None else attention_mask[b:b + 1],
                          query.shape[-2], key.shape[-2], causal)
        inputs = LayerInputs(q=query[b].float(), k=key[b].float(),
                             kv_head_of=tuple(core.kv_head_of(query.shape[1], key.shape[1])), scaling=scale,
                             mask=mask, softcap=float(softcap) if softcap else None,
                             sink=None if sink is None else sink.float().reshape(-1))
        outs.append(core.layer_output(inputs, value[b].float()).to(query.dtype))
    return torch.stack(outs).transpose(1, 2).contiguous().to(device)


@dataclass
class Recorder:
    wanted: set[int]
    last: int
    dtype: np.dtype
    store: str
    layer_of: dict[int, int]
    progress: Callable[[int, int], None] | None = None
    on_layer: Callable[[int, LayerInputs], None] | None = None
    keep_inputs: bool = True
    attend: Callable[[int, LayerInputs, torch.Tensor], torch.Tensor] | None = None
    with_values: bool = False
    stop: bool = True  # stop the forward pass after the last wanted layer
    pattern: dict[int, np.ndarray] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    inputs: dict[int, LayerInputs] = field(default_factory=dict)
    seen: set[int] = field(default_factory=set)
    kv_head_of: tuple[int, ...] | None = None
    done: int = 0
    device_inputs: bool = False  # q, k and v stay where a GPU model made them (DuringForward.device_inputs)
    mask_rules: dict = field(default_factory=dict)  # (id(mask), n_query, n_key, causal) -> (mask, its MaskRule)

    def mask_rule(self, attention_mask, n_query: int, n_key: int, causal_if_none: bool) -> MaskRule:
        """_mask_rule, read once per mask: transformers hands every layer of a kind the same mask object, and
        reading an N x N mask for each of them cost a short capture 2% of its time. The mask is kept with its
        rule, so its id is not reused while the recorder lives."""
        key = (id(attention_mask), n_query, n_key, causal_if_none)
        if key not in self.mask_rules:
            self.mask_rules[key] = (attention_mask, _mask_rule(attention_mask, n_query, n_key, causal_if_none))
        return self.mask_rules[key][1]

    def kept(self, x: torch.Tensor) -> torch.Tensor:
        """What the recorder hands on of a layer's q, k or v [head, n, d]: x itself on a GPU with device_inputs,
        else a float32 copy on the CPU."""
        return x.detach() if self.device_inputs and x.is_cuda else x.detach().float().cpu()

    def layer_done(self, layer: int) -> None:
        if layer in self.wanted:
            x = self.inputs.get(layer)
            if x is not None:
                self.seen.add(layer)
                self.kv_head_of = self.kv_head_of or x.kv_head_of
                if self.on_layer is not None:
                    self.on_layer(layer, x)
                if not self.keep_inputs:
                    del self.inputs[layer]
            self.done += 1
            if self.progress is not None:
                self.progress(self.done, len(self.wanted))
        if self.stop and layer == self.last:
            raise StopForward

    def clear(self) -> None:
        """Forgets what was recorded, for the next forward pass under the same recorder."""
        self.pattern.clear()
        self.inputs.clear()
        self.values.clear()
        self.seen.clear()
        self.mask_rules.clear()
        self.done = 0


class StopForward(Exception):
    """Raised after the last wanted layer: the rest of the forward pass is not needed."""


_ACTIVE: ContextVar[Recorder | None] = ContextVar("attnviz_capture", default=None)


def _install_recording_hooks(model) -> list:
    handles = []
    for layer, module in numbered_attention(model).items():
        handles.append(module.register_forward_pre_hook(partial(_before, layer), with_kwargs=True))
        handles.append(module.register_forward_hook(partial(_after, layer)))
    return handles


_HOOKS = SharedHooks(_install_recording_hooks)


@contextlib.contextmanager
def recording(model, recorder: Recorder) -> Iterator[Recorder]:
    """Records for this thread while the block runs: through the registered attention function, or through hooks
    on every attention module for the families that do not dispatch through the interface."""
    modules = list(numbered_attention(model).values()) or attention_modules(model)
    hooked = not uses_interface(modules[0]) or getattr(model.config, "_attn_implementation", None) != \
        ATTN_IMPLEMENTATION
    with _HOOKS.serving(model, _ACTIVE, recorder, hooked=hooked):
        yield recorder


@contextlib.contextmanager
def recording_forward(model, layers=None) -> Iterator[Recorder]:
    """Records, for this thread, the attention weights of batch row 0 in every wanted layer (None: all) of each
    forward pass the block runs, without stopping it: recorder.pattern[layer] is [head, query, key] float32 after
    each pass (recorder.clear() between passes). The caller runs the whole model, a KV cache included
    (attnviz.generation reads each new token's row this way)."""
    numbered = numbered_attention(model)
    numbers = list(numbered)
    wanted = [numbers[i] for i in wanted_layers(layers, len(numbers))]
    recorder = Recorder(wanted=set(wanted), last=max(numbers) + 1, dtype=np.dtype(np.float32), store="pattern",
                         layer_of={id(m): i for i, m in numbered.items()}, stop=False)
    with recording(model, recorder):
        yield recorder


def _before(layer: int, module, args, kwargs):
    rec = _ACTIVE.get()
    if rec is None or layer not in rec.wanted:
        return None
    rebuild = REBUILT.get(type(module).__name__)
    if rebuild is not None:
        inputs = rebuild(module, args, kwargs)
        if inputs is not None:
            rec.inputs[layer] = inputs
    return None


def _after(layer: int, module, args, output):
    rec = _ACTIVE.get()
    if rec is None or layer not in rec.wanted:
        return None
    weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
    if weights is None:
        raise CaptureError(f"{type(module).__name__} returned no attention weights (is attention eager?).")
    if rec.store == "pattern":  # the long-text store keeps q and k only, never the N x N weights
        rec.pattern[layer] = weights[0].detach().float().cpu().numpy().astype(rec.dtype, copy=False)
    rec.layer_done(layer)
    return None


def wanted_layers(layers, n_layers: int) -> list[int]:
    if layers is None:
        return list(range(n_layers))
    if isinstance(layers, (int, np.integer)):
        layers = [layers]
    out = []
    for layer in layers:
        i = int(layer)
        if not -n_layers <= i < n_layers:
            raise CaptureError(f"Layer {i} does not exist: the model has layers 0 to {n_layers - 1}.")
        out.append(i % n_layers)
    if not out:
        raise CaptureError("No layers chosen: pick at least one layer.")
    return sorted(set(out))
