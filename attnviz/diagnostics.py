"""The standard induction test, independent of the user's text: a random token sequence of length L repeated twice.

On [prefix] r_0 … r_{L-1} r_0 … r_{L-1} (prefix: the start token the tokenizer adds, if any; the L tokens distinct,
drawn from the ordinary vocabulary with a seeded generator), each query in the second copy, q = p + L + i, has one
earlier occurrence of its own token, at p + i. Per head, averaged over the L queries of the second copy:

- prefix_matching  the weight on p + i + 1, the token AFTER the earlier occurrence: the attention an induction head
                   pays ("[A][B] … [A] -> look at [B]", Olsson et al. 2022, "In-context learning and induction
                   heads"; TransformerLens's induction score is this same stripe)
- duplicate_token  the weight on p + i, the earlier occurrence itself (duplicate-token heads, Wang et al. 2022)
- previous_token   the weight on q - 1 (previous-token heads, the induction circuit's first half)

prefix_matching is attnviz.stats' induction statistic (stats.induction_score) with the targets the layout gives
(repeat_targets), previous_token stats' previous-token score on the second copy's rows: on this sequence they equal
the induction and prev_token columns of the Heads page's statistics restricted to those queries.
Random tokens carry no meaning and no n-gram statistics, so a high prefix_matching score comes from the repeat alone.
For a language model, the loss on the second copy against the first shows that the model uses the repeat at all:
in-context learning of the sequence, the behaviour induction heads implement.

A seed's r is the start of one permutation of the vocabulary, so the r of a shorter L is the start of a longer
one's. On a causal language model the first copy's weights, logits, keys and values do not depend on what follows
it; FirstCopies keeps them (the KV cache), and a test of any L up to the length kept runs only its second copy on top
of them: moving L from 100 to 200 runs 100 + 200 tokens, not 401, and back to 10 only 10 (reuse_test). The weights are
transformers' own, with the cache (tested against one pass over the whole sequence).

capture_token_ids captures any token ids (the sequence above, windows of a long text) through capture_attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

import torch

from attnviz import attention as core
from attnviz import lm, shape
from attnviz.capture import (ATTN_IMPLEMENTATION, AttentionCapture, CaptureError, capture_attention, is_causal,
                             numbered_attention, recording_forward, uses_interface)
from attnviz.capture.linear import linear_plan
from attnviz.capture.modules import input_device
from attnviz.stats import induction_score, previous_token_score
from attnviz.tokenizer import readable_tokens

SCORES = ("prefix_matching", "duplicate_token", "previous_token")
MAX_LENGTH = 256  # L: the sequence is 2L (+ the start token) long, dense pattern store


def special_tokens(tokenizer) -> tuple[list[int], list[int]]:
    """(prefix, suffix): the ids the tokenizer puts before and after any text ([BOS], or [CLS] and [SEP]), read from
    what it makes of "" and of "a"."""
    empty = list(tokenizer("").input_ids)
    with_text = list(tokenizer("a").input_ids)
    k = 0
    while k < len(empty) and k < len(with_text) and empty[k] == with_text[k]:
        k += 1
    return empty[:k], empty[k:]


def repeated_random_tokens(tokenizer, vocab_size: int, length: int, *, seed: int = 0) -> tuple[list[int], int]:
    """(token ids, p): prefix + r + r + suffix, r = `length` distinct ids drawn from the vocabulary without the
    tokenizer's special ids; p = the position of r's first token."""
    prefix, suffix = special_tokens(tokenizer)
    special = set(getattr(tokenizer, "all_special_ids", []) or []) | set(prefix) | set(suffix)
    candidates = np.setdiff1d(np.arange(vocab_size), np.fromiter(special, dtype=np.int64, count=len(special)))
    if not 1 <= length <= min(MAX_LENGTH, len(candidates)):
        raise CaptureError(f"The repeated sequence's length must lie in 1 .. {min(MAX_LENGTH, len(candidates))}.")
    r = np.random.default_rng(seed).permutation(candidates)[:length].tolist()  # a longer L extends a shorter
    return prefix + r + r + suffix, len(prefix)


def repeat_targets(length: int, start: int) -> list[list[int]]:
    """The induction targets of a sequence whose tokens start .. start + L - 1 repeat at start + L ..
    start + 2L - 1, from the layout alone: query start + L + i -> [start + i + 1], every other query none. On such
    a sequence with L >= 2 distinct tokens (neither the prefix nor anything else repeating) these are exactly
    attnviz.stats.induction_targets of its token ids (for L = 1 the target is the query itself, which
    induction_targets leaves out); given by position, they ignore any other repeat (the toy lab's filler letters
    after the second copy)."""
    return [[]] * (start + length) + [[start + i + 1] for i in range(length)]


def repeated_token_scores(pattern: np.ndarray, length: int, start: int) -> dict[str, np.ndarray]:
    """pattern [..., query, key] of a sequence whose tokens start .. start + L - 1 repeat at start + L ..
    start + 2L - 1 -> {score: [...]} float64 (see the module docstring), each a mean over the L queries of the
    second copy: prefix_matching is attnviz.stats.induction_score on repeat_targets, previous_token is
    attnviz.stats.previous_token_score of the second copy's rows (and the key before each), duplicate_token the
    weight on the earlier copy itself."""
    p = np.asarray(pattern)
    end = start + 2 * length
    if p.shape[-2] < end:
        raise ValueError(f"the pattern covers {p.shape[-2]} tokens; a repeat of length {length} from position "
                         f"{start} needs {end}")
    q = start + length + np.arange(length)
    return {"prefix_matching": induction_score(p, repeat_targets(length, start)),
            "duplicate_token": p[..., q, q - length].astype(np.float64).mean(-1),
            "previous_token": previous_token_score(p[..., end - length - 1:end, end - length - 1:end])}


def _sequence(loaded, length: int, seed: int) -> tuple[list[int], int]:
    """repeated_random_tokens for this model's tokenizer and vocabulary."""
    vocab = loaded.shape.vocab if loaded.shape is not None else len(loaded.tokenizer)
    return repeated_random_tokens(loaded.tokenizer, vocab, length, seed=seed)


def capture_token_ids(loaded, token_ids, **kwargs) -> AttentionCapture:
    """capture_attention of these token ids (kwargs as capture_attention's)."""
    if not len(token_ids):
        raise CaptureError("No tokens to capture.")
    return capture_attention(loaded, "(token ids)", token_ids=token_ids, **kwargs)


@dataclass
class InductionTest:
    """scores: one row per (layer, head) with the SCORES columns; capture: the dense capture of the sequence
    (pattern [layer, head, n, n]); start, length: where the first copy starts and its length; loss_first,
    loss_second: a language model's mean loss in nats predicting the tokens of the first copy (after its first)
    and of the second copy (after its first), None for an encoder (and for L = 1)."""

    scores: pd.DataFrame
    capture: AttentionCapture
    start: int
    length: int
    loss_first: float | None = None
    loss_second: float | None = None


def induction_test(loaded, length: int = 50, *, seed: int = 0, layers=None, one_pass: bool = False) -> InductionTest:
    """The repeated-random-tokens test on `loaded` (every captured head's SCORES, and for a language model the
    loss on each copy): by reuse_test where the model allows it and every layer is wanted, else (or with one_pass)
    by one capture of the whole sequence (capture_token_ids)."""
    if layers is None and not one_pass and reuses_first_copies(loaded):
        return reuse_test(loaded, length, seed=seed)[0]
    ids, start = _sequence(loaded, length, seed)
    language = lm.is_language_model(loaded.model)
    capture = capture_token_ids(loaded, ids, layers=layers, with_logits=language)  # one pass: maps and loss
    return _test_of(capture, start, length, lm.token_losses(capture.logits, ids) if language else None)


def _test_of(capture: AttentionCapture, start: int, length: int, losses: np.ndarray | None) -> InductionTest:
    """The InductionTest of a capture of the repeated sequence, with a language model's loss on each of its tokens
    after the first (losses[t]: token t + 1, lm.token_losses; None for an encoder)."""
    scores = repeated_token_scores(capture.pattern, length, start)  # each [layer, head]
    n_layers, n_heads = capture.pattern.shape[:2]
    table = pd.DataFrame({"layer": np.repeat(capture.layers, n_heads), "head": np.tile(np.arange(n_heads), n_layers),
                          **{name: scores[name].ravel() for name in SCORES}})
    test = InductionTest(table, capture, start, length)
    if losses is not None and length >= 2:  # L = 1: no token of a copy after its first
        test.loss_first = float(losses[start:start + length - 1].mean())  # tokens start + 1 .. start + L - 1
        test.loss_second = float(losses[start + length:start + 2 * length - 1].mean())
    return test


@dataclass(frozen=True)
class FirstCopies:
    """A causal language model's pass over prefix + r of one seed, r's first `length` tokens: every head's weights
    (pattern [layer, head, p + length, p + length] float32), the logits [p + length, vocab] float32, and each
    layer's keys and values (kv); losses: lm.token_losses of those logits. A test of any L up to `length` starts
    from them (reuse_test)."""

    seed: int
    start: int
    ids: list[int]
    pattern: np.ndarray
    logits: torch.Tensor
    kv: tuple
    losses: np.ndarray

    @property
    def length(self) -> int:
        return len(self.ids) - self.start


def reuses_first_copies(loaded) -> bool:
    """Whether a test on `loaded` can start from FirstCopies: a causal language model whose every layer is softmax
    attention recorded through transformers' attention interface, with a plain KV cache (no sliding window)."""
    from transformers import DynamicCache

    model = loaded.model
    numbered = numbered_attention(model)
    if (not numbered or linear_plan(model) is not None or not lm.is_language_model(model)
            or getattr(model.config, "_attn_implementation", None) != ATTN_IMPLEMENTATION):
        return False
    module = next(iter(numbered.values()))
    if not (uses_interface(module) and is_causal(model, module)):
        return False
    layers = DynamicCache(config=model.config).layers
    return len(layers) == len(numbered) and all(type(layer).__name__ == "DynamicLayer" for layer in layers)


def first_copies(loaded, length: int, *, seed: int = 0) -> FirstCopies:
    """FirstCopies of this seed's r, its first `length` tokens (one pass over prefix + r)."""
    ids, start = _sequence(loaded, length, seed)
    ids = ids[:start + length]
    rows, logits, kv = _continued(loaded, None, 0, ids)
    return FirstCopies(seed, start, ids, _pattern(rows, len(ids)), logits, kv, lm.token_losses(logits, ids))


def reuse_test(loaded, length: int, *, seed: int = 0, first: FirstCopies | None = None, logits: bool = True
               ) -> tuple[InductionTest, FirstCopies]:
    """induction_test(loaded, length, seed=seed) on a model that reuses_first_copies: only the second copy runs when
    `first` (this seed's FirstCopies, or None) is at least `length` long; else one pass over the whole sequence.
    Returns the test and the longest FirstCopies known after it (first, or this test's own). logits=False: the
    test's capture keeps no logits (the losses are the same), and a test from the first copies joins none: at
    L = 200 on SmolLM2 that is 78 MB not copied."""
    if first is not None and first.seed != seed:
        raise ValueError(f"the first copies of seed {first.seed} cannot start a test of seed {seed}")
    ids, start = _sequence(loaded, length, seed)
    m, n = start + length, len(ids)
    if first is None or first.length < length:
        rows, all_logits, kv = _continued(loaded, None, 0, ids)
        pattern, losses = _pattern(rows, n), lm.token_losses(all_logits, ids)
        first = FirstCopies(seed, start, ids[:m], np.ascontiguousarray(pattern[:, :, :m, :m]), all_logits[:m].clone(),
                            tuple((k[:, :, :m].clone(), v[:, :, :m].clone()) for k, v in kv), losses[:m - 1].copy())
    else:  # the first copy's losses kept; the second's from its own logits and the first copy's last row
        rows, second, _ = _continued(loaded, first.kv, m, ids[m:])
        pattern = _pattern(rows, n, first.pattern[:, :, :m, :m])
        own = torch.cat([first.logits[m - 1:m], second])  # the first copy's last row predicts the second's first
        losses = np.concatenate([first.losses[:m - 1], lm.token_losses(own, ids[m - 1:])])
        all_logits = torch.cat([first.logits[:m - 1], own]) if logits else None
    config = loaded.model.config
    capture = AttentionCapture(
        tokens=readable_tokens(loaded.tokenizer, ids), token_ids=ids, layers=sorted(numbered_attention(loaded.model)),
        kv_head_of=core.kv_head_of(shape.n_heads(config), shape.n_kv_heads(config)), model_name=loaded.spec.name,
        causal=True, store="pattern", pattern=pattern)
    capture.logits = all_logits if logits else None
    return _test_of(capture, start, length, losses), first


def _continued(loaded, kv, past: int, chunk: list[int]) -> tuple[dict, torch.Tensor, tuple]:
    """transformers' forward pass over `chunk` after the first `past` positions of kv (each layer's keys and
    values; None when past is 0): each layer's rows {layer: [head, len(chunk), past + len(chunk)]} float32, the
    logits [len(chunk), vocab] float32, and each layer's keys and values after the chunk."""
    from transformers import DynamicCache

    model = loaded.model
    device = input_device(model)
    cache = DynamicCache([(k[:, :, :past], v[:, :, :past]) for k, v in kv], config=model.config) if past else None
    with recording_forward(model) as rec, torch.inference_mode():
        try:
            out = model(input_ids=torch.tensor([chunk], device=device), past_key_values=cache, use_cache=True,
                        attention_mask=torch.ones(1, past + len(chunk), dtype=torch.long, device=device))
        except Exception as exc:  # a user's model that cannot run this sequence: a message, not a traceback
            raise CaptureError(f"{loaded.spec.name} failed on the repeated sequence ({type(exc).__name__}).") from exc
    return rec.pattern, out.logits[0].float().cpu(), tuple((x.keys, x.values) for x in out.past_key_values.layers)


def _pattern(rows: dict, n: int, above=None) -> np.ndarray:
    """[layer, head, n, n] float32: `above` ([layer, head, m, m], the first m positions' weights; None: m = 0) in
    the top left, nothing right of it, and under it each layer's rows ({layer: [head, n - m, n]}, in layer order),
    each copied once."""
    layers = sorted(rows)
    m = 0 if above is None else above.shape[-1]
    out = np.empty((len(layers), rows[layers[0]].shape[0], n, n), np.float32)
    for i, layer in enumerate(layers):
        if m:
            out[i, :, :m, :m] = above[i]
            out[i, :, :m, m:] = 0.0
        out[i, :, m:] = rows[layer]
    return out
