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

Over 300 lines on purpose: the registered function, the mask function, the hooks and the recorder are one
protocol over one per-thread state.
"""

from __future__ import annotations

import contextlib
import math
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
from attnviz.capture.modules import CaptureError, attention_modules, uses_interface

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


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The registered attention function: the family's own eager attention, recording q, k and the rules first
    when a capture of this thread wants this layer."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise CaptureError(f"{type(module).__name__}'s modeling file has no eager_attention_forward.")
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


def _mask_rule(attention_mask, n_query: int, n_key: int, causal_if_none: bool) -> MaskRule:
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
    for layer, module in enumerate(attention_modules(model)):
        handles.append(module.register_forward_pre_hook(partial(_before, layer), with_kwargs=True))
        handles.append(module.register_forward_hook(partial(_after, layer)))
    return handles


_HOOKS = SharedHooks(_install_recording_hooks)


@contextlib.contextmanager
def recording(model, recorder: Recorder) -> Iterator[Recorder]:
    """Records for this thread while the block runs: through the registered attention function, or through hooks
    on every attention module for the families that do not dispatch through the interface."""
    modules = attention_modules(model)
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
    modules = attention_modules(model)
    wanted = wanted_layers(layers, len(modules))
    recorder = Recorder(wanted=set(wanted), last=len(modules), dtype=np.dtype(np.float32), store="pattern",
                         layer_of={id(m): i for i, m in enumerate(modules)}, stop=False)
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


def _bloom_inputs(module, args, kwargs) -> LayerInputs:
    """BloomAttention's q, k and ALiBi bias from its own projection (BLOOM does not use the attention interface):
    scores = beta * alibi + inv_norm_factor * q.k, alibi[head, key] = slope_h * key position."""
    q, k, _ = module._reshape(module.query_key_value(_hidden(args, kwargs)))  # each [batch, head, n, head_dim]
    n_query, n_key = q.shape[-2], k.shape[-2]
    alibi = kwargs["alibi"].reshape(q.shape[0], module.num_heads, -1)[0, :, -n_key:]  # [head, key]
    n_heads = module.num_heads
    return LayerInputs(q=_kept(q[0]), k=_kept(k[0]), kv_head_of=tuple(range(n_heads)),
                       scaling=float(module.inv_norm_factor),
                       mask=_mask_rule(kwargs.get("attention_mask"), n_query, n_key, True),
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
        rule, key_bias, scaling = _mask_rule(mask, n_query, n_key, True), None, 1 / math.sqrt(module.head_dim)
    else:
        rule, mask_bias = _mask_and_key_bias(mask, n_query, n_key) if mask is not None else (
            _mask_rule(None, n_query, n_key, True), 0.0)
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
                       mask=_mask_rule(kwargs.get("attention_mask"), n_query, n_key, True))


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
