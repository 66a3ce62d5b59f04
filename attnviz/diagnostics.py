"""The standard induction test, independent of the user's text: a random token sequence of length L repeated twice.

On [prefix] r_0 … r_{L-1} r_0 … r_{L-1} (prefix: the start token the tokenizer adds, if any; the L tokens distinct,
drawn from the ordinary vocabulary with a seeded generator), each query in the second copy, q = p + L + i, has one
earlier occurrence of its own token, at p + i. Per head, averaged over the L queries of the second copy:

- prefix_matching  the weight on p + i + 1, the token AFTER the earlier occurrence: the attention an induction head
                   pays ("[A][B] … [A] -> look at [B]", Olsson et al. 2022, "In-context learning and induction
                   heads"; TransformerLens's induction score is this same stripe)
- duplicate_token  the weight on p + i, the earlier occurrence itself (duplicate-token heads, Wang et al. 2022)
- previous_token   the weight on q - 1 (previous-token heads, the induction circuit's first half)

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


def repeated_token_scores(pattern: np.ndarray, length: int, start: int) -> dict[str, np.ndarray]:
    """pattern [..., query, key] of a sequence whose tokens start .. start + L - 1 repeat at start + L ..
    start + 2L - 1 -> {score: [...]} float64 (see the module docstring), each a mean over the L queries of the
    second copy."""
    p = np.asarray(pattern)
    i = np.arange(length)
    q = start + length + i
    return {"prefix_matching": p[..., q, start + i + 1].astype(np.float64).mean(-1),
            "duplicate_token": p[..., q, start + i].astype(np.float64).mean(-1),
            "previous_token": p[..., q, q - 1].astype(np.float64).mean(-1)}


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
    from attnviz import lm

    vocab = loaded.shape.vocab if loaded.shape is not None else len(loaded.tokenizer)
    ids, start = repeated_random_tokens(loaded.tokenizer, vocab, length, seed=seed)
    capture = capture_token_ids(loaded, ids, layers=layers)
    scores = repeated_token_scores(capture.pattern, length, start)  # each [layer, head]
    n_layers, n_heads = capture.pattern.shape[:2]
    table = pd.DataFrame({"layer": np.repeat(capture.layers, n_heads), "head": np.tile(np.arange(n_heads), n_layers),
                          **{name: scores[name].ravel() for name in SCORES}})
    test = InductionTest(table, capture, start, length)
    if lm.is_language_model(loaded.model):
        losses = lm.token_losses(lm.next_token_logits(loaded.model, ids)[0], ids)  # losses[t]: token t + 1
        test.loss_first = float(losses[start:start + length - 1].mean())  # tokens start + 1 .. start + L - 1
        test.loss_second = float(losses[start + length:start + 2 * length - 1].mean())
    return test
