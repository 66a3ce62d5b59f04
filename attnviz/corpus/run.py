"""corpus_run: every head's statistics on every window of every document of a data set, written shard by shard
into a run folder (attnviz.corpus.store), resumable after a kill, on this machine (engine="local") or on a Ray
cluster (engine="ray", attnviz.corpus.ray) through the same shard function, attnviz.corpus.shards.shard_rows.

A window is what attnviz.corpus.text_windows cuts from a document: `window` tokens of its text, with the
tokenizer's start and end tokens as a text of its own would have them. Each runs through the model on its own; its
statistics are the ones attnviz.stats.head_stats gives for that text, computed during the forward pass where the
family records q and k (streaming_attend), from the dense pattern otherwise.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from attnviz.capture.lending import lent
from attnviz.corpus import shards
from attnviz.corpus.ray import run_on_ray
from attnviz.corpus.sources import CorpusError, fingerprint, read_documents
from attnviz.corpus.store import FORMAT, RunFolder
from attnviz.corpus.windows import text_windows
from attnviz.corpus.results import CorpusRun

SHARD_WINDOWS = 16  # windows per shard: what a kill can lose, and what one Ray task computes
ENGINES = ("local", "ray")


def corpus_run(model, data: str | Path | Sequence[str | Path], *, window: int | Sequence[int], out: str | Path,
               engine: str = "local", field: str = "text", max_windows: int | None = None, tokenizer=None,
               progress: Callable[[int, int], None] | None = None, names: Sequence[str] | None = None,
               shard_windows: int = SHARD_WINDOWS, actors: int | None = None, name: str | None = None):
    """Every head's statistics on every window of `data`, written to the run folder `out`; returns the finished
    run (attnviz.corpus.results.CorpusRun: summary, top, sql, compare).

    model: a name, a folder, a .gguf file, an attnviz LoadedModel, or a transformers model object with its
    `tokenizer` (lent and left as it was). data: .txt files or folders of them, .jsonl files (text in `field`),
    .parquet files (text in column `field`), or a folder saved by datasets' save_to_disk. window: one length in
    tokens or several (each document is cut at each length: statistics against context length). max_windows: at
    most this many windows per length, in document order. A run killed and started again with the same arguments
    goes on from its last whole shard; other arguments into the same folder are refused. progress(done, total)
    in windows. names: how the data is named in messages and in the run (default: each file or folder's own
    name). actors: Ray's actor pool size (engine="ray"). name: how messages call the run folder (default: `out`
    as given; a page passes the run's name)."""
    if engine not in ENGINES:
        raise CorpusError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}.")
    if engine == "ray" and not isinstance(model, (str, Path)):
        raise CorpusError("engine='ray' needs the model as a name, a folder or a .gguf file, which each Ray actor "
                          "loads itself: a model object cannot be sent to the cluster.")
    paths = [data] if isinstance(data, (str, Path)) else list(data)
    lengths = sorted({int(w) for w in ([window] if isinstance(window, int) else window)})
    with lent(model, tokenizer, usage="corpus_run(model, data, tokenizer=tokenizer, ...)", error=CorpusError,
              kernels=True) as loaded:
        _check_windows(loaded, lengths, max_windows)
        documents = read_documents(paths, field=field, names=names)
        plan = window_plan(loaded.tokenizer, documents, lengths, max_windows)
        folder = RunFolder(out, name)
        folder.start(_manifest(loaded, documents, lengths, max_windows, field, len(plan), shard_windows), plan)
        if engine == "ray":
            run_on_ray(model, tokenizer, folder, progress=progress, actors=actors)
        else:
            run_local(loaded, folder, progress=progress)
    return CorpusRun(out, name)


def _check_windows(loaded, lengths: list[int], max_windows: int | None) -> None:
    if not lengths or lengths[0] < 2:
        raise CorpusError("A window needs at least 2 tokens.")
    limit = loaded.shape.max_positions if loaded.shape is not None else None
    if limit and lengths[-1] + 2 > limit:
        raise CorpusError(f"A window of {lengths[-1]:,} tokens is longer than {loaded.spec.name}'s context "
                          f"({limit:,} tokens, start and end tokens included).")
    if max_windows is not None and max_windows < 1:
        raise CorpusError("max_windows must be at least 1.")


def window_plan(tokenizer, documents, lengths: list[int], max_windows: int | None) -> pd.DataFrame:
    """One row per window, in run order (by length, then document, then offset): window_id, window, doc, source,
    offset (of its first token in the document's tokens), n_tokens (with start and end tokens), text (its tokens
    decoded), ids (the window's token ids, int32)."""
    rows = []
    for length in lengths:
        left = max_windows if max_windows is not None else sys.maxsize
        for doc, document in enumerate(documents):
            if left == 0:
                break  # the documents after the last window taken are not tokenized
            for offset, ids in text_windows(tokenizer, document.text, length)[:left]:
                rows.append((length, doc, document.source, offset, len(ids),
                             tokenizer.decode(ids, skip_special_tokens=True), np.asarray(ids, dtype=np.int32)))
                left -= 1
    if not rows:
        raise CorpusError("The documents hold no window: each is shorter than 2 tokens.")
    plan = pd.DataFrame(rows, columns=["window", "doc", "source", "offset", "n_tokens", "text", "ids"])
    plan.insert(0, "window_id", np.arange(len(plan), dtype=np.int64))
    return plan


def _manifest(loaded, documents, lengths, max_windows, field, n_windows: int, shard_windows: int) -> dict:
    import attnviz

    return {
        "format": FORMAT, "attnviz": attnviz.__version__,
        "model": display_name(loaded.spec.name), "model_fingerprint": shards.model_fingerprint(loaded.model),
        "family": loaded.spec.family, "layers": loaded.shape.layers, "heads": loaded.shape.heads,
        "tokenizer": type(loaded.tokenizer).__name__, "tokenizer_fingerprint": tokenizer_fingerprint(loaded.tokenizer),
        "windows": lengths, "max_windows": max_windows, "field": field,
        "data": sorted({d.source.split(" line ")[0].split(" row ")[0] for d in documents}),
        "documents": len(documents), "data_fingerprint": fingerprint(documents),
        "n_windows": n_windows, "shard_windows": shard_windows, "n_shards": -(-n_windows // shard_windows),
    }


def display_name(model: str) -> str:
    """A model's name as a run records and shows it: a registry name as it is, a folder or file by its own name
    (the manifest may be read by a page's visitors, who see no place on the server)."""
    return Path(model).name if ("/" in model or os.sep in model) and Path(model).exists() else model


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of what the tokenizer does: a fast tokenizer's whole definition (vocabulary, merges, normaliser and
    special tokens), else its vocabulary."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def run_local(loaded, folder: RunFolder, *, progress=None) -> None:
    """Every shard not yet in the folder, in order, on this machine."""
    manifest = folder.manifest()
    size, n_shards = manifest["shard_windows"], manifest["n_shards"]
    plan = folder.windows(columns=["window_id", "ids"])
    done = folder.done_shards()
    finished = sum(min(size, len(plan) - s * size) for s in done)
    if progress is not None:
        progress(finished, len(plan))
    for shard in range(n_shards):
        if shard in done:
            continue
        part = plan.iloc[shard * size:(shard + 1) * size]
        folder.write_shard(shard, shards.shard_rows(loaded, part["window_id"].tolist(), part["ids"].tolist()))
        finished += len(part)
        if progress is not None:
            progress(finished, len(plan))


class Rate:
    """Windows per second and time left, for a progress line: rate.line(done, total)."""

    def __init__(self):
        self.started, self.first = time.perf_counter(), None

    def line(self, done: int, total: int) -> str:
        now = time.perf_counter()
        if self.first is None:
            self.first = (now, done)  # windows done before this run started (a resumed run) do not count
        seconds, counted = now - self.first[0], done - self.first[1]
        if counted <= 0 or seconds <= 0:
            return f"{done:,}/{total:,} windows"
        rate = counted / seconds
        return f"{done:,}/{total:,} windows, {rate:.2f} windows/s, {_duration((total - done) / rate)} left"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
