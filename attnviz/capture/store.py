"""AttentionCapture: every captured head of one forward pass over one text, and its patterns and scores computed
exactly from what each layer saw; from_attentions() makes one of any tool's output_attentions.

Two stores, one API:
- store="pattern": the dense pattern [layer, head, query, key], from the model's own eager weights (equal to
  output_attentions bit for bit), plus the layer inputs.
- store="qk": only the layer inputs, O(N d) per layer; no N x N array is ever built for the whole model.
In both, capture.head_pattern(layer, head, rows) and capture.head_scores(...) return exact values, computed by
attnviz.attention from the layer inputs (or read from the dense pattern). A capture is shared by every session that
asks for it: its arrays are read-only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from attnviz import attention as core
from attnviz.attention import LayerInputs
from attnviz.capture import linear
from attnviz.capture.words import query_positions, runs
from attnviz.capture.modules import CaptureError

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
    token_words: list[int], each token's word number (attnviz.capture.words.token_words, from the tokenizer's
                offsets at capture time), or None where they were not known
    word_spans: in a by_words capture, each word's tokens in the capture it was merged from, (start, stop); else None
    Read maps with head_pattern / head_scores / layer_rows, which work in both stores; `layer` is always the
    model's layer number (a hybrid's attention may be layer 3 of 4).

    A model whose layers are not all softmax attention (attnviz.capture.linear) also has, where it has them:
    layer_kinds: every model layer's kind ("softmax", "gated softmax", "gated delta rule", "mamba2", "conv", ...);
    mixers: {layer: the linear mixer's recorded kernel call}; maps: {layer: its implicit map w [head, query, key]} (the
    pattern store; each built when first read); gates: {gated softmax layer: sigmoid(gate) [head, query, head_dim]};
    skipped: {layer: kind} of the token mixers with no exact map. `layers` lists the softmax layers; `linear_layers` the
    mapped ones.
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
    # the logits [layer, head, query, key], once computed (the scores property) or read from a file
    computed_scores: np.ndarray | None = field(default=None, repr=False)
    # scaling, head_dim and the model's head numbers ("heads") of a capture that kept no inputs (read from a file,
    # or merged into words)
    file_facts: dict = field(default_factory=dict, repr=False)
    # {layer: attnviz.stats.streamed_stats result}, when the statistics were computed during the forward pass
    summary: dict | None = field(default=None, repr=False)
    _sink: np.ndarray | None = field(default=None, repr=False)
    token_words: list[int] | None = field(default=None, repr=False)
    word_spans: list[tuple[int, int]] | None = field(default=None, repr=False)
    layer_kinds: tuple[str, ...] | None = field(default=None, repr=False)
    mixers: dict | None = field(default=None, repr=False)
    maps: dict[int, np.ndarray] | None = field(default=None, repr=False)
    gates: dict[int, torch.Tensor] | None = field(default=None, repr=False)
    skipped: dict[int, str] | None = field(default=None, repr=False)
    # [query, vocab] float32 next-token logits of the same forward pass, with capture_attention(with_logits=True)
    logits: torch.Tensor | None = field(default=None, repr=False)

    def __post_init__(self):
        for array in (self.pattern, self.computed_scores):
            if array is not None:
                array.flags.writeable = False  # shared by every session that asks for it: nobody changes it

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
        return self.file_facts.get("head_dim") if not self.inputs else next(iter(self.inputs.values())).head_dim

    @property
    def scaling(self) -> float | None:
        """The factor q.k is multiplied by, when every captured layer uses the same one (else None)."""
        if not self.inputs:
            return self.file_facts.get("scaling")
        values = {x.scaling for x in self.inputs.values()}
        return values.pop() if len(values) == 1 else None

    @property
    def has_scores(self) -> bool:
        return bool(self.inputs)

    # -- kinds of layer --
    def layer_kind(self, layer: int) -> str:
        """The token mixer of model layer `layer`: "softmax", "gated softmax", "gated delta rule", "mamba2", "conv",
        "indexed", "softmax + mamba2", "mlp" (attnviz.mixers.kinds); "softmax" for a model of softmax layers only."""
        if not self.layer_kinds:
            return "softmax"
        if not 0 <= int(layer) < len(self.layer_kinds):
            raise CaptureError(f"Layer {layer} does not exist: the model has layers 0 to {len(self.layer_kinds) - 1}.")
        return self.layer_kinds[int(layer)]

    @property
    def linear_layers(self) -> list[int]:
        """The captured layers with a linear mixer's implicit map (gated delta rule, Mamba2), in order."""
        return sorted(set(self.mixers or {}) | set(self.maps or {}))

    def layer_heads(self, layer: int, mixer: str | None = None) -> int:
        """How many heads layer `layer` has: its attention's, or its linear mixer's (mixer: "linear" for a
        layer with both, as Falcon-H1's)."""
        if self._is_linear(layer, mixer):  # from the map or the kernel call: counting builds no map
            built = (self.maps or {}).get(int(layer))
            return int(built.shape[0]) if built is not None else self.mixers[int(layer)].heads
        return self.n_heads

    def gate(self, layer: int) -> np.ndarray:
        """The output gate of gated softmax layer `layer` per head and query, the mean over the head's channels:
        [head, query] (attnviz.mixers.gates)."""
        return linear.mean_gate(self, int(layer))

    def skipped_message(self) -> str:
        """One sentence naming the layers whose token mixer has no exact map here, or "" when none."""
        from attnviz.mixers.maps import ImplicitMaps

        return ImplicitMaps({}, {}, self.layer_kinds or (), dict(self.skipped or {})).message()

    def _is_linear(self, layer: int, mixer: str | None) -> bool:
        linear_here = int(layer) in self.linear_layers
        if mixer not in (None, "linear", "softmax"):
            raise CaptureError(f"mixer must be 'softmax' or 'linear'; got {mixer!r}.")
        if mixer == "linear" and not linear_here:
            raise CaptureError(f"Layer {layer} has no linear mixer map in this capture.")
        return linear_here and (mixer == "linear" or (mixer is None and int(layer) not in self.layers))

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
    def layer_rows(self, layer: int, start: int = 0, stop: int | None = None, *, heads=None,
                   mixer: str | None = None) -> np.ndarray:
        """Attention weights of every head (or `heads`) of `layer` for queries start .. stop - 1: [head, rows, key],
        float32 (the dense store's dtype in the pattern store). A linear mixer's layer gives its implicit map's rows
        (signed, not a probability); mixer="linear" picks it in a layer with both (Falcon-H1)."""
        stop = self.n_tokens if stop is None else stop
        if self._is_linear(layer, mixer):
            return linear.map_rows(self, int(layer), start, stop, heads)
        if self.pattern is not None:
            block = self.pattern[self.index_of(layer), :, start:stop]
            return block if heads is None else block[list(heads)]
        inputs = self._inputs(layer)
        seen = inputs.mask.key_end(start, stop)  # keys after it have weight 0: never computed (causal: half)
        weights, _ = core.layer_pattern(inputs, start, stop, heads=heads, key_end=seen)
        if seen < self.n_tokens:
            weights = torch.nn.functional.pad(weights, (0, self.n_tokens - seen))
        return weights.numpy()

    def head_pattern(self, layer: int, head: int, rows=None, *, mixer: str | None = None) -> np.ndarray:
        """One head's weights [rows, key] (rows: None for all queries, a slice, or (start, stop)); a linear mixer's
        implicit map in a linear layer (layer_rows)."""
        start, stop = _row_range(rows, self.n_tokens)
        return self.layer_rows(layer, start, stop, heads=[head], mixer=mixer)[0]

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
        if self.computed_scores is None and self.inputs:
            scores = np.stack([core.layer_scores(self.inputs[layer], key_end=self.n_tokens).numpy()
                               for layer in self.layers])
            scores.flags.writeable = False
            self.computed_scores = scores
        return self.computed_scores

    @property
    def learned_sink(self) -> np.ndarray | None:
        """[layer, head, query]: the weight each query gives the model's learned sink logit (gpt-oss), or None for
        a model without one. Each row of the pattern plus its learned_sink sums to 1."""
        if self._sink is not None:
            return self._sink
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
        """The same capture restricted to some of its layers (model layer numbers): narrowing the layers needs no
        new forward pass. A range of consecutive layers shares the capture's arrays (a 1.6 GB pattern copied took 3
        s); any other choice copies its layers' part of them."""
        layers = sorted({int(i) for i in layers})
        linear = [i for i in layers if i in self.linear_layers]
        layers = [i for i in layers if i not in linear or i in self.layers]
        index = [self.index_of(i) for i in layers]
        if index and index == list(range(index[0], index[-1] + 1)):  # a range of layers: views, not copies
            index = slice(index[0], index[-1] + 1)
        return AttentionCapture(
            tokens=self.tokens, token_ids=self.token_ids, layers=layers, kv_head_of=self.kv_head_of,
            model_name=self.model_name, causal=self.causal, store=self.store,
            pattern=None if self.pattern is None else self.pattern[index],
            inputs=None if self.inputs is None else {i: self.inputs[i] for i in layers},
            values=None if self.values is None else {i: self.values[i] for i in layers},
            computed_scores=None if self.computed_scores is None else self.computed_scores[index],
            file_facts=dict(self.file_facts),
            summary=None if self.summary is None else {i: self.summary[i] for i in layers},
            _sink=None if self._sink is None else self._sink[index],
            token_words=self.token_words, word_spans=self.word_spans, layer_kinds=self.layer_kinds, logits=self.logits,
            gates=None if self.gates is None else {i: g for i, g in self.gates.items() if i in layers},
            skipped=self.skipped, mixers=None if self.mixers is None else {i: self.mixers[i] for i in linear},
            maps=None if self.maps is None else {i: m for i, m in self.maps.items() if i in linear})

    # -- words and spans --
    def span_attention(self, layer: int, head: int, queries, how: str = "sum") -> np.ndarray:
        """The attention of a set of queries over every key, one head: [key] float64.

        queries: a span (start, stop) as a tuple of two ints (queries start .. stop - 1), one int, a slice, a boolean
        mask, or any collection of positions (a list, set, range or array; each position counted once).
        how="sum": the sum of their rows (key j gets the total weight the set gives it; the row sums to the number of
        queries, less their learned-sink weight); how="mean": the mean of their rows (sums to 1, less the mean sink
        weight). Read from the dense pattern, or computed from q and k a run of consecutive queries at a time in the
        qk store. On a by_words capture the positions are words and the keys are words."""
        if how not in ("sum", "mean"):
            raise CaptureError(f"how must be 'sum' or 'mean'; got {how!r}.")
        positions = query_positions(queries, self.n_tokens)
        total = np.zeros(self.n_tokens)
        for a, b in runs(positions):
            for start in range(a, b, 256):
                rows = self.head_pattern(layer, head, (start, min(b, start + 256)))  # [rows, key]
                total += rows.astype(np.float64).sum(0)
        return total / len(positions) if how == "mean" else total

    @property
    def head_numbers(self) -> list[int]:
        """The model's number of each captured head (a capture read from a file of some heads keeps them)."""
        return list(self.file_facts.get("heads", range(self.n_heads)))

    def inputs_nbytes(self) -> int:
        return sum(x.nbytes() for x in (self.inputs or {}).values())

    # -- for a notebook (the statistics, save and the notebook views: attnviz.capture.methods) --
    def to_attentions(self) -> tuple[torch.Tensor, ...]:
        """The captured layers' weights in the format of transformers' output_attentions (and bertviz's head_view
        and model_view): a tuple with one [1, head, query, key] tensor per captured layer, in order. In the qk
        store each layer's weights are computed from q and k here (4 bytes per weight). The dense store's are
        copied: its pattern is read-only and may be shared (a cached capture), and a tensor cannot be."""
        def writable(rows: np.ndarray) -> np.ndarray:
            rows = np.ascontiguousarray(rows)
            return rows if rows.flags.writeable else rows.copy()

        return tuple(torch.from_numpy(writable(self.layer_rows(layer)))[None] for layer in self.layers)

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
