"""capture_attention: runs a loaded model on a text under a recorder (attnviz.capture.recording) and turns what
each wanted layer saw into an AttentionCapture, after checking every argument against what the model and memory
allow.

In the qk store the forward pass runs torch's fused scaled_dot_product_attention, or attnviz.attention.layer_output
a block of rows at a time for soft-capped, sink and sliding-window layers (which SDPA cannot compute without an
N x N mask), or the caller's own attention (DuringForward.attend), which computes statistics on the way.

Threads: captures of one shared model from several sessions at once stay apart (see attnviz.capture.recording).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np
import torch

from attnviz import attention as core
from attnviz import shape
from attnviz.capture.frugal import lean_forward
from attnviz.capture.loading import records_inputs
from attnviz.capture.linear import kept_gates, linear_plan, recording_linear
from attnviz.capture.modules import (CaptureError, input_device, is_causal, is_language_model, numbered_attention,
                                     uses_interface)
from attnviz.capture.recording import Recorder, StopForward, recording, wanted_layers
from attnviz.capture.store import AttentionCapture
from attnviz.capture.words import token_words
from attnviz.during import DuringForward
from attnviz.tokenizer import readable_tokens
from attnviz import views

MAX_TOKENS = 2048  # the pattern store's default limit; the "qk" store goes to the model's own maximum
MAX_CAPTURE_BYTES = 2 * 1024**3  # the captured arrays must fit comfortably in memory
STORES = ("pattern", "qk")


def capture_attention(loaded, text: str, *, layers=None, store: str = "pattern", dtype=np.float32,
                      with_scores: bool = False, with_values: bool = False, max_tokens: int | None = None,
                      token_ids=None, progress: Callable[[int, int], None] | None = None,
                      during: DuringForward | None = None, with_logits: bool = False) -> AttentionCapture:
    """Runs `loaded` (an attnviz.models.LoadedModel) on `text` and returns every head of the chosen layers.

    layers: None for all, or an iterable of layer indices (negative counts from the end).
    store: "pattern" (dense [layer, head, query, key]), "qk" (only q, k and the rules; no N x N array) or "auto"
    (choose_store's pick for this text and every N x N map these layers would keep, dense_maps).
    dtype: np.float32 (exact) or np.float16 (half the memory) for the dense pattern.
    with_scores: require the pre-softmax scores (capture.scores / head_scores), computed now; refused for the
    families whose q and k are not recorded.
    with_values: also keep each wanted layer's value vectors (capture.values; families of the attention interface).
    max_tokens: the longest text accepted (default: MAX_TOKENS for the pattern store, the model's own maximum
    position for the qk store).
    token_ids: run on these token ids instead of tokenizing `text` (ids no text tokenizes into, such as the
    repeated random sequence of the induction test); `text` is then only a label and may be empty.
    progress: called as progress(layers_done, layers_wanted) while the forward pass runs.
    during: work done inside the forward pass (qk store; DuringForward).
    with_logits: a language model's next-token logits from the same forward pass (capture.logits, [n, vocab]
    float32: for short sequences, such as the induction test's), which then runs to the end: one pass where a
    capture and a loss would take two.
    """
    during = DuringForward() if during is None else during
    ids, attention_mask, words = _encoded(loaded, text, token_ids)
    numbered, plan = numbered_attention(loaded.model), linear_plan(loaded.model)
    wanted_all = model_layers(layers, numbered, plan)
    wanted = [i for i in wanted_all if i in numbered]
    module = next(iter(numbered.values()), None)
    dtype = np.dtype(dtype)
    recorded = module is not None and records_inputs(loaded.model, module)
    maps = dense_maps(loaded.model.config, wanted, wanted_all, plan)
    if store == "auto":  # no softmax attention (Mamba2): nothing to record, every store serves
        store = choose_store(loaded, int(ids.shape[1]), maps=maps, can_stream=recorded or module is None)[0]
    _check_request(loaded, module, store, dtype, recorded, with_scores, with_values, during)
    if with_logits and not is_language_model(loaded.model):
        raise CaptureError(f"{loaded.spec.name} is not a causal language model: it has no next-token logits.")
    _check_size(loaded, maps, int(ids.shape[1]), store, dtype.itemsize + (4 if with_scores else 0), max_tokens)
    recorder = Recorder(wanted=set(wanted), last=max(wanted_all), dtype=dtype, store=store,
                        layer_of={id(m): i for i, m in numbered.items()}, progress=progress,
                        on_layer=during.on_layer, keep_inputs=during.keep_inputs, attend=during.attend,
                        with_values=with_values, device_inputs=during.device_inputs and not during.keep_inputs,
                        stop=not with_logits)
    with recording_linear(loaded.model, plan) as (records, gates):
        out = _forward(loaded, recorder if numbered else None, ids, attention_mask, whole=with_logits)
    capture = _assembled(loaded, module, wanted, recorder, ids[0].tolist(), recorded, during.summary, words)
    capture.logits = out.logits[0].float().cpu() if with_logits else None
    if plan is not None:
        _add_linear(capture, plan, [i for i in wanted_all if i in plan.mapped], records, gates)
    if with_scores:
        capture.scores  # computed now, while the caller waits for the capture anyway
    return capture


def _check_request(loaded, module, store: str, dtype, recorded: bool, with_scores: bool, with_values: bool,
                   during: DuringForward) -> None:
    """Refuses what this model or this store cannot do, with a message that says what to do instead."""
    name = loaded.spec.name
    if store not in STORES:
        raise CaptureError(f"Unknown store {store!r}: use 'pattern' or 'qk'.")
    if module is None:  # no softmax attention (Mamba2): only the linear mixers' maps
        if with_scores or with_values:
            raise CaptureError(f"{name} has no softmax attention: it has no scores or value vectors to keep.")
        return
    if getattr(loaded.model.config, "is_encoder_decoder", False):
        raise CaptureError(f"{name} is an encoder-decoder model; attnviz captures decoder-only and encoder-only "
                           "models.")
    if dtype not in (np.dtype(np.float32), np.dtype(np.float16)):
        raise CaptureError(f"Patterns are stored as float32 or float16, not {dtype}.")
    if with_values and not (uses_interface(module) and recorded):
        raise CaptureError(f"{name} ({type(module).__name__}) does not dispatch through transformers' attention "
                           "interface, so attnviz cannot record its value vectors.")
    if (with_scores or store == "qk") and not recorded:
        raise CaptureError(f"{name} ({type(module).__name__}) does not dispatch through transformers' attention "
                           "interface, so attnviz cannot record its query and key vectors: its scores and the "
                           "long-text store are not available. Capture the pattern only.")
    if not during.keep_inputs and (store != "qk" or with_scores):
        raise CaptureError("keep_inputs=False goes with store='qk' and without scores.")
    if during.attend is not None and store != "qk":
        raise CaptureError("attend= goes with store='qk'.")


def _encoded(loaded, text: str, token_ids) -> tuple[torch.Tensor, torch.Tensor, list[int] | None]:
    """[1, n] input ids, attention mask, and each token's word (attnviz.capture.words.token_words, from a fast
    tokenizer's offsets; None for token_ids given or a tokenizer without offsets): token_ids as given, else the text
    tokenized."""
    words = None
    if token_ids is not None:
        ids = torch.as_tensor([int(t) for t in token_ids], dtype=torch.long).reshape(1, -1)
        attention_mask = torch.ones_like(ids)
    elif not isinstance(text, str) or not text.strip():
        raise CaptureError("The text is empty: type some text to run the model on.")
    else:
        tokenizer = loaded.tokenizer
        fast = bool(getattr(tokenizer, "is_fast", False))
        encoded = tokenizer(text, return_tensors="pt", return_offsets_mapping=fast)
        ids, attention_mask = encoded.input_ids, encoded.attention_mask
        if fast:
            special = set(tokenizer.all_special_ids)
            words = token_words(text, encoded["offset_mapping"][0].tolist(), [i in special for i in ids[0].tolist()])
    if ids.shape[1] == 0:
        raise CaptureError(f"{loaded.spec.name}'s tokenizer turned the text into no tokens; try another text or "
                           "check the model folder's tokenizer files.")
    return ids, attention_mask, words


def _check_size(loaded, maps: int, n: int, store: str, itemsize: int, max_tokens: int | None) -> None:
    """Refuses a text longer than the model's positions (or max_tokens), and a dense pattern store whose `maps` N x N
    maps (dense_maps: the linear mixers' included) would pass MAX_CAPTURE_BYTES, saying how many heads' maps fit."""
    position_limit = shape.position_limit(loaded.model.config)
    limit = min(position_limit, (MAX_TOKENS if store == "pattern" else position_limit) if max_tokens is None
                else max_tokens)
    if n > limit:
        raise CaptureError(f"The text is {n:,} tokens long; the limit for {loaded.spec.name} here is {limit:,} "
                           "tokens. Shorten the text.")
    need = pattern_bytes(1, maps, n, itemsize)
    if store == "pattern" and need > MAX_CAPTURE_BYTES:
        n_heads = shape.n_heads(loaded.model.config)
        fit = max(0, MAX_CAPTURE_BYTES // max(1, pattern_bytes(1, n_heads, n, itemsize)))
        raise CaptureError(f"Capturing {maps} heads' maps of {n:,}² weights needs {need / 2**30:.1f} GiB (limit "
                           f"{MAX_CAPTURE_BYTES / 2**30:.0f} GiB); {fit} layers of {n_heads} heads would fit. Pick "
                           "fewer layers or a shorter text, or use the long-text store (store='qk'), which never "
                           "builds the N x N arrays.")


def _forward(loaded, recorder: Recorder | None, ids: torch.Tensor, attention_mask: torch.Tensor, *,
             whole: bool = False):
    """The base model's forward pass under the recorder (None: a model without attention), stopped after the
    last wanted layer (whole: the whole model's, to its output); a model that fails on this text gives a message,
    not a traceback. Returns the model's output (None when stopped)."""
    model = loaded.model
    runner = model if whole else getattr(model, "base_model", model)
    device = input_device(model)
    watching = recording(model, recorder) if recorder is not None else contextlib.nullcontext()
    with watching, lean_forward(model), torch.inference_mode():  # MLPs in blocks: frugal
        try:
            return runner(input_ids=ids.to(device), attention_mask=attention_mask.to(device), use_cache=False)
        except StopForward:
            return None
        except CaptureError:
            raise
        except Exception as exc:  # a user's model that cannot run this text: a message, not a traceback
            raise CaptureError(f"{loaded.spec.name} failed on this text: {type(exc).__name__}: {exc}") from exc


def _assembled(loaded, module, wanted: list[int], recorder: Recorder, ids: list[int], recorded: bool,
               summary: dict | None, words: list[int] | None) -> AttentionCapture:
    """The AttentionCapture of what the recorder kept, once every wanted layer reported."""
    store, config = recorder.store, loaded.model.config
    got = recorder.pattern if store == "pattern" else recorder.seen
    missing = [i for i in wanted if i not in got]
    if missing:
        raise CaptureError(f"{loaded.spec.name} did not return attention weights for layers {missing}.")
    return AttentionCapture(
        tokens=readable_tokens(loaded.tokenizer, ids), token_ids=ids, layers=list(wanted),
        # the sharing attention itself used where q and k were recorded; else the config's
        kv_head_of=list(recorder.kv_head_of) if recorded else core.kv_head_of(shape.n_heads(config),
                                                                              shape.n_kv_heads(config)),
        model_name=loaded.spec.name, causal=is_causal(loaded.model, module), store=store,
        pattern=(np.stack([recorder.pattern[i] for i in wanted]) if wanted else
                 np.zeros((0, shape.n_heads(config), len(ids), len(ids)), recorder.dtype)) if store == "pattern"
        else None,
        inputs={i: recorder.inputs[i] for i in wanted} if recorded and recorder.keep_inputs else None,
        values={i: recorder.values[i] for i in wanted} if recorder.with_values else None,
        summary=summary, token_words=words)


def model_layers(layers, numbered: dict, plan) -> list[int]:
    """The model layers a capture of `layers` (None: all) covers: its softmax layers (numbered: {layer: attention
    module}) and the linear mixers with an exact map (plan: attnviz.capture.linear.LinearPlan). Negative numbers
    count from the end. Layers of a kind attnviz does not map are left out (the capture names them, skipped); a
    request of such layers only is refused by name."""
    kinds = plan.kinds if plan is not None else ()
    available = sorted(set(numbered) | set(plan.mapped if plan is not None else ()))
    if not kinds:
        return [available[i] for i in wanted_layers(layers, len(available))]
    if layers is None:
        return available
    asked = wanted_layers(layers, len(kinds))
    picked = [i for i in asked if i in available]
    if not picked:
        named = ", ".join(f"{i} ({kinds[i]})" for i in asked)
        raise CaptureError(f"attnviz does not map layer{'s' if len(asked) > 1 else ''} {named} exactly; pick among "
                           f"layers {shape.spans(available)}.")
    return picked


def _add_linear(capture: AttentionCapture, plan, wanted_linear: list[int], records: dict, gates: dict) -> None:
    """The linear mixers' records, the gates and the kinds, added to a capture; in the pattern store an empty dict
    of maps, each built from its record when first read (attnviz.capture.linear.map_rows)."""
    missing = [i for i in wanted_linear if i not in records]
    if missing:
        raise CaptureError(f"The linear mixers of layers {missing} did not run transformers' reference kernel, so "
                           "attnviz has no exact map of them.")
    capture.layer_kinds = plan.kinds
    capture.mixers = {i: records[i] for i in wanted_linear}
    capture.maps = {} if capture.store == "pattern" else None  # each map built when first read (linear.map_rows)
    capture.gates = kept_gates(gates, capture.layers)
    capture.skipped = dict(plan.skipped)


def choose_store(loaded, n_tokens: int, layers=None, limit_bytes: int | None = None, *,
                 can_stream: bool | None = None, maps: int | None = None) -> tuple[str, str]:
    """(store, why) for a capture of `layers` (None: all; read as capture_attention reads them) of a text of n_tokens:
    the pattern store while every N x N map it would keep (dense_maps) fits MAX_CAPTURE_BYTES (and limit_bytes) and
    the text MAX_TOKENS, else the qk store where the family records q and k (attnviz.views.choose_store says why).
    The one rule for store="auto": capture_attention and the app's pages both ask here.
    maps, can_stream: dense_maps and records_inputs, when the caller has already read them off the model."""
    limit = MAX_CAPTURE_BYTES if limit_bytes is None else min(MAX_CAPTURE_BYTES, limit_bytes)
    maps = maps_of(loaded, layers) if maps is None else maps
    can_stream = records_inputs(loaded.model) if can_stream is None else can_stream
    return views.choose_store(1, maps, n_tokens, limit_bytes=limit, can_stream=can_stream,  # maps x N x N
                              max_dense_tokens=MAX_TOKENS)


def maps_of(loaded, layers=None) -> int:
    """dense_maps of a capture of `layers` (None: all; read as capture_attention reads them), read off the model."""
    numbered, plan = numbered_attention(loaded.model), linear_plan(loaded.model)
    wanted_all = model_layers(layers, numbered, plan)
    return dense_maps(loaded.model.config, [i for i in wanted_all if i in numbered], wanted_all, plan)


def dense_maps(config, softmax: list[int], layers: list[int], plan) -> int:
    """How many N x N maps the pattern store keeps for a capture of model layers `layers`: every head of each softmax
    layer among them, and every head of each linear mixer with a map (plan: attnviz.capture.linear.LinearPlan), at
    the mixer's own heads (a gated delta rule's value heads, Mamba2's heads, Falcon-H1's Mamba2 beside its
    attention). The pattern store keeps a linear map whole, float32, once read (attnviz.capture.linear.map_rows),
    so it weighs as a softmax layer's pattern; the qk store keeps only the kernel's record."""
    n_heads = shape.n_heads(config)
    mixers = [plan.mapped[i] for i in layers if i in plan.mapped] if plan is not None else []
    return len(softmax) * n_heads + sum(shape.layer_sizes(config, _MAP_KIND.get(kind, kind))[0] or n_heads
                                        for kind in mixers)


_MAP_KIND = {"softmax + mamba2": "mamba2"}  # the layer's map is its Mamba2 mixer's; its attention is counted apart


def pattern_bytes(n_layers: int, n_heads: int, n_tokens: int, itemsize: int = 4) -> int:
    """Bytes of a dense [layer, head, query, key] pattern."""
    return n_layers * n_heads * n_tokens * n_tokens * itemsize


def inputs_bytes(config, n_layers: int, n_tokens: int) -> int:
    """Bytes the qk store holds for n_layers layers of n_tokens: float32 q [head, n, d] and k [kv_head, n, d]."""
    return n_layers * n_tokens * shape.qk_head_dim(config) * (shape.n_heads(config) + shape.n_kv_heads(config)) * 4
