"""What the front door's experiments take, checked once for all of them: the model (any form capture takes, lent by
attnviz.capture.lending), a text as text or token ids, an answer as a string of one token or a token id, layers,
heads and positions. Every refusal is an ExperimentError whose message says what to change."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from attnviz import lm
from attnviz.capture.lending import lent
from attnviz.errors import AttnvizError
from attnviz.models import LoadedModel
from attnviz.tokenizer import readable_tokens

Model = str | os.PathLike | LoadedModel | torch.nn.Module  # a name, folder or .gguf file; or a model object
Tokenizer = Any             # a transformers tokenizer (called on a text; decode), with a model object only
Text = str | Sequence[int]  # a text, or the token ids of one
Token = str | int           # an answer: a string that is one token, or a token id


class ExperimentError(AttnvizError, ValueError):
    """An experiment of the front door cannot run as asked; the message says why and what to change."""


@contextlib.contextmanager
def model_for(model, tokenizer, call: str) -> Iterator:
    """The LoadedModel of `model` for the block (attnviz.capture.lending.lent); a model object is put back as it
    was afterwards. call: the experiment's call, shown when a model object comes without its tokenizer."""
    with lent(model, tokenizer, usage=f"{call}(model, ..., tokenizer=tokenizer)", error=ExperimentError) as loaded:
        yield loaded


def decoder(loaded, what: str) -> None:
    """ExperimentError for an encoder: `what` (an experiment) needs next-token predictions."""
    if not lm.is_language_model(loaded.model):
        raise ExperimentError(f"{loaded.spec.name} is an encoder: it predicts no next token, so {what} has nothing "
                              "to measure. Pick a decoder (toy-gpt2, smollm2-135m, ...).")


def token_ids(loaded, text: Text, what: str = "The text", least: int = 1) -> list[int]:
    """The token ids of a text (tokenized as the model's tokenizer does for a text of its own, start token and
    all) or token ids checked against the vocabulary; ExperimentError under `least` tokens."""
    if isinstance(text, str):
        ids = [int(i) for i in loaded.tokenizer(text).input_ids] if text.strip() else []
    elif isinstance(text, Iterable):
        ids = [_token_id(loaded, i) for i in text]
    else:
        raise ExperimentError(f"{what} must be a text or a list of token ids, not {type(text).__name__}.")
    if len(ids) < least:
        raise ExperimentError(f"{what} is {len(ids)} token(s) long; this needs at least {least}.")
    return ids


def _token_id(loaded, token) -> int:
    try:
        value = int(token)
    except (TypeError, ValueError):
        raise ExperimentError(f"Token ids must be whole numbers; got {token!r}.") from None
    vocab = len(loaded.tokenizer) if loaded.shape is None else loaded.shape.vocab
    if not 0 <= value < vocab:
        raise ExperimentError(f"Token id {value} is outside the vocabulary (0 to {vocab - 1}).")
    return value


def answer_id(loaded, answer: Token, what: str = "answer") -> int:
    """The token id of an answer: a token id, or a string the tokenizer makes one token of (no start token); a
    string of several tokens is refused with its pieces named."""
    if not isinstance(answer, str):
        return _token_id(loaded, answer)
    ids = loaded.tokenizer(answer, add_special_tokens=False).input_ids
    if len(ids) != 1:
        pieces = " + ".join(repr(t) for t in readable_tokens(loaded.tokenizer, ids)) or "no token"
        raise ExperimentError(f"The {what} {answer!r} is {len(ids)} tokens in {loaded.spec.name}'s tokenizer "
                              f"({pieces}); give one token (often with its leading space, as ' Paris') or its id.")
    return int(ids[0])


def position(n: int, where: int, what: str = "Position") -> int:
    """A position of a text of n tokens, counted from the end when negative; ExperimentError outside it."""
    if not -n <= int(where) < n:
        raise ExperimentError(f"{what} {where} is outside the text (positions 0 to {n - 1}, or -1 for the last).")
    return int(where) % n


def layer_of(loaded, layer: int) -> int:
    """A layer of the model, counted from the end when negative; ExperimentError for one it does not have."""
    layers = loaded.shape.layers
    if not -layers <= int(layer) < layers:
        raise ExperimentError(f"Layer {layer} does not exist: {loaded.spec.name} has layers 0 to {layers - 1}.")
    return int(layer) % layers


def head_of(loaded, head: int) -> int:
    """A head of every layer of the model; ExperimentError for one it does not have."""
    if not 0 <= int(head) < loaded.shape.heads:
        raise ExperimentError(f"Head {head} does not exist: {loaded.spec.name} has heads 0 to "
                              f"{loaded.shape.heads - 1}.")
    return int(head)


def some(value, every: int) -> list[int]:
    """None -> 0 .. every - 1; one number -> [it]; several -> them (unchecked)."""
    if value is None:
        return list(range(every))
    return [int(value)] if isinstance(value, int) or hasattr(value, "__index__") else [int(v) for v in value]


def heads_of(loaded, layer, head) -> list[tuple[int, int]]:
    """Every (layer, head) pair of `layer` (None: all; one or several, negative from the end) and `head`
    (None: all), checked."""
    return [(layer_of(loaded, la), head_of(loaded, h)) for la in some(layer, loaded.shape.layers)
            for h in some(head, loaded.shape.heads)]


def tokens(loaded, ids: Sequence[int]) -> list[str]:
    """Each token of ids, readable (whitespace made visible)."""
    return readable_tokens(loaded.tokenizer, list(ids))
