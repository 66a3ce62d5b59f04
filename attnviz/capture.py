"""Hook-based capture of every head's attention pattern (and, on request, the pre-softmax scores).

How it works. Every attention module of the families attnviz supports (GPT-2, Llama, BLOOM, BERT) returns
`(output, attn_weights)` under eager attention, and transformers' own `output_attentions` reads exactly that second
element with a forward hook (see transformers.utils.output_capturing). capture_attention does the same, so its
pattern equals output_attentions bit for bit, but it keeps only the layers asked for, converts each layer as soon as
it is computed, and stops the forward pass after the last wanted layer (no LM head, no later layers).

Why hooks and not a registered attention function (transformers' AttentionInterface): BLOOM does not dispatch
through that interface, and a registered function would have to be made the model's attention implementation,
i.e. a change of the shared model's config. Hooks work for all four families and leave the model untouched.

Threads. A cached model is shared by every Streamlit session, so two captures may run on it at the same moment.
Hooks are global to a module, so they never hold per-capture state: they look up the recorder of the *current
thread* in a ContextVar (each thread has its own context) and do nothing when there is none. They are registered
by the first capture that needs them and removed in `finally` by the last one to finish (a reference count under a
lock), so no hook outlives the captures, and a forward pass that is not a capture (another page, another thread)
passes through them untouched.

Scores. The pattern is softmax(scores); the scores themselves are not returned by any attention module. With
with_scores=True a forward pre-hook receives the very inputs of each wanted attention module (hidden states, the
mask, RoPE's cos/sin or ALiBi's bias) and repeats the module's own first steps with the module's own weights and
helper functions, in the same order and dtype, up to the logits that go into the softmax: q.k * scaling + bias +
mask. Masked entries are set to -inf (the model adds the most negative float there, whose softmax is also 0).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from attnviz.tokenizer import _BYTE_OF

MAX_TOKENS = 2048
MAX_CAPTURE_BYTES = 2 * 1024**3  # the captured arrays must fit comfortably in memory


class CaptureError(ValueError):
    """A capture cannot be done; the message says why and what to do."""


@dataclass
class AttentionCapture:
    """Every captured head of one forward pass over one text.

    tokens:     list[str], one readable string per token (spaces shown as ␣, newlines as ↵, tabs as ⇥)
    token_ids:  list[int], the ids the model saw
    pattern:    [layer, head, query, key] attention weights (rows sum to 1), in the dtype asked for
    layers:     list[int], the model layer of each entry of the first axis
    kv_head_of: list[int], for each query head, the key/value head it reads (GQA/MQA; identity for MHA)
    model_name: the registry name or path of the model
    causal:     True when a query never attends to later keys
    scores:     [layer, head, query, key] float32 pre-softmax logits (q.k * scaling + bias, -inf where masked),
                only with with_scores=True
    scaling:    the factor the model multiplied q.k by (1/sqrt(head_dim) for all four families), with scores
    head_dim:   the size of one head's query/key vectors, with scores
    """

    tokens: list[str]
    token_ids: list[int]
    pattern: np.ndarray
    layers: list[int]
    kv_head_of: list[int]
    model_name: str
    causal: bool
    scores: np.ndarray | None = None
    scaling: float | None = None
    head_dim: int | None = None

    @property
    def n_layers(self) -> int:
        return int(self.pattern.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.pattern.shape[1])

    @property
    def n_tokens(self) -> int:
        return int(self.pattern.shape[2])


def capture_attention(loaded, text: str, *, layers=None, dtype=np.float32, with_scores: bool = False,
                      max_tokens: int = MAX_TOKENS) -> AttentionCapture:
    """Runs `loaded` (an attnviz.models.LoadedModel) on `text` and returns every head of the chosen layers.

    layers: None for all, or an iterable of layer indices (negative counts from the end).
    dtype: np.float32 (exact) or np.float16 (half the memory) for the pattern.
    """
    if not isinstance(text, str) or not text.strip():
        raise CaptureError("The text is empty: type some text to run the model on.")
    model, tokenizer = loaded.model, loaded.tokenizer
    if getattr(model.config, "is_encoder_decoder", False):
        raise CaptureError(f"{loaded.spec.name} is an encoder-decoder model; attnviz captures decoder-only and "
                           "encoder-only models.")
    modules = attention_modules(model)
    wanted = _wanted_layers(layers, len(modules))
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float16)):
        raise CaptureError(f"Patterns are stored as float32 or float16, not {dtype}.")

    encoded = tokenizer(text, return_tensors="pt")
    ids = encoded.input_ids
    n = int(ids.shape[1])
    if n == 0:
        raise CaptureError(f"{loaded.spec.name}'s tokenizer turned the text into no tokens; try another text or "
                           "check the model folder's tokenizer files.")
    limit = min(max_tokens, _position_limit(model.config))
    if n > limit:
        raise CaptureError(f"The text is {n:,} tokens long; the limit for {loaded.spec.name} here is {limit:,} "
                           "tokens. Shorten the text.")
    n_heads = _n_heads(model.config)
    need = len(wanted) * n_heads * n * n * (dtype.itemsize + (4 if with_scores else 0))
    if need > MAX_CAPTURE_BYTES:
        raise CaptureError(f"Capturing {len(wanted)} layers x {n_heads} heads x {n:,}² weights needs "
                           f"{need / 2**30:.1f} GiB (limit {MAX_CAPTURE_BYTES / 2**30:.0f} GiB). Pick fewer layers, "
                           "float16, or a shorter text.")
    if with_scores:
        _scores_function(modules[0])  # fail before the forward pass when the family is not supported

    recorder = _Recorder(wanted=set(wanted), last=max(wanted), dtype=dtype, with_scores=with_scores)
    runner = getattr(model, "base_model", model)
    device = _input_device(model)
    with recording(model, recorder), torch.inference_mode():
        try:
            runner(input_ids=ids.to(device), attention_mask=encoded.attention_mask.to(device), use_cache=False)
        except _StopForward:
            pass
        except CaptureError:
            raise
        except Exception as exc:  # a user's model that cannot run this text: a message, not a traceback
            raise CaptureError(f"{loaded.spec.name} failed on this text: {type(exc).__name__}: {exc}") from exc
    missing = [i for i in wanted if i not in recorder.pattern]
    if missing:
        raise CaptureError(f"{loaded.spec.name} did not return attention weights for layers {missing}.")

    capture = AttentionCapture(
        tokens=readable_tokens(tokenizer, ids[0].tolist()),
        token_ids=ids[0].tolist(),
        pattern=np.stack([recorder.pattern[i] for i in wanted]),
        layers=list(wanted),
        kv_head_of=kv_head_of(model.config),
        model_name=loaded.spec.name,
        causal=_is_causal(model, modules[0]),
    )
    if with_scores:
        scalings = {recorder.scaling[i] for i in wanted}
        if len(scalings) != 1:
            raise CaptureError("This model scales q.k differently in each layer; capture one layer at a time.")
        capture.scores = np.stack([recorder.scores[i] for i in wanted])
        capture.scaling = scalings.pop()
        capture.head_dim = recorder.head_dim
    return capture


def attention_modules(model) -> list[torch.nn.Module]:
    """The self-attention module of each layer, in layer order: the modules output_attentions reads.

    Uses the model's own `_can_record_outputs["attentions"]` when it declares one (GPT-2, Llama, BERT in
    transformers 5), else the innermost modules whose class name ends in "Attention" (BLOOM).
    """
    target = None
    for module in model.modules():
        target = (getattr(type(module), "_can_record_outputs", None) or {}).get("attentions")
        if target is not None:
            break
    found = []
    for name, module in model.named_modules():
        if target is None:
            ok = type(module).__name__.endswith("Attention") and "cross" not in name.lower() and not any(
                type(c).__name__.endswith("Attention") for c in module.children())
        elif isinstance(target, type):
            ok = isinstance(module, target)
        else:
            ok = isinstance(module, target.target_class) and (
                target.layer_name is None or name.endswith(target.layer_name))
        if ok:
            found.append(module)
    if not found:
        raise CaptureError(f"No attention modules found in {type(model).__name__}: attnviz cannot read its "
                           "attention weights.")
    return found


def kv_head_of(config) -> list[int]:
    """For each query head, the key/value head it reads: query head h uses KV head h // (n_heads / n_kv_heads)."""
    n_heads = _n_heads(config)
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    group = n_heads // n_kv
    return [h // group for h in range(n_heads)]


def readable_tokens(tokenizer, token_ids: list[int]) -> list[str]:
    """Each token decoded on its own, with whitespace made visible. A piece of a multi-byte character (which
    decodes alone to U+FFFD) is shown by its bytes, as <0xC3>, when its vocabulary string is byte-level (GPT-2's
    byte-to-character table), else by that vocabulary string."""
    out = []
    for tid in token_ids:
        text = tokenizer.decode([tid], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if "\ufffd" in text or text == "":
            piece = str(tokenizer.convert_ids_to_tokens(tid))
            raw = [_BYTE_OF.get(ch) for ch in piece]
            text = "".join(f"<0x{b:02X}>" for b in raw) if None not in raw else piece
        out.append(text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥").replace("\r", "␍"))
    return out


@dataclass
class _Recorder:
    wanted: set[int]
    last: int
    dtype: np.dtype
    with_scores: bool
    pattern: dict[int, np.ndarray] = field(default_factory=dict)
    scores: dict[int, np.ndarray] = field(default_factory=dict)
    scaling: dict[int, float] = field(default_factory=dict)
    head_dim: int | None = None


class _StopForward(Exception):
    """Raised by the hook of the last wanted layer: the rest of the forward pass is not needed."""


_ACTIVE: ContextVar[_Recorder | None] = ContextVar("attnviz_capture", default=None)


@dataclass
class _Hooks:
    users: int = 0
    handles: list = field(default_factory=list)


_HOOKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_HOOKS_LOCK = threading.Lock()


@contextlib.contextmanager
def recording(model, recorder: _Recorder) -> Iterator[_Recorder]:
    """Hooks on every attention module of `model` while the block runs, reporting to `recorder` for this thread."""
    modules = attention_modules(model)
    with _HOOKS_LOCK:
        hooks = _HOOKS.setdefault(model, _Hooks())
        if hooks.users == 0:
            for layer, module in enumerate(modules):
                hooks.handles.append(module.register_forward_pre_hook(partial(_before, layer), with_kwargs=True))
                hooks.handles.append(module.register_forward_hook(partial(_after, layer)))
        hooks.users += 1
    token = _ACTIVE.set(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.reset(token)
        with _HOOKS_LOCK:
            hooks.users -= 1
            if hooks.users == 0:
                for handle in hooks.handles:
                    handle.remove()
                hooks.handles.clear()


def _before(layer: int, module, args, kwargs):
    rec = _ACTIVE.get()
    if rec is None or not rec.with_scores or layer not in rec.wanted:
        return None
    scores, scaling, head_dim = _scores_function(module)(module, args, kwargs)
    rec.scores[layer] = scores[0].float().cpu().numpy()
    rec.scaling[layer] = float(scaling)
    rec.head_dim = int(head_dim)
    return None


def _after(layer: int, module, args, output):
    rec = _ACTIVE.get()
    if rec is None or layer not in rec.wanted:
        return None
    weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
    if weights is None:
        raise CaptureError(f"{type(module).__name__} returned no attention weights (is attention eager?).")
    rec.pattern[layer] = weights[0].detach().float().cpu().numpy().astype(rec.dtype, copy=False)
    if layer == rec.last:
        raise _StopForward
    return None


def _family_helpers(module):
    """The module's own modeling file, so scores use its helper functions (apply_rotary_pos_emb, repeat_kv)."""
    return sys.modules[type(module).__module__]


def _masked(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """scores + mask, as the model adds them, then -inf where the mask forbids attending."""
    if mask is None:
        return scores
    mask = mask[..., : scores.shape[-1]]
    scores = scores + mask
    if mask.dtype == torch.bool:
        raise CaptureError("The model passed a boolean mask: its attention is not eager.")
    return scores.masked_fill(mask <= torch.finfo(mask.dtype).min / 2, float("-inf"))


def _llama_scores(module, args, kwargs):
    """LlamaAttention.forward + eager_attention_forward up to the softmax."""
    hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
    cos, sin = kwargs["position_embeddings"]
    helpers = _family_helpers(module)
    shape = (*hidden.shape[:-1], -1, module.head_dim)
    q = module.q_proj(hidden).view(shape).transpose(1, 2)  # [batch, head, query, head_dim]
    k = module.k_proj(hidden).view(shape).transpose(1, 2)  # [batch, kv_head, key, head_dim]
    q, k = helpers.apply_rotary_pos_emb(q, k, cos, sin)
    k = helpers.repeat_kv(k, module.num_key_value_groups)  # [batch, head, key, head_dim]
    scores = torch.matmul(q, k.transpose(2, 3)) * module.scaling
    return _masked(scores, kwargs.get("attention_mask")), module.scaling, module.head_dim


def _gpt2_scores(module, args, kwargs):
    """GPT2Attention.forward + eager_attention_forward up to the softmax."""
    if module.reorder_and_upcast_attn or module.is_cross_attention:
        raise CaptureError("Scores are not available for GPT-2 with reorder_and_upcast_attn or cross-attention.")
    hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
    q, k, _ = module.c_attn(hidden).split(module.split_size, dim=2)
    shape = (*q.shape[:-1], -1, module.head_dim)
    q = q.view(shape).transpose(1, 2)  # [batch, head, query, head_dim]
    k = k.view(shape).transpose(1, 2)  # [batch, head, key, head_dim]
    scores = torch.matmul(q, k.transpose(-1, -2)) * module.scaling
    return _masked(scores, kwargs.get("attention_mask")), module.scaling, module.head_dim


def _bert_scores(module, args, kwargs):
    """BertSelfAttention.forward + eager_attention_forward up to the softmax."""
    hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
    shape = (*hidden.shape[:-1], -1, module.attention_head_size)
    q = module.query(hidden).view(*shape).transpose(1, 2)  # [batch, head, query, head_dim]
    k = module.key(hidden).view(*shape).transpose(1, 2)  # [batch, head, key, head_dim]
    scores = torch.matmul(q, k.transpose(2, 3)) * module.scaling
    return _masked(scores, kwargs.get("attention_mask")), module.scaling, module.attention_head_size


def _bloom_scores(module, args, kwargs):
    """BloomAttention.forward up to the softmax: ALiBi bias + q.k / sqrt(head_dim), then the mask."""
    hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
    alibi = kwargs["alibi"]
    batch, n_query, _ = hidden.shape
    q, k, _ = module._reshape(module.query_key_value(hidden))  # each [batch, head, n, head_dim]
    q = q.reshape(batch * module.num_heads, -1, module.head_dim)
    k = k.reshape(batch * module.num_heads, -1, module.head_dim).transpose(-1, -2)
    scores = alibi.baddbmm(batch1=q, batch2=k, beta=module.beta, alpha=module.inv_norm_factor)
    scores = scores.view(batch, module.num_heads, n_query, -1)
    return _masked(scores, kwargs.get("attention_mask")), module.inv_norm_factor, module.head_dim


_SCORES = {"LlamaAttention": _llama_scores, "GPT2Attention": _gpt2_scores, "BertSelfAttention": _bert_scores,
           "BloomAttention": _bloom_scores}


def _scores_function(module):
    fn = _SCORES.get(type(module).__name__)
    if fn is None:
        raise CaptureError(f"Pre-softmax scores are available for GPT-2, Llama, BLOOM and BERT attention, not for "
                           f"{type(module).__name__}. Capture the pattern only.")
    return fn


def _wanted_layers(layers, n_layers: int) -> list[int]:
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


def _n_heads(config) -> int:
    for key in ("num_attention_heads", "n_head"):
        value = getattr(config, key, None)
        if value:
            return int(value)
    raise CaptureError(f"Cannot tell how many heads {type(config).__name__} has.")


def _position_limit(config) -> int:
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if value:
            return int(value)
    return sys.maxsize  # ALiBi (BLOOM) has no learned limit


def _is_causal(model, module) -> bool:
    causal = getattr(module, "is_causal", None)
    if causal is not None:
        return bool(causal)
    return type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))


def _input_device(model) -> torch.device:
    try:
        return model.get_input_embeddings().weight.device
    except (AttributeError, NotImplementedError):
        return next(model.parameters()).device


def capture_to_bytes(capture: AttentionCapture, fmt: str = "npz") -> bytes:
    """The capture as a file: "npz" (numpy.load) or "safetensors" (safetensors.numpy.load; tokens and names in the
    metadata as JSON). Arrays: pattern [layer, head, query, key], token_ids, layers, kv_head_of, scores if any."""
    import io
    import json

    arrays = {"pattern": np.ascontiguousarray(capture.pattern),
              "token_ids": np.asarray(capture.token_ids, dtype=np.int64),
              "layers": np.asarray(capture.layers, dtype=np.int64),
              "kv_head_of": np.asarray(capture.kv_head_of, dtype=np.int64)}
    if capture.scores is not None:
        arrays["scores"] = np.ascontiguousarray(capture.scores)
    meta = {"tokens": capture.tokens, "model_name": capture.model_name, "causal": capture.causal,
            "scaling": capture.scaling, "head_dim": capture.head_dim}
    if fmt == "npz":
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays, meta=np.asarray(json.dumps(meta)))
        return buffer.getvalue()
    if fmt == "safetensors":
        from safetensors.numpy import save

        return save(arrays, metadata={"attnviz": json.dumps(meta)})
    raise CaptureError(f"Unknown export format {fmt!r}: use npz or safetensors.")


def save_capture(capture: AttentionCapture, path) -> None:
    """Writes capture_to_bytes to path; the format follows the suffix (.npz or .safetensors)."""
    from pathlib import Path

    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in ("npz", "safetensors"):
        raise CaptureError(f"Output file {path.name!r} must end in .npz or .safetensors.")
    path.write_bytes(capture_to_bytes(capture, fmt))


def load_capture(path) -> AttentionCapture:
    """Reads a file written by save_capture (either format) back into an AttentionCapture."""
    import json
    from pathlib import Path

    path = Path(path)
    if path.suffix.lower() == ".npz":
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(str(arrays.pop("meta")))
    else:
        from safetensors import safe_open
        from safetensors.numpy import load_file

        arrays = load_file(str(path))
        with safe_open(str(path), framework="numpy") as fh:
            meta = json.loads(fh.metadata()["attnviz"])
    return AttentionCapture(tokens=list(meta["tokens"]), token_ids=arrays["token_ids"].tolist(),
                            pattern=arrays["pattern"], layers=arrays["layers"].tolist(),
                            kv_head_of=arrays["kv_head_of"].tolist(), model_name=meta["model_name"],
                            causal=bool(meta["causal"]), scores=arrays.get("scores"), scaling=meta["scaling"],
                            head_dim=meta["head_dim"])
