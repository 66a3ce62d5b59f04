"""A visitor's own small run on the Corpus page: pasted texts or an upload checked, written to this session's
temporary folder, run within the memory budget with its progress shown, and listed for the session (attnviz.ui.corpus
lists and reads every run).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import streamlit as st

from attnviz.corpus import CorpusError
from attnviz.ui import links
from attnviz.ui.corpus import (MAX_SESSION_RUNS, MAX_UPLOAD_MB, MAX_WINDOWS, MINE, SEPARATOR, UPLOAD_TYPES,
                               listed_models, model_shown)

log = logging.getLogger("attnviz")


def pasted_texts(pasted: str) -> list[str] | None:
    """The texts of a paste (a line holding only SEPARATOR starts the next; empty ones are left out), or None after
    a message when there is none."""
    from attnviz import ui

    if len(pasted) > ui.MAX_TEXT_CHARS:
        st.error(f"The paste is {len(pasted):,} characters; the limit is {ui.MAX_TEXT_CHARS:,}. Shorten it, or "
                 "upload a file.")
        return None
    texts, current = [], []
    for line in pasted.splitlines():
        if line.strip() == SEPARATOR:
            texts.append("\n".join(current))
            current = []
        else:
            current.append(line)
    texts = [t for t in (*texts, "\n".join(current)) if t.strip()]
    if not texts:
        st.error("The paste is empty: paste at least one text (a line holding only --- starts the next).")
        return None
    return texts


def upload_checked(upload) -> bytes | None:
    """The bytes of an uploaded file when its kind and size are ones the page reads, else None after a message
    (what is inside is checked by attnviz.corpus.read_documents)."""
    if upload is None:
        st.error("Choose a file to upload first (.txt, .jsonl or .parquet).")
        return None
    suffix = Path(upload.name).suffix.lower().lstrip(".")
    if suffix not in UPLOAD_TYPES:
        st.error(f"{links.shown('file', upload.name)} is not a .txt, .jsonl or .parquet file.")
        return None
    data = upload.getvalue()
    if len(data) > MAX_UPLOAD_MB * 2**20:
        st.error(f"The file is {len(data) / 2**20:.1f} MB, over the {MAX_UPLOAD_MB} MB this page reads. Start a "
                 "run on it from the command line instead.")
        return None
    return data


def _session_folder() -> Path:
    """This session's temporary folder (made on first use; removed when the session ends and its state is
    dropped, by TemporaryDirectory's own finaliser)."""
    held = st.session_state.get("corpus_tmp")
    if held is None or not Path(held.name).is_dir():
        held = tempfile.TemporaryDirectory(prefix="attnviz-corpus-")
        st.session_state["corpus_tmp"] = held
    return Path(held.name)


def _page_words(message: str, folder: Path, name: str) -> str:
    """A library message as the page says it: the run's folder named by the run's name, and the field's
    command-line option named by the page's box."""
    return (message.replace(str(folder), name).replace("with --field", "in the box 'Text field or column'")
            .replace("--field", "the box 'Text field or column'"))


def start_run(model: str | None, texts: list[str] | None, upload: tuple[str, bytes] | None, field: str,
              windows: list[int], max_windows: int) -> str | None:
    """A run of `model` over the pasted `texts` or the uploaded (file name, bytes), at each window length, at most
    max_windows windows per length, in this session's temporary folder: checked (the windows against the model's
    context, the data by attnviz.corpus.read_documents), admitted by the memory budget for its largest window, its
    progress shown (windows per second and time left). Returns the new run's name, or None after a message."""
    from attnviz import budget, ui
    from attnviz.capture import CaptureError, records_inputs
    from attnviz.corpus import corpus_run, read_documents
    from attnviz.corpus.run import Rate

    if model is None or (texts is None and upload is None):
        return None
    loaded = _checked_model(model, windows, max_windows)
    if loaded is None:
        return None
    count = st.session_state.get("corpus_count", 0) + 1
    label = upload[0] if upload is not None else ("pasted text" if len(texts) == 1 else f"{len(texts)} pasted texts")
    name = f"{MINE}{count}: {label}, {model if model in listed_models() else Path(model).name}"
    inputs, folder, paths, names = _written_inputs(count, texts, upload)
    finished = False
    try:
        read_documents(paths, field=field, names=names)  # the data's own faults, said before any model runs
        store = "qk" if records_inputs(loaded.model) else "pattern"  # what corpus_run's window_stats captures
        need = ui.capture_need(loaded, max(windows) + 2, None, store)
        waiting, bar, rate = st.empty(), st.progress(0.0, text=f"Starting {name}…"), Rate()

        def on_wait(held, position):
            waiting.info(f"Waiting for memory: other visitors' work holds {held / 2**30:.1f} GiB of the "
                         f"{budget.BUDGET.limit / 2**30:.1f} GiB budget ({position} ahead). It starts by itself.")

        def progress(done, total):
            waiting.empty()
            bar.progress(min(1.0, done / max(total, 1)), text=f"{name}: {rate.line(done, total)}")

        with budget.BUDGET.admit(need, what=f"A run with windows of {max(windows):,} tokens", on_wait=on_wait,
                                 on_poll=lambda: None, keep=(model, ui.model_version(model))):
            corpus_run(loaded, paths, window=windows, out=folder, field=field, max_windows=max_windows,
                       progress=progress, names=names)
        bar.empty()
        finished = True
    except (CorpusError, CaptureError, budget.OverBudget) as exc:
        log.info("a run started on the Corpus page stopped: %s", exc)
        st.error(_page_words(str(exc), folder, name))
        return None
    finally:
        shutil.rmtree(inputs, ignore_errors=True)
        if not finished:  # refused, failed, or stopped by the visitor: nothing half-made is listed
            shutil.rmtree(folder, ignore_errors=True)
    _keep_run(name, folder, count)
    return name


def _checked_model(model: str, windows: list[int], max_windows: int):
    """The loaded model when the settings fit it (a window, at most MAX_WINDOWS, windows within its context), else
    None after a message."""
    from attnviz import ui

    if not windows:
        st.error("Choose at least one window length.")
        return None
    if not 1 <= max_windows <= MAX_WINDOWS:
        st.error(f"A run started here takes 1 to {MAX_WINDOWS} windows per length; larger runs are started from "
                 "the command line.")
        return None
    loaded = ui.get_model(model)
    if loaded is None:
        return None
    limit = loaded.shape.max_positions
    if limit and max(windows) + 2 > limit:
        st.error(f"A window of {max(windows):,} tokens is too long for {model_shown(model)}: it reads "
                 f"{limit:,} tokens at once, its start and end tokens included. Choose shorter windows.")
        return None
    return loaded


def _written_inputs(count: int, texts: list[str] | None, upload: tuple[str, bytes] | None):
    """(inputs folder, run folder, the input files, their names) in this session's folder, the texts or the upload
    written there."""
    base = _session_folder()
    inputs, folder = base / f"inputs-{count}", base / f"run-{count}"
    shutil.rmtree(inputs, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)
    inputs.mkdir(parents=True)
    if upload is not None:
        paths, names = [inputs / f"upload{Path(upload[0]).suffix.lower()}"], [upload[0]]
        paths[0].write_bytes(upload[1])
    else:
        paths = [inputs / f"text-{i}.txt" for i in range(len(texts))]
        names = [f"pasted text {i + 1}" for i in range(len(texts))]
        for path, text in zip(paths, texts):
            path.write_text(text, encoding="utf-8")
    return inputs, folder, paths, names


def _keep_run(name: str, folder: Path, count: int) -> None:
    """The finished run listed for this session; its oldest beyond MAX_SESSION_RUNS deleted."""
    mine = dict(st.session_state.get("corpus_mine", {}))
    mine[name] = str(folder)
    while len(mine) > MAX_SESSION_RUNS:
        oldest = next(iter(mine))
        shutil.rmtree(mine.pop(oldest), ignore_errors=True)
    st.session_state["corpus_mine"] = mine
    st.session_state["corpus_count"] = count
