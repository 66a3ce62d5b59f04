"""Per-head statistics averaged over many texts: a long text (or an uploaded file) cut into windows of tokens, each
window run through the model on its own, and the head_stats of every window averaged head by head. Two models (or
two toy-lab checkpoints) are then compared head by head where their layers and heads match.

One text says little about a head: a sink or an induction score can come from the text's own shape. Averaged over
windows, a head's role is the one it plays on the language, and the spread over windows says how steady it is.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from attnviz.corpus.sources import CorpusError
from attnviz.diagnostics import capture_token_ids, special_tokens
from attnviz.stats import COLUMNS, head_stats

MAX_WINDOWS = 64


def token_windows(loaded, text: str, window: int, *, max_windows: int = MAX_WINDOWS) -> list[list[int]]:
    """The text's tokens cut into consecutive windows of `window` tokens (the last, shorter one kept when it has at
    least half a window), each with the tokenizer's start and end tokens ([BOS], [CLS] … [SEP]) as a text of its own
    would have them. At most max_windows, from the start."""
    return [ids for _, ids in text_windows(loaded.tokenizer, text, window)[:max_windows]]


def text_windows(tokenizer, text: str, window: int) -> list[tuple[int, list[int]]]:
    """Every window of token_windows, as (offset of its first token in the text's tokens without the start and end
    tokens, the window's ids with them)."""
    if window < 2:
        raise ValueError("A window needs at least 2 tokens.")
    prefix, suffix = special_tokens(tokenizer)
    ids = list(tokenizer(text).input_ids)
    body = ids[len(prefix):len(ids) - len(suffix) if suffix else None]
    return [(a, prefix + body[a:b] + suffix) for a, b in window_spans(len(body), window)]


def window_spans(n_tokens: int, window: int) -> list[tuple[int, int]]:
    """(start, stop) of each window over n_tokens tokens: consecutive, `window` long, the last shorter one kept when
    it has at least half a window (and at least 2 tokens), or when it is the only one."""
    spans = []
    for a in range(0, n_tokens, window):
        b = min(n_tokens, a + window)
        if b - a < max(2, window // 2) and spans:
            break
        spans.append((a, b))
    return spans


def corpus_stats(loaded, windows: list[list[int]], *, layers=None,
                 progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """head_stats of each window, averaged: one row per (layer, head) with kv_head, the mean of each column of
    attnviz.stats.COLUMNS over the windows (induction over the windows where a token repeats), `<column>_std` the
    spread over windows, and n_windows. progress(done, total) after each window."""
    if not windows:
        raise ValueError("No windows: the text is empty.")
    tables = []
    for i, ids in enumerate(windows):
        tables.append(head_stats(capture_token_ids(loaded, ids, layers=layers)))
        if progress is not None:
            progress(i + 1, len(windows))
    stacked = pd.concat(tables, keys=range(len(tables)), names=["window", None])
    grouped = stacked.groupby(["layer", "head"], sort=True)
    out = grouped[["kv_head"]].first()
    for column in COLUMNS:
        out[column] = grouped[column].mean()  # NaN (no repeated token in a window) left out
        out[f"{column}_std"] = grouped[column].std(ddof=0)
    out["n_windows"] = len(windows)
    out = out.reset_index()
    out.attrs["n_tokens"] = sum(len(w) for w in windows)
    return out


def compare_heads(a: pd.DataFrame, b: pd.DataFrame, column: str) -> pd.DataFrame:
    """Head by head: a[column], b[column] and a - b, for two statistics tables of models with the same layers and
    heads (a ValueError says what differs otherwise)."""
    shape_a = (a["layer"].nunique(), a["head"].nunique())
    shape_b = (b["layer"].nunique(), b["head"].nunique())
    if set(zip(a["layer"], a["head"])) != set(zip(b["layer"], b["head"])):
        raise CorpusError(f"The two models' heads do not match ({shape_a[0]} layers x {shape_a[1]} heads against "
                         f"{shape_b[0]} x {shape_b[1]}): compare models of the same shape, such as two toy-lab "
                         "checkpoints of one configuration.")
    merged = a[["layer", "head", column]].merge(b[["layer", "head", column]], on=["layer", "head"],
                                                suffixes=("_a", "_b"))
    merged["difference"] = merged[f"{column}_a"] - merged[f"{column}_b"]
    return merged.sort_values(["layer", "head"]).reset_index(drop=True)


def layer_means(table: pd.DataFrame, column: str) -> pd.Series:
    """Each layer's mean of `column` over its heads (NaN heads left out), indexed by layer: the per-layer curve two
    models of different shapes are compared on (against attnviz.shape.ModelShape.relative_depth)."""
    return table.groupby("layer", sort=True)[column].mean()


def window_summary(windows: list[list[int]]) -> str:
    """'8 windows of 256 tokens' (the last one shorter when it is)."""
    sizes = [len(w) for w in windows]
    if not sizes:
        return "no windows"
    same = len(set(sizes)) == 1
    return (f"{len(sizes)} window{'s' if len(sizes) > 1 else ''} of {sizes[0]:,} tokens"
            + ("" if same else f" (the last {sizes[-1]:,})"))

