"""Capture of what every attention layer saw (q, k, the mask, scaling, soft-cap, bias and learned sinks), and every
head's pattern and scores computed from it exactly, for any transformers family.

How it works: attnviz.recording (the registered attention function, the hooks of the other families and the
per-thread recorder) records what each wanted layer saw; this module turns that into an AttentionCapture.

Two stores, one API:
- store="pattern": the dense pattern [layer, head, query, key], from the model's own eager weights (equal to
  output_attentions bit for bit), plus the layer inputs.
- store="qk": only the layer inputs, O(N d) per layer; no N x N array is ever built for the whole model. The
  forward pass runs torch's fused scaled_dot_product_attention (or attnviz.attention.layer_output, a block of rows
  at a time, for soft-capped and sink families that SDPA cannot compute).
In both, capture.head_pattern(layer, head, rows) and capture.head_scores(...) return exact values, computed by
attnviz.attention from the layer inputs (or read from the dense pattern).

Threads: captures of one shared model from several sessions at once stay apart (see attnviz.recording).

The front door for a notebook or a script is capture() (the module itself is callable, so attnviz.capture(model,
text, ...) is capture(model, text, ...)): a model by name, folder or GGUF file, or a transformers model object that
is lent back unchanged; from_attentions() makes a capture of any tool's output_attentions.

Over 300 lines on purpose: AttentionCapture's map methods (both stores) and capture_attention's checks of every
argument are the one public surface of capture.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from attnviz import attention as core
from attnviz import shape
from attnviz.attention import LayerInputs
from attnviz.frugal import lean_forward
from attnviz.recording import (  # noqa: F401  (re-exported: capture's public names)
    ATTN_IMPLEMENTATION, CaptureError, _records_inputs, _Recorder, _StopForward, _wanted_layers, attention_modules,
    borrowed, prepare_model, records_inputs, recording, recording_forward, uses_interface)
from attnviz.tokenizer import _BYTE_OF

MAX_TOKENS = 2048  # the pattern store's default limit; the "qk" store goes to the model's own maximum
MAX_CAPTURE_BYTES = 2 * 1024**3  # the captured arrays must fit comfortably in memory
STORES = ("pattern", "qk")


@dataclass
class AttentionCapture:
    """Every captured head of one forward pass over one text.

    tokens:     list[str], one readable string per token (spaces shown as ␣, newlines as ↵, tabs as ⇥)
    token_ids:  list[int], the ids the model saw
    layers:     list[int], the model layer of each captured layer, in order
    kv_head_of: list[int], for each query head, the key/value head it reads (GQA/MQA; identity for MHA)
    model_name: the registry name or path of the model
    causal:     True when a query never attends to later keys
    store:      "pattern" (dense weights kept) or "qk" (only what attention saw)
    pattern:    [layer, head, query, key] attention weights, in the pattern store (None in the qk store)
    inputs:     {model layer: attnviz.attention.LayerInputs}: what each layer's attention saw (every family: BLOOM,
                Falcon and GPT-J have theirs rebuilt by hooks), or None when the capture was asked not to keep them
                (keep_inputs=False)
    Read maps with head_pattern / head_scores / layer_rows, which work in both stores; `layer` is always the
    model's layer number.
    """

    tokens: list[str]
    token_ids: list[int]
    layers: list[int]
    kv_head_of: list[int]
    model_name: str
    causal: bool
    store: str = "pattern"
    pattern: np.ndarray | None = None
    inputs: dict[int, LayerInputs] | None = None
    # {model layer: [kv_head, key, d_v] float32 value vectors}, with capture_attention(with_values=True)
    values: dict[int, torch.Tensor] | None = None
    _scores: np.ndarray | None = field(default=None, repr=False)
    _sink: np.ndarray | None = field(default=None, repr=False)
    _saved: dict = field(default_factory=dict, repr=False)  # scaling and head_dim of a capture read from a file
    # {layer: attnviz.stats.streamed_stats result}, when the statistics were computed during the forward pass
    summary: dict | None = field(default=None, repr=False)

    # -- shape --
    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def n_heads(self) -> int:
        return len(self.kv_head_of)

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def head_dim(self) -> int | None:
        return self._saved.get("head_dim") if not self.inputs else next(iter(self.inputs.values())).head_dim

    @property
    def scaling(self) -> float | None:
        """The factor q.k is multiplied by, when every captured layer uses the same one (else None)."""
        if not self.inputs:
            return self._saved.get("scaling")
        values = {x.scaling for x in self.inputs.values()}
        return values.pop() if len(values) == 1 else None

    @property
    def has_scores(self) -> bool:
        return bool(self.inputs)

    def index_of(self, layer: int) -> int:
        """The position of model layer `layer` among the captured layers."""
        try:
            return self.layers.index(int(layer))
        except ValueError:
            raise CaptureError(f"Layer {layer} was not captured (captured: {self.layers}).") from None

    def _inputs(self, layer: int) -> LayerInputs:
        if not self.inputs or int(layer) not in self.inputs:
            raise CaptureError(f"{self.model_name}: the query and key vectors of layer {layer} were not recorded "
                               "(this family's attention does not go through transformers' attention interface), "
                               "so its scores are not available. Its pattern is.")
        return self.inputs[int(layer)]

    # -- maps --
    def layer_rows(self, layer: int, start: int = 0, stop: int | None = None, *, heads=None) -> np.ndarray:
        """Attention weights of every head (or `heads`) of `layer` for queries start .. stop - 1: [head, rows, key],
        float32 (the dense store's dtype in the pattern store)."""
        stop = self.n_tokens if stop is None else stop
        if self.pattern is not None:
            block = self.pattern[self.index_of(layer), :, start:stop]
            return block if heads is None else block[list(heads)]
        weights, _ = core.layer_pattern(self._inputs(layer), start, stop, heads=heads, key_end=self.n_tokens)
        return weights.numpy()

    def head_pattern(self, layer: int, head: int, rows=None) -> np.ndarray:
        """One head's weights [rows, key] (rows: None for all queries, a slice, or (start, stop))."""
        start, stop = _row_range(rows, self.n_tokens)
        return self.layer_rows(layer, start, stop, heads=[head])[0]

    def head_scores(self, layer: int, head: int, rows=None) -> np.ndarray:
        """One head's softmax logits [rows, key], float32: q.k * scaling, soft-capped, plus bias, -inf masked."""
        start, stop = _row_range(rows, self.n_tokens)
        return core.layer_scores(self._inputs(layer), start, stop, heads=[head], key_end=self.n_tokens)[0].numpy()

    def head_sink(self, layer: int, head: int) -> np.ndarray | None:
        """The weight each query gives the head's learned sink logit [query], or None without sinks."""
        sinks = self.learned_sink
        return None if sinks is None else sinks[self.index_of(layer), head]

    @property
    def scores(self) -> np.ndarray | None:
        """Every captured head's logits [layer, head, query, key] float32 (-inf where masked), or None when q and
        k were not recorded. Built on first use; needs 4 bytes per weight."""
        if self._scores is None and self.inputs:
            self._scores = np.stack([core.layer_scores(self.inputs[layer], key_end=self.n_tokens).numpy()
                                     for layer in self.layers])
        return self._scores

    @property
    def learned_sink(self) -> np.ndarray | None:
        """[layer, head, query]: the weight each query gives the model's learned sink logit (gpt-oss), or None for
        a model without one. Each row of the pattern plus its learned_sink sums to 1."""
        if not self.inputs or all(x.sink is None for x in self.inputs.values()):
            return None
        if self._sink is None:
            out = np.zeros((self.n_layers, self.n_heads, self.n_tokens), dtype=np.float32)
            for i, layer in enumerate(self.layers):
                x = self.inputs[layer]
                if x.sink is None:
                    continue
                for a in range(0, self.n_tokens, 256):
                    b = min(self.n_tokens, a + 256)
                    _, sink = core.layer_pattern(x, a, b)
                    out[i, :, a:b] = sink.numpy()
            self._sink = out
        return self._sink

    def select(self, layers) -> "AttentionCapture":
        """The same capture restricted to some of its layers (model layer numbers), sharing its arrays: narrowing
        the layers needs no new forward pass."""
        layers = sorted({int(i) for i in layers})
        index = [self.index_of(i) for i in layers]
        return AttentionCapture(
            tokens=self.tokens, token_ids=self.token_ids, layers=layers, kv_head_of=self.kv_head_of,
            model_name=self.model_name, causal=self.causal, store=self.store,
            pattern=None if self.pattern is None else self.pattern[index],
            inputs=None if self.inputs is None else {i: self.inputs[i] for i in layers},
            values=None if self.values is None else {i: self.values[i] for i in layers},
            _scores=None if self._scores is None else self._scores[index],
            _sink=None if self._sink is None else self._sink[index], _saved=dict(self._saved),
            summary=None if self.summary is None else {i: self.summary[i] for i in layers})

    def inputs_nbytes(self) -> int:
        return sum(x.nbytes() for x in (self.inputs or {}).values())

    # -- for a notebook --
    def stats(self):
        """Every captured head's statistics as a pandas DataFrame, one row per (layer, head): attnviz.stats."""
        from attnviz.stats import head_stats

        return head_stats(self)

    def save(self, path) -> None:
        """Writes the capture to path, .npz or .safetensors (attnviz.capture_io; read back with load_capture)."""
        from attnviz.capture_io import save_capture

        save_capture(self, path)

    def to_attentions(self) -> tuple[torch.Tensor, ...]:
        """The captured layers' weights in the format of transformers' output_attentions (and bertviz's head_view
        and model_view): a tuple with one [1, head, query, key] tensor per captured layer, in order. In the qk
        store each layer's weights are computed from q and k here (4 bytes per weight)."""
        return tuple(torch.from_numpy(np.ascontiguousarray(self.layer_rows(layer)))[None] for layer in self.layers)

    # -- notebook views (attnviz.notebook): each draws in a notebook with no network; see its options there --
    def show(self, *, hide_sink: bool = False, gamma: float = 0.5):
        """The grid of all captured heads, as a View a notebook draws (attnviz.notebook.grid_view)."""
        from attnviz import notebook

        return notebook.grid_view(self, hide_sink=hide_sink, gamma=gamma)

    def head_view(self, layer: int | None = None, head: int = 0, **options):
        """One head's map; a long text's max-pooled overview and an exact zoom window (notebook.head_view)."""
        from attnviz import notebook

        return notebook.head_view(self, layer, head, **options)

    def token_view(self, query: int | None = None, **options):
        """Where one query token looks, one row per head (attnviz.notebook.token_view)."""
        from attnviz import notebook

        return notebook.token_view(self, query, **options)

    def text_view(self, layer: int | None = None, head: int = 0, query: int | None = None, **options):
        """The text shaded by the weight one query of one head gives each token (attnviz.notebook.text_view)."""
        from attnviz import notebook

        return notebook.text_view(self, layer, head, query, **options)

    def to_html(self, path, layer: int | None = None, head: int = 0, query: int | None = None, **options):
        """Writes the four views on one standalone page that needs no network; returns its path
        (attnviz.notebook.page_view)."""
        from attnviz import notebook

        return notebook.page_view(self, layer, head, query, **options).to_html(path)


def _row_range(rows, n: int) -> tuple[int, int]:
    if rows is None:
        return 0, n
    if isinstance(rows, slice):
        start, stop, step = rows.indices(n)
        if step != 1:
            raise CaptureError("Rows must be a contiguous range.")
        return start, stop
    start, stop = rows
    return max(0, int(start)), min(n, int(stop))


def pattern_bytes(n_layers: int, n_heads: int, n_tokens: int, itemsize: int = 4) -> int:
    """Bytes of a dense [layer, head, query, key] pattern."""
    return n_layers * n_heads * n_tokens * n_tokens * itemsize


def inputs_bytes(config, n_layers: int, n_tokens: int) -> int:
    """Bytes the qk store holds for n_layers layers of n_tokens: float32 q [head, n, d] and k [kv_head, n, d]."""
    return n_layers * n_tokens * shape.qk_head_dim(config) * (shape.n_heads(config) + shape.n_kv_heads(config)) * 4


def capture_attention(loaded, text: str, *, layers=None, dtype=np.float32, with_scores: bool = False,
                      max_tokens: int | None = None, store: str = "pattern",
                      progress: Callable[[int, int], None] | None = None,
                      on_layer: Callable[[int, LayerInputs], None] | None = None,
                      keep_inputs: bool = True,
                      attend: Callable[[int, LayerInputs, torch.Tensor], torch.Tensor] | None = None,
                      with_values: bool = False, token_ids=None) -> AttentionCapture:
    """Runs `loaded` (an attnviz.models.LoadedModel) on `text` and returns every head of the chosen layers.

    token_ids: run on these token ids instead of tokenizing `text` (ids no text tokenizes into, such as the
    repeated random sequence of the induction test); `text` is then only a label and may be empty.

    layers: None for all, or an iterable of layer indices (negative counts from the end).
    dtype: np.float32 (exact) or np.float16 (half the memory) for the dense pattern.
    with_scores: require the pre-softmax scores (capture.scores / head_scores); refused for the families whose q
    and k are not recorded.
    store: "pattern" (dense [layer, head, query, key]) or "qk" (only q, k and the rules; no N x N array).
    max_tokens: the longest text accepted (default: MAX_TOKENS for the pattern store, the model's own maximum
    position for the qk store).
    progress: called as progress(layers_done, layers_wanted) while the forward pass runs.
    on_layer: called as on_layer(layer, inputs) as soon as a wanted layer's inputs are recorded, during the forward
    pass (the command line's statistics are computed there). keep_inputs=False then drops each layer's inputs
    after on_layer (memory O(one layer); the capture returned has no inputs, so no maps, only tokens).
    attend (qk store, families of the attention interface): attend(layer, inputs, v [kv_head, n, d_v]) returns
    the wanted layer's attention output [head, n, d_v]; it replaces SDPA there, so a caller that computes the
    weights block by block anyway (attnviz.stats.streamed_stats with values=) computes the scores once for both.
    with_values: also keep each wanted layer's value vectors (capture.values; families of the attention interface).
    """
    if store not in STORES:
        raise CaptureError(f"Unknown store {store!r}: use 'pattern' or 'qk'.")
    if token_ids is None and (not isinstance(text, str) or not text.strip()):
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
    recorded = _records_inputs(model, modules[0])
    if with_values and not (uses_interface(modules[0]) and recorded):
        raise CaptureError(f"{loaded.spec.name} ({type(modules[0]).__name__}) does not dispatch through "
                           "transformers' attention interface, so attnviz cannot record its value vectors.")
    if (with_scores or store == "qk") and not recorded:
        raise CaptureError(f"{loaded.spec.name} ({type(modules[0]).__name__}) does not dispatch through "
                           "transformers' attention interface, so attnviz cannot record its query and key vectors: "
                           "its scores and the long-text store are not available. Capture the pattern only.")

    if token_ids is not None:
        ids = torch.as_tensor([int(t) for t in token_ids], dtype=torch.long).reshape(1, -1)
        attention_mask = torch.ones_like(ids)
    else:
        encoded = tokenizer(text, return_tensors="pt")
        ids, attention_mask = encoded.input_ids, encoded.attention_mask
    n = int(ids.shape[1])
    if n == 0:
        raise CaptureError(f"{loaded.spec.name}'s tokenizer turned the text into no tokens; try another text or "
                           "check the model folder's tokenizer files.")
    position_limit = shape.position_limit(model.config)
    limit = min(position_limit, (MAX_TOKENS if store == "pattern" else position_limit) if max_tokens is None
                else max_tokens)
    if n > limit:
        raise CaptureError(f"The text is {n:,} tokens long; the limit for {loaded.spec.name} here is {limit:,} "
                           "tokens. Shorten the text.")
    n_heads = shape.n_heads(model.config)
    if store == "pattern":
        need = pattern_bytes(len(wanted), n_heads, n, dtype.itemsize + (4 if with_scores else 0))
        if need > MAX_CAPTURE_BYTES:
            fit = max(0, MAX_CAPTURE_BYTES // max(1, pattern_bytes(1, n_heads, n, dtype.itemsize +
                                                                    (4 if with_scores else 0))))
            raise CaptureError(f"Capturing {len(wanted)} layers x {n_heads} heads x {n:,}² weights needs "
                               f"{need / 2**30:.1f} GiB (limit {MAX_CAPTURE_BYTES / 2**30:.0f} GiB); {fit} layers "
                               "would fit. Pick fewer layers or a shorter text, or use the long-text store "
                               "(store='qk'), which never builds the N x N arrays.")

    if not keep_inputs and (store != "qk" or with_scores):
        raise CaptureError("keep_inputs=False goes with store='qk' and without scores.")
    if attend is not None and store != "qk":
        raise CaptureError("attend= goes with store='qk'.")
    recorder = _Recorder(wanted=set(wanted), last=max(wanted), dtype=dtype, store=store,
                         layer_of={id(m): i for i, m in enumerate(modules)}, progress=progress, on_layer=on_layer,
                         keep_inputs=keep_inputs, attend=attend, with_values=with_values)
    runner = getattr(model, "base_model", model)
    device = _input_device(model)
    with recording(model, recorder), lean_forward(model), torch.inference_mode():  # MLPs in blocks: frugal
        try:
            runner(input_ids=ids.to(device), attention_mask=attention_mask.to(device), use_cache=False)
        except _StopForward:
            pass
        except CaptureError:
            raise
        except Exception as exc:  # a user's model that cannot run this text: a message, not a traceback
            raise CaptureError(f"{loaded.spec.name} failed on this text: {type(exc).__name__}: {exc}") from exc
    got = recorder.pattern if store == "pattern" else recorder.seen
    missing = [i for i in wanted if i not in got]
    if missing:
        raise CaptureError(f"{loaded.spec.name} did not return attention weights for layers {missing}.")
    capture = AttentionCapture(
        tokens=readable_tokens(tokenizer, ids[0].tolist()),
        token_ids=ids[0].tolist(),
        layers=list(wanted),
        # the sharing attention itself used where q and k were recorded; else the config's
        kv_head_of=list(recorder.kv_head_of) if recorded else kv_head_of(model.config),
        model_name=loaded.spec.name,
        causal=is_causal(model, modules[0]),
        store=store,
        pattern=np.stack([recorder.pattern[i] for i in wanted]) if store == "pattern" else None,
        inputs={i: recorder.inputs[i] for i in wanted} if recorded and keep_inputs else None,
        values={i: recorder.values[i] for i in wanted} if with_values else None,
    )
    if with_scores:
        capture.scores
    return capture


def kv_head_of(config) -> list[int]:
    """For each query head, the key/value head it reads: query head h uses KV head h // (n_heads / n_kv_heads)."""
    return core.kv_head_of(shape.n_heads(config), shape.n_kv_heads(config))


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


def is_causal(model, module) -> bool:
    """Whether this attention module (of this model) is causal: its is_causal flag, else the model class."""
    causal = getattr(module, "is_causal", None)
    if causal is not None:
        return bool(causal)
    return type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))


def _input_device(model) -> torch.device:
    try:
        return model.get_input_embeddings().weight.device
    except (AttributeError, NotImplementedError):
        return next(model.parameters()).device


def from_attentions(attentions, tokens, *, token_ids=None, model_name: str = "attentions") -> AttentionCapture:
    """A pattern-store capture of attention weights from any tool, in the format of transformers' output_attentions:
    one [1, head, query, key] tensor or array per layer (layers numbered 0, 1, ... in that order).

    tokens: one string per token. token_ids: the ids the model saw (the induction statistic compares them); by
    default equal strings get equal ids. The format does not say which key/value head a head reads, so kv_head_of
    is the identity; the capture is causal when every weight above the diagonal is 0."""
    tokens = [str(t) for t in tokens]
    weights = [_layer_weights(a, len(tokens)) for a in attentions]
    if not weights:
        raise CaptureError("No layers: give one [1, head, query, key] tensor per layer.")
    if len({w.shape for w in weights}) != 1:
        raise CaptureError(f"Every layer must have the same heads; got {sorted({w.shape[0] for w in weights})}.")
    if token_ids is None:
        first: dict[str, int] = {}
        token_ids = [first.setdefault(t, len(first)) for t in tokens]
    token_ids = [int(i) for i in token_ids]
    if len(token_ids) != len(tokens):
        raise CaptureError(f"{len(token_ids)} token ids for {len(tokens)} tokens.")
    pattern = np.stack(weights)
    return AttentionCapture(tokens=tokens, token_ids=token_ids, layers=list(range(len(weights))),
                            kv_head_of=list(range(pattern.shape[1])), model_name=model_name,
                            causal=not np.triu(pattern, 1).any(), store="pattern", pattern=pattern)


def _layer_weights(weights, n: int) -> np.ndarray:
    """One layer's [1, head, n, n] (or [head, n, n]) weights as a float32 [head, n, n] array."""
    if isinstance(weights, torch.Tensor):
        weights = weights.detach().float().cpu().numpy()
    x = np.asarray(weights, dtype=np.float32)
    if x.ndim == 4 and x.shape[0] == 1:
        x = x[0]
    if x.ndim != 3 or x.shape[1:] != (n, n):
        raise CaptureError(f"Each layer's weights must be [1, head, query, key] with one query and one key per token "
                           f"({n} tokens); got {list(np.shape(weights))}.")
    return np.ascontiguousarray(x)


def capture(model, text: str, *, tokenizer=None, layers=None, store: str = "auto") -> AttentionCapture:
    """The front door, also called as attnviz.capture(model, text, ...): every head of `layers` (None: all,
    negative counts from the end) on `text`.

    model: a registry name (attnviz.models.available_models()), a folder, a .gguf file or a cached hub id, loaded
    by attnviz.models.load_model; an attnviz LoadedModel; or a transformers model object, with its `tokenizer`. A
    model object is lent, not changed: afterwards its attention implementation, its training flags and so its
    outputs are what they were (recording.borrowed).
    store: "pattern" (the dense weights), "qk" (only q and k, for any length) or "auto": the pattern while it fits
    (MAX_TOKENS tokens, MAX_CAPTURE_BYTES), else "qk" where the family records q and k."""
    from attnviz.models import LoadedModel, ModelSpec, load_model

    if isinstance(model, (str, os.PathLike)):
        if tokenizer is not None:
            raise CaptureError("tokenizer= goes with a model object: a model given by name brings its own.")
        return _capture_loaded(load_model(os.fspath(model)), text, layers, store)
    if isinstance(model, LoadedModel):
        return _capture_loaded(model, text, layers, store)
    if not hasattr(model, "config") or not isinstance(model, torch.nn.Module):
        raise CaptureError("model must be a model name, a folder, a .gguf file or a transformers model object.")
    if tokenizer is None:
        raise CaptureError("A model object needs its tokenizer: attnviz.capture(model, text, tokenizer=tokenizer).")
    name = getattr(model.config, "name_or_path", "") or type(model).__name__
    spec = ModelSpec(name, getattr(model.config, "model_type", ""), "object", True, None,
                     "a model object handed to attnviz.capture")
    with borrowed(model):
        return _capture_loaded(LoadedModel(model=model, tokenizer=tokenizer, spec=spec), text, layers, store)


def _capture_loaded(loaded, text: str, layers, store: str) -> AttentionCapture:
    if store == "auto":
        store = _auto_store(loaded, text, layers)
    return capture_attention(loaded, text, layers=layers, store=store)


def _auto_store(loaded, text: str, layers) -> str:
    """The pattern store while [layer, head, n, n] fits MAX_CAPTURE_BYTES and MAX_TOKENS, else the qk store where
    the family records q and k (attnviz.views.choose_store)."""
    from attnviz.views import choose_store

    if not isinstance(text, str) or not text.strip():
        return "pattern"  # capture_attention says what is wrong with the text
    model = loaded.model
    n_layers = len(_wanted_layers(layers, len(attention_modules(model))))
    n_tokens = len(loaded.tokenizer(text).input_ids)
    store, _ = choose_store(n_layers, shape.n_heads(model.config), n_tokens, limit_bytes=MAX_CAPTURE_BYTES,
                            can_stream=records_inputs(model), max_dense_tokens=MAX_TOKENS)
    return store


class _FrontDoor(types.ModuleType):
    """This module, callable: attnviz.capture(model, text, ...) is attnviz.capture.capture(model, text, ...)."""

    def __call__(self, model, text: str, *, tokenizer=None, layers=None, store: str = "auto") -> AttentionCapture:
        return capture(model, text, tokenizer=tokenizer, layers=layers, store=store)

    __call__.__doc__ = capture.__doc__


# `attnviz.capture` names this module (every `from attnviz.capture import ...` needs it), and the front door too.
sys.modules[__name__].__class__ = _FrontDoor
