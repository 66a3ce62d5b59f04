"""Massive activations (Sun et al., 2024, "Massive Activations in Large Language Models"): a few hidden-state
dimensions that take values thousands of times the median, at the first token and at delimiters, from an early
layer on. Sun et al. show that they act as fixed biases that the attention sinks are built on: set them to zero
at the sink token and the model breaks; set them to their mean and it does not.

- layer_outputs: the residual stream after every decoder layer, [layer, token, dim] (forward hooks on the
  layers, so the last layer is read before the final norm).
- top_activations: the top-k absolute values of each layer's output and which token and dimension hold them.
- edited: a context in which one layer's output is changed at one token, in some dimensions (to zero, or to
  their mean over other texts: mean_at), for every forward pass this thread runs; other threads running the
  same shared model are not touched. intervention() measures what that does to the per-token loss (attnviz.lm) and to
  each layer's sink mass (attnviz.stats.sink_mass on attnviz.capture's patterns).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from attnviz import interventions as iv
from attnviz.errors import AttnvizError
from attnviz.capture import decoder_layers

MODES = ("zero", "mean")


class MassiveError(AttnvizError, ValueError):
    """The massive-activation edit cannot be made as asked; the message says why."""


@dataclass(frozen=True)
class Activation:
    """One large hidden-state value: after decoder layer `layer`, at token position `token`, dimension `dim`."""

    layer: int
    token: int
    dim: int
    value: float


@torch.no_grad()
def layer_outputs(model, token_ids) -> np.ndarray:
    """The hidden state after every decoder layer on one text: [layer, token, dim] float32 (in any edit this
    thread has active): the sites ("out", layer) of attnviz.interventions. token_ids: [n]."""
    n_layers = len(decoder_layers(model))
    plan = iv.Plan(record={}, kinds=("out",)).following(iv.current())
    ids = torch.as_tensor(token_ids).reshape(1, -1).to(model.get_input_embeddings().weight.device)
    with iv.applied(model, plan):
        model(input_ids=ids, use_cache=False)
    return torch.stack([plan.record[("out", layer)].float() for layer in range(n_layers)]).numpy()


def top_activations(hidden, k: int = 3) -> list[list[Activation]]:
    """The k largest |values| of each layer's output, largest first: hidden [layer, token, dim] -> per layer a list
    of k Activations (value keeps its sign)."""
    h = np.asarray(hidden)
    out = []
    for layer, x in enumerate(h):
        flat = np.abs(x).reshape(-1)
        top = np.argsort(-flat, kind="stable")[:k]
        out.append([Activation(layer, int(i // x.shape[1]), int(i % x.shape[1]), float(x.reshape(-1)[i]))
                    for i in top])
    return out


def median_magnitude(hidden) -> np.ndarray:
    """[layer] the median |value| of each layer's output: the scale the massive values are compared with."""
    return np.median(np.abs(np.asarray(hidden)).reshape(len(hidden), -1), axis=1)


MASSIVE_VALUE = 100.0   # Sun et al. 2024: a massive activation exceeds 100 in magnitude...
MASSIVE_RATIO = 1000.0  # ...and about 1,000 times the median magnitude of its layer's hidden state


def first_massive_layer(hidden, *, value: float = MASSIVE_VALUE, ratio: float = MASSIVE_RATIO) -> int | None:
    """The first layer whose largest |value| is massive in Sun et al.'s sense (over `value`, and over `ratio`
    times that layer's median |value|), or None."""
    h = np.asarray(hidden)
    peak = np.abs(h).reshape(len(h), -1).max(axis=1)
    hits = np.flatnonzero((peak > value) & (peak > ratio * median_magnitude(h)))
    return int(hits[0]) if len(hits) else None


@dataclass(frozen=True)
class Edit:
    """Set decoder layer `layer`'s output at token `token` to `values` in dimensions `dims`."""

    layer: int
    token: int
    dims: tuple[int, ...]
    values: tuple[float, ...]


def mean_at(hiddens: Sequence, layer: int, token: int, dims: Sequence[int]) -> tuple[float, ...]:
    """The mean of `dims` at position `token` after `layer` over several texts: what Sun et al. set massive
    activations to (their mean over many sequences; the values barely change from text to text). hiddens: one
    [layer, token, dim] array per text, each with more than `token` tokens."""
    rows = [np.asarray(h)[layer, token, list(dims)] for h in hiddens if np.shape(h)[1] > token]
    if not rows:
        raise MassiveError(f"no reference text has a token at position {token}")
    return tuple(float(v) for v in np.mean(rows, axis=0))


def edit_for(hidden, layer: int, token: int, dims: Sequence[int], mode: str,
             means: Sequence[float] | None = None) -> Edit:
    """The Edit of Sun et al.'s intervention: the dims at `token` after `layer` set to zero ("zero") or to
    `means` ("mean", from mean_at over other texts). hidden: [layer, token, dim] of the unedited run."""
    if mode not in MODES:
        raise MassiveError(f"mode must be one of {MODES}, not {mode!r}")
    h = np.asarray(hidden)
    if not 0 <= layer < h.shape[0] or not 0 <= token < h.shape[1]:
        raise MassiveError(f"layer {layer} or token {token} is outside the run ({h.shape[0]} layers, "
                         f"{h.shape[1]} tokens)")
    dims = tuple(int(d) for d in dims)
    if mode == "zero":
        return Edit(layer, token, dims, (0.0,) * len(dims))
    if means is None or len(means) != len(dims):
        raise MassiveError("the mean intervention needs one mean value per dimension (mean_at)")
    return Edit(layer, token, dims, tuple(float(v) for v in means))


@contextlib.contextmanager
def edited(model, edit: Edit) -> Iterator[None]:
    """Every forward pass this thread (this context) runs inside the block has `edit` applied to the output of
    its decoder layer (the site ("out", layer) of attnviz.interventions, at one position); other threads see the
    model unchanged."""
    layers = decoder_layers(model)
    if not 0 <= edit.layer < len(layers):
        raise MassiveError(f"layer {edit.layer} is outside the model's {len(layers)} layers")
    put = iv.Put(torch.tensor(edit.values, dtype=torch.float64), position=edit.token, columns=edit.dims)
    with iv.applied(model, iv.Plan().edit(("out", edit.layer), put).following(iv.current())):
        yield


@dataclass
class Intervention:
    """The same text with and without an Edit: per-token losses [n - 1] (nats), perplexities, and each layer's
    sink mass ([layer], the mean over heads of attnviz.stats.sink_mass)."""

    edit: Edit
    losses: np.ndarray
    edited_losses: np.ndarray
    sink_mass: np.ndarray
    edited_sink_mass: np.ndarray

    @property
    def perplexity(self) -> float:
        return float(np.exp(self.losses.mean()))

    @property
    def edited_perplexity(self) -> float:
        return float(np.exp(self.edited_losses.mean()))


def _measure(loaded, text: str, ids, store: str) -> tuple[np.ndarray, np.ndarray]:
    from attnviz.capture import capture_attention
    from attnviz.lm import predictions
    from attnviz.stats import head_stats

    losses = predictions(loaded.model, ids, k=1).losses
    capture = capture_attention(loaded, text, store=store)  # in the "qk" store the sink mass is streamed
    frame = head_stats(capture)
    return losses, frame.groupby("layer", sort=True)["sink_mass"].mean().to_numpy()


def intervention(loaded, text: str, edit: Edit, *, store: str = "pattern") -> Intervention:
    """Sun et al.'s experiment on one text: the loss of every next token and each layer's sink mass, as the
    model runs, then with `edit` applied. loaded: an attnviz LoadedModel with a language-model head. store:
    "pattern" reads the sink mass from the dense capture, "qk" from q and k a block of rows at a time (any length
    the model takes; attnviz.stats.streamed_stats, equal to the dense definition)."""
    ids = torch.as_tensor(loaded.tokenizer(text)["input_ids"])
    losses, mass = _measure(loaded, text, ids, store)
    with edited(loaded.model, edit):
        edited_losses, edited_mass = _measure(loaded, text, ids, store)
    return Intervention(edit, losses, edited_losses, mass, edited_mass)


_HOOKS = iv.HOOKS  # the one set of intervention hooks (attnviz.interventions)
