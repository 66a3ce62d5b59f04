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

capture_token_ids captures any token ids (the sequence above, windows of a long text) through capture_attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnviz.capture import AttentionCapture, CaptureError, capture_attention
from attnviz.stats import induction_score, previous_token_score
from attnviz import lm

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
    r = np.random.default_rng(seed).choice(candidates, size=length, replace=False).tolist()
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
    and of the second copy (after its first), None for an encoder."""

    scores: pd.DataFrame
    capture: AttentionCapture
    start: int
    length: int
    loss_first: float | None = None
    loss_second: float | None = None


def induction_test(loaded, length: int = 50, *, seed: int = 0, layers=None) -> InductionTest:
    """The repeated-random-tokens test on `loaded` (every captured head's SCORES, and for a language model the
    loss on each copy)."""
    vocab = loaded.shape.vocab if loaded.shape is not None else len(loaded.tokenizer)
    ids, start = repeated_random_tokens(loaded.tokenizer, vocab, length, seed=seed)
    language = lm.is_language_model(loaded.model)
    capture = capture_token_ids(loaded, ids, layers=layers, with_logits=language)  # one pass: maps and loss
    scores = repeated_token_scores(capture.pattern, length, start)  # each [layer, head]
    n_layers, n_heads = capture.pattern.shape[:2]
    table = pd.DataFrame({"layer": np.repeat(capture.layers, n_heads), "head": np.tile(np.arange(n_heads), n_layers),
                          **{name: scores[name].ravel() for name in SCORES}})
    test = InductionTest(table, capture, start, length)
    if language:
        losses = lm.token_losses(capture.logits, ids)  # losses[t]: token t + 1
        test.loss_first = float(losses[start:start + length - 1].mean())  # tokens start + 1 .. start + L - 1
        test.loss_second = float(losses[start + length:start + 2 * length - 1].mean())
    return test
