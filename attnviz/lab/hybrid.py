"""The toy lab's hybrid, trained beside softmax models on the same data: a Qwen3-Next hybrid (Gated DeltaNet layers,
then one gated softmax layer), the Qwen3-Next softmax model, and that model with its output gate held open
(attnviz.lab.qwen3_next builds all three). The runs are interleaved step by step as the attention variants' are
(VariantComparison), from the same seed on the same batches.

What each layer mixes is read exactly: a Gated DeltaNet layer's implicit map w [head, query, key] (o_t = sum_s w_ts
v_s) by attnviz.mixers.implicit_maps, a softmax layer's pattern from output_attentions. w is not a probability: it
can be negative and its rows do not sum to 1. Its previous-token and induction scores are read on the shares
|w| / row sum of |w| (attnviz.mixers.stats), where the softmax definitions apply unchanged (a softmax row is its own
shares).

The sink metric is read from the softmax layers only, as attnviz.sinks measures it: alpha_0, the mean weight the
queries give the first token, per (text, layer, head), and Gu et al.'s Sink_0^0.3, the share of those triples with
alpha_0 > 0.3. Each checkpoint keeps the attention it was read from (HybridCheckpoint.attention).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from attnviz.diagnostics import repeated_token_scores
from attnviz.lab.comparison import VariantComparison
from attnviz.lab.config import MAX_SECONDS, LabConfig
from attnviz.lab.qwen3_next import A_MAX, CONV_KERNEL, MODELS, build_qwen3_next
from attnviz.lab.tasks import make_probe, probe_lengths, text_probe
from attnviz.lab.training import Checkpoint, LabError, LabRun, LabStateError
from attnviz.mixers.kinds import module_kinds
from attnviz.mixers.maps import SOFTMAX_KINDS, implicit_maps
from attnviz.mixers.stats import map_stats, shares
from attnviz.sinks import sink_rate, sink_scores
from attnviz.stats import previous_token_score, sink_mass
from attnviz.tokenizer import byte_tokenizer, readable_tokens

SINK_TEXTS = 8  # probe rows the sink metric is read on (each checkpoint keeps their attention)


@dataclass(frozen=True)
class LayerMaps:
    """What every layer of one model mixes on one text. kinds: each layer's mixer (attnviz.mixers.kinds); maps:
    per layer [head, query, key] float64, the implicit map w of a Gated DeltaNet layer (signed, rows not summing to
    1) or the pattern of a softmax layer; prev_token, induction: [layer, head], attnviz.mixers.stats.map_stats on
    |w| / row sum of |w| (targets from the text's own repeats); note: the layers left without an exact map."""

    tokens: list[str]
    kinds: tuple[str, ...]
    maps: tuple[np.ndarray, ...]
    prev_token: np.ndarray
    induction: np.ndarray
    note: str = ""

    def linear_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k not in SOFTMAX_KINDS]


def softmax_patterns(model, ids: torch.Tensor) -> np.ndarray:
    """The softmax layers' patterns [row, softmax layer, head, query, key] float64 on ids [row, N], from
    output_attentions (eager attention; transformers returns those of the softmax layers only, in order)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True, use_cache=False)
    finally:
        model.train(was_training)
    if not out.attentions:
        return np.zeros((ids.shape[0], 0, 0, ids.shape[1], ids.shape[1]))
    return torch.stack(out.attentions, dim=1).double().numpy()


def _implicit_maps(model, ids: torch.Tensor):
    """attnviz.mixers.implicit_maps of ids [1, N], the model in eval mode for the pass."""
    was_training = model.training
    model.eval()
    try:
        return implicit_maps(model, ids)
    finally:
        model.train(was_training)


def stacked_maps(model, ids: torch.Tensor) -> tuple[tuple[str, ...], np.ndarray, str]:
    """Every layer's map on each row of ids [row, N]: (kinds, [row, layer, head, query, key] float64, the note of
    the layers without an exact map). A linear layer's map is attnviz.mixers.implicit_maps' w, one row at a time
    (the recorder reads batch row 0); a softmax layer's is its pattern."""
    kinds = module_kinds(model)
    softmax = [i for i, k in enumerate(kinds) if k in SOFTMAX_KINDS]
    patterns = softmax_patterns(model, ids)
    rows = []
    note = ""
    linear = len(softmax) < len(kinds)  # a model of softmax layers only needs no pass per row
    for r in range(ids.shape[0]):
        found = _implicit_maps(model, ids[r:r + 1]) if linear else None
        note = found.message() if linear else ""
        layers = {layer: w.double().numpy() for layer, w in found.maps.items()} if linear else {}
        layers.update({layer: patterns[r, i] for i, layer in enumerate(softmax)})
        if len(layers) != len(kinds):
            missing = sorted(set(range(len(kinds))) - set(layers))
            raise LabError(f"no map of layer{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}: {note}")
        rows.append(np.stack([layers[i] for i in range(len(kinds))]))
    return kinds, np.stack(rows), note


def layer_maps(model, text: str) -> LayerMaps:
    """Every layer's map of `model` on <bos> + text, with the previous-token and induction scores of each head on
    |w| (attnviz.mixers.stats.map_stats)."""
    ids = torch.tensor([byte_tokenizer()(text)["input_ids"]])
    kinds, maps, note = stacked_maps(model, ids)
    scores = [map_stats(m, ids[0].tolist()) for m in maps[0]]
    return LayerMaps(tokens=readable_tokens(byte_tokenizer(), ids[0].tolist()), kinds=kinds, maps=tuple(maps[0]),
                     prev_token=np.stack([s["prev_token"] for s in scores]),
                     induction=np.stack([s["induction"] for s in scores]), note=note)


def probe_scores(model, probe: torch.Tensor, segment_len: int) -> dict[str, np.ndarray]:
    """The toy lab's head scores (attnviz.lab.training.head_scores' definitions) on every layer's shares |w| / row
    sum: previous_token and induction [layer, head], averaged over the probe's rows, each row scored with its own
    repeat length (probe_lengths)."""
    _, maps, _ = stacked_maps(model, probe)
    a = shares(maps)                                                     # [row, layer, head, query, key]
    lengths = probe_lengths(segment_len, probe.shape[0])
    induction = [repeated_token_scores(p, length, start=1)["prefix_matching"] for p, length in zip(a, lengths)]
    return {"previous_token": previous_token_score(a).mean(axis=0), "induction": np.mean(induction, axis=0)}


def first_token_metrics(attention: np.ndarray) -> dict[str, np.ndarray | float]:
    """From softmax attention [text, layer, head, query, key]: alpha0 [text, layer, head], the mean weight on the
    first token over the queries (attnviz.sinks.sink_scores); first_token_mass, its mean over every triple; and
    sink_rate, Gu et al.'s Sink_0^0.3 (attnviz.sinks.sink_rate)."""
    alpha0 = sink_scores(attention)[..., 0]
    return {"alpha0": alpha0, "first_token_mass": float(alpha0.mean()) if alpha0.size else float("nan"),
            "sink_rate": sink_rate(alpha0)}


def best_by_kind(checkpoints, statistic: str) -> dict[str, np.ndarray]:
    """{mixer kind: [checkpoint]}: at each checkpoint, the highest `statistic` ("previous_token" or "induction",
    on |w| / row sum) over every head of the layers of that kind (HybridCheckpoint.kinds)."""
    kinds = checkpoints[0].kinds
    return {kind: np.array([getattr(c, statistic)[[i for i, k in enumerate(kinds) if k == kind]].max()
                            for c in checkpoints])
            for kind in dict.fromkeys(kinds)}


@dataclass
class HybridCheckpoint(Checkpoint):
    """A Checkpoint of a Qwen3-Next run: previous_token and induction [layer, head] on every layer's shares |w|;
    sink [layer, head] the softmax layers' mean weight on <bos> (NaN for a Gated DeltaNet layer); alpha0 [text,
    softmax layer, head] and sink_rate from `attention`, the softmax layers' patterns [text, softmax layer, head,
    query, key] (float32) on the sink texts; first_token_mass the mean of alpha0; kinds each layer's mixer."""

    attention: np.ndarray | None = None
    first_token_mass: float = float("nan")
    kinds: tuple[str, ...] = ()


class HybridRun(LabRun):
    """One of the Qwen3-Next models (attnviz.lab.qwen3_next.MODELS) trained on `config`'s task, with the lab's
    loop; its checkpoints are HybridCheckpoints. Not saved (the lab's folders hold its own architectures)."""

    def __init__(self, config: LabConfig, model: str, *, conv_kernel: int = CONV_KERNEL, a_max: float = A_MAX,
                 max_seconds: float = MAX_SECONDS, owner: str | None = None):
        if model == "hybrid" and config.n_layers < 2:
            raise LabError("the hybrid needs at least 2 layers: Gated DeltaNet layers before its one softmax layer")
        self.kind, self.conv_kernel, self.a_max = model, conv_kernel, a_max
        self.probe = make_probe(config.segment_len, n_letters=config.n_letters)
        self.sink_texts = (text_probe(config.text_len) if config.task == "text" else self.probe)[:SINK_TEXTS]
        super().__init__(config, max_seconds=max_seconds, owner=owner,
                         model=build_qwen3_next(config, model, conv_kernel, a_max))

    def measure(self, step: int, loss: float) -> HybridCheckpoint:
        scores = probe_scores(self.model, self.probe, self.config.segment_len)
        kinds = module_kinds(self.model)
        # kept as float32, and every sink number read from what is kept: [text, softmax layer, head, q, k]
        attention = softmax_patterns(self.model, self.sink_texts).astype(np.float32)
        sinks = first_token_metrics(attention)
        sink = np.full(scores["previous_token"].shape, np.nan)
        sink[[i for i, k in enumerate(kinds) if k in SOFTMAX_KINDS]] = sink_mass(attention).mean(axis=0)
        return HybridCheckpoint(step, loss, scores["previous_token"], scores["induction"], sink, sinks["sink_rate"],
                                sinks["alpha0"], attention=attention,
                                first_token_mass=sinks["first_token_mass"], kinds=kinds)

    def save(self, name: str, *, rename: bool = False):
        raise LabStateError("the hybrid comparison's models are kept in this session only; they are not saved")


class HybridComparison(VariantComparison):
    """The Qwen3-Next models (MODELS: hybrid, gated, ungated) trained side by side on `base`'s task and sizes, one
    step of each in turn in one thread (VariantComparison's loop), from the same seed on the same batches."""

    default_variants = MODELS

    def __init__(self, base: LabConfig, *, conv_kernel: int = CONV_KERNEL, a_max: float = A_MAX, **options):
        self.conv_kernel, self.a_max = conv_kernel, a_max
        super().__init__(base, **options)

    def make_run(self, base: LabConfig, variant: str, *, auto_save: bool, owner: str | None) -> HybridRun:
        config = replace(base, attention="standard", positional="rope")   # Qwen3-Next's own RoPE
        return HybridRun(config, variant, conv_kernel=self.conv_kernel, a_max=self.a_max, max_seconds=float("inf"),
                         owner=owner)

    def maps(self, text: str) -> dict[str, LayerMaps]:
        """Every model's layer_maps on the same text, once trained. LabStateError while they are still training."""
        if not self.finished:
            raise LabStateError("the models are still training; their maps are drawn once they finish")
        return {name: layer_maps(run.model, text) for name, run in self.runs.items()}
