"""Words from tokens, and one head's attention merged from tokens into words (AttentionCapture.by_words).

Word boundaries, one rule for every tokenizer, read from where each token's characters lie in the text (a fast
tokenizer's offset_mapping, at capture time):
- a word is a run of letters and digits (regex \\w+), or one other visible character (punctuation: "." "'" "#");
- a token never splits: a token covering several of these joins them into one word ("'s" of GPT-2), and tokens
  sharing one (the pieces of "unaffable", the two byte tokens of "é") are one word;
- whitespace belongs to the word after it ("␣cat", as GPT-2's "Ġcat" and SentencePiece's "▁cat" have it); whitespace
  with no word after it (at the end, or before a special token) is a word of its own;
- special tokens ([CLS], [SEP], <bos>, ...) are words of their own.
So "The cat's mat." is [The] [␣cat] ['s] [␣mat] [.] in GPT-2's tokens, and [The] [␣cat] ['] [s] [␣mat] [.] in BERT's
or a byte tokenizer's. A tokenizer's own word_ids() is not used: a byte-level one calls every byte a word.

Without offsets (from_attentions, a capture file written before they were kept, token_ids given), the text is
rebuilt from the readable tokens: ␣ ↵ ⇥ ␍ and GPT-2's Ġ Ċ and SentencePiece's ▁ read as whitespace, a byte piece
(<0xC3>) as a letter, <...>, <|...|> and [UPPER] tokens as special; tokens with no space marker at all are read as
WordPiece's (BERT's): each starts a word unless it starts with ##.

The merge is Clark et al. 2019 ("What Does BERT Look At?", §4): for each head, attention TO a word is the sum of its
tokens' columns (keys summed), attention FROM a word is the mean of its tokens' rows (queries averaged). Each token's
row sums to 1; summing keys keeps that sum and averaging rows keeps it, so each word's row sums to 1 (minus its
mean learned-sink weight, for a model with one).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from attnviz.capture.modules import CaptureError

UNIT = re.compile(r"\w+|[^\w\s]")  # a run of letters and digits, or one other visible character
SPECIAL = re.compile(r"<\|[^<>|]*\|>|</?[A-Za-z_][\w.\-]*>|\[[A-Z_]+\]")  # <bos> </s> <|endoftext|> [CLS]
BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # attnviz.tokenizer.readable_tokens' piece of a multi-byte character
SPACE_MARKERS = "␣↵⇥␍ĠĊ▁"
_AS_WHITESPACE = str.maketrans({"␣": " ", "↵": "\n", "⇥": "\t", "␍": "\r", "Ġ": " ", "Ċ": "\n", "▁": " "})

SPECIAL_KIND, SPACE_KIND, TEXT_KIND = 0, 1, 2


def token_words(text: str, offsets, special) -> list[int]:
    """Each token's word number (0, 1, ... in order) by the rule of the module docstring.

    offsets: [token] (start, end) character spans in `text` (a fast tokenizer's offset_mapping); special: [token]
    True for special tokens (their offsets are ignored)."""
    spans = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    special = np.asarray(special, dtype=bool)
    n_chars = len(text)
    unit_of = np.full(n_chars + 1, -1, dtype=np.int64)  # each character's unit; -1 for whitespace (and the end)
    for u, match in enumerate(UNIT.finditer(text)):
        unit_of[match.start():match.end()] = u
    at = np.arange(n_chars + 1)
    first_visible = np.minimum.accumulate(np.where(unit_of >= 0, at, n_chars)[::-1])[::-1]  # first at or after c
    last_visible = np.maximum.accumulate(np.where(unit_of >= 0, at, -1))  # last at or before c
    start, end = np.clip(spans[:, 0], 0, n_chars), np.clip(spans[:, 1], 0, n_chars)
    visible = (end > start) & (first_visible[start] < end)
    kind = np.where(special, SPECIAL_KIND, np.where(visible, TEXT_KIND, SPACE_KIND))
    lo = np.where(visible, unit_of[first_visible[start]], -1)  # the first and last units a token covers
    hi = np.where(visible, unit_of[last_visible[np.maximum(end - 1, 0)]], -1)
    return _numbered(kind, lo, hi)


def _numbered(kind: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> list[int]:
    """Word numbers from each token's kind and the units it covers: where a new word starts."""
    if kind.size == 0:
        return []
    prev_kind = np.concatenate([[SPECIAL_KIND], kind[:-1]])  # before the first token: as after a special token
    prev_hi = np.concatenate([[-1], hi[:-1]])
    starts = ((kind == SPECIAL_KIND) | (prev_kind == SPECIAL_KIND)
              | ((kind == SPACE_KIND) & (prev_kind == TEXT_KIND))  # whitespace after a word opens the next one
              | ((kind == TEXT_KIND) & (prev_kind == TEXT_KIND) & (lo > prev_hi)))  # no unit shared
    return (np.cumsum(starts) - 1).tolist()


def words_from_tokens(tokens: Sequence[str]) -> list[int]:
    """Each token's word number, read from readable token strings alone (no offsets): the module docstring's
    fallback. The text is rebuilt from the tokens, with their offsets, and read by token_words."""
    special = [bool(SPECIAL.fullmatch(t)) for t in tokens]
    wordpiece = not any(m in t for t in tokens for m in SPACE_MARKERS)
    pieces = []
    for t, is_special in zip(tokens, special):
        if is_special:
            pieces.append("")
        elif wordpiece:
            pieces.append(t[2:] if t.startswith("##") and len(t) > 2 else " " + t)
        else:
            pieces.append(BYTE_PIECE.sub("x", t).translate(_AS_WHITESPACE))
    ends = np.cumsum([len(p) for p in pieces])
    return token_words("".join(pieces), np.stack([ends - [len(p) for p in pieces], ends], axis=1), special)


def word_spans(words: Sequence[int | None]) -> list[tuple[int, int]]:
    """Each word's tokens as (start, stop), from one word number per token, as transformers' word_ids() gives
    them: consecutive tokens with the same number are one word; None (a special token) is a word of its own. A word
    whose tokens are not consecutive is refused."""
    spans: list[list[int]] = []
    for t, w in enumerate(words):
        if t and w is not None and w == words[t - 1]:
            spans[-1][1] = t + 1
        else:
            spans.append([t, t + 1])
    numbers = [words[a] for a, _ in spans if words[a] is not None]
    if len(numbers) != len(set(numbers)):
        again = next(w for i, w in enumerate(numbers) if w in numbers[:i])
        raise CaptureError(f"The tokens of word {again} are not consecutive: a word must be a run of tokens.")
    return [(a, b) for a, b in spans]


def word_strings(tokens: Sequence[str], spans: Sequence[tuple[int, int]]) -> list[str]:
    """Each word's readable string: its tokens joined, WordPiece's ## dropped from the pieces after the first, and
    byte pieces that make whole characters together (<0xC3><0xA9>) shown as those characters (é)."""
    joined = ["".join(t[2:] if i > a and t.startswith("##") and len(t) > 2 else t
                      for i, t in enumerate(tokens[a:b], start=a)) for a, b in spans]
    return [_BYTE_RUN.sub(_decoded, w) for w in joined]


_BYTE_RUN = re.compile(r"(?:<0x[0-9A-Fa-f]{2}>)+")


def _decoded(match: re.Match) -> str:
    raw = bytes(int(h, 16) for h in re.findall(r"<0x([0-9A-Fa-f]{2})>", match.group()))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return match.group()


def merged_layer(rows_of: Callable[[int, int], np.ndarray], n: int, spans: Sequence[tuple[int, int]],
                 block: int = 256) -> np.ndarray:
    """One layer's attention merged into words, Clark et al. 2019 §4: [head, word, word] float64, where
    out[h, v, w] = mean over the query tokens i of word v of (sum over the key tokens j of word w of weight[h, i, j]).

    rows_of(start, stop): the layer's weights [head, stop - start, key] for queries start .. stop - 1 (read from
    the dense pattern, or computed from q and k: no N x N array); read `block` query rows at a time."""
    starts = np.array([a for a, _ in spans], dtype=np.int64)
    sizes = np.array([b - a for a, b in spans], dtype=np.int64)
    word_of = np.repeat(np.arange(len(spans)), sizes)  # [token]
    out = None
    for a in range(0, n, block):
        b = min(n, a + block)
        rows = np.asarray(rows_of(a, b), dtype=np.float64)  # [head, b - a, key]
        to_words = np.add.reduceat(rows, starts, axis=-1)  # [head, b - a, word]: keys summed
        first = np.flatnonzero(np.diff(word_of[a:b], prepend=-1))  # where each word's rows begin in this block
        if out is None:
            out = np.zeros((rows.shape[0], len(spans), len(spans)))
        out[:, word_of[a:b][first]] += np.add.reduceat(to_words, first, axis=1)  # queries summed ...
    return out / sizes[None, :, None]  # ... and averaged


def merged_queries(values: np.ndarray, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """A per-query quantity [..., query] (a learned sink's weight) averaged over each word's tokens: [..., word]."""
    starts = np.array([a for a, _ in spans], dtype=np.int64)
    sizes = np.array([b - a for a, b in spans], dtype=np.float64)
    return np.add.reduceat(np.asarray(values, dtype=np.float64), starts, axis=-1) / sizes


def query_positions(queries, n: int) -> np.ndarray:
    """The sorted distinct query positions named by `queries`: an int, a span (start, stop) as a tuple of two ints
    (0 <= start < stop <= n), a slice, a boolean mask of n, or any other collection of positions (a list, set,
    range or array)."""
    if isinstance(queries, slice):
        positions = np.arange(n)[queries]
    elif isinstance(queries, tuple) and len(queries) == 2 and all(isinstance(x, (int, np.integer)) for x in queries):
        start, stop = int(queries[0]), int(queries[1])
        if not 0 <= start < stop <= n:
            raise CaptureError(f"A span (start, stop) needs 0 <= start < stop <= {n}; got ({start}, {stop}).")
        positions = np.arange(start, stop)
    else:
        if isinstance(queries, (set, frozenset)):
            queries = sorted(queries)
        raw = np.asarray(queries).reshape(-1)
        if raw.dtype == bool and raw.size == n:  # a mask over the queries
            raw = np.flatnonzero(raw)
        if raw.size and not np.issubdtype(raw.dtype, np.integer):
            raise CaptureError(f"Query positions must be whole numbers; got {queries!r}.")
        positions = np.unique(raw.astype(np.int64))
        if positions.size and not (0 <= positions[0] and positions[-1] < n):
            raise CaptureError(f"Query positions must lie in 0 .. {n - 1}; got {positions.min()} .. {positions.max()}.")
    if positions.size == 0:
        raise CaptureError("No query positions: name at least one.")
    return positions


def runs(positions: np.ndarray) -> list[tuple[int, int]]:
    """Sorted distinct positions as maximal runs of consecutive ones, (start, stop) each."""
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    return [(int(p[0]), int(p[-1]) + 1) for p in np.split(positions, breaks)]
