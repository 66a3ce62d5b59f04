"""The Corpus page's runs and caches: the operator's runs folder (ui.runs_dir) and this session's own small runs,
listed by name; each run's tables (CorpusRun.summary, top, against_length, compare) computed once per run and state
of its files; a visitor's upload or pasted texts checked, then run through corpus_run within the memory budget.

Visitors see names only. A run is opened as CorpusRun(folder, name=its name), so the library's messages say the
name; an upload is named by the name it was uploaded under. What only the operator should see (a folder, a
library's exception) goes to the server log.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import streamlit as st

from attnviz.corpus import CorpusError, CorpusRun
from attnviz.stats import COLUMNS
from attnviz.ui import links

log = logging.getLogger("attnviz")

MANIFEST = "manifest.json"  # attnviz.corpus.store.MANIFEST: a subfolder holding it is a run
WINDOW_CHOICES = (16, 32, 64, 128, 256, 512)
MAX_LENGTHS = 3  # window lengths a run started here may have
MAX_WINDOWS = 64  # windows per length a run started here may have; larger runs: `attnviz corpus run`
MAX_UPLOAD_MB = 2  # as .streamlit/config.toml's maxUploadSize, the app's other uploads
UPLOAD_TYPES = ("txt", "jsonl", "parquet")
SEPARATOR = "---"  # a pasted line holding only this starts the next text
MAX_SESSION_RUNS = 4  # a session's own runs kept at once; the oldest goes first
MINE = "yours/"  # a session run's name starts with it: no folder name holds "/", so it never meets an operator's run
HEADS_LINK_CHARS = 1500  # the Heads page's URL_TEXT_LIMIT: a window's text longer than this is not put in a link
ORDERS = {"high": "highest first", "low": "lowest first"}
STATS = (*COLUMNS, "learned_sink")

LINK = links.Link("corpus_", {
    "run": links.Param("corpus_link_run", "text", "run name"),  # checked against the runs listed (checked_link)
    "b": links.Param("corpus_link_b", "text", "run name"),
    "stat": links.Param("corpus_stat", "choice", choices={s: s for s in STATS}),
    "window": links.Param("corpus_link_window", "int", "window length", lo=1, hi=10**9),
    "layer": links.Param("corpus_layer", "int", "layer"),
    "head": links.Param("corpus_head", "int", "head"),
    "order": links.Param("corpus_order", "choice", choices=ORDERS),
})


# -- the runs a visitor may open --------------------------------------------------------------------------------

def runs() -> dict[str, Path]:
    """name -> folder of every run this visitor may open: each subfolder of the runs folder holding a manifest (its
    name is the subfolder's), then this session's own runs (names starting with MINE). An unreadable runs folder
    is said once, without its path."""
    from attnviz import ui

    found: dict[str, Path] = {}
    root = ui.runs_dir()
    if root is not None:
        try:
            for sub in sorted(root.iterdir(), key=lambda p: p.name):
                if not sub.name.startswith(".") and (sub / MANIFEST).is_file():
                    found[sub.name] = sub
        except OSError as exc:
            log.warning("the runs folder %s cannot be read: %s", root, exc)
            st.error("This server's runs folder cannot be read (its operator finds why in the server's log): only "
                     "your own runs are listed.")
    return with_session_runs(found)


def with_session_runs(listed: dict[str, Path]) -> dict[str, Path]:
    """The operator's runs of `listed`, then this session's own, as they are now (one just made, the oldest
    dropped)."""
    found = {name: folder for name, folder in listed.items() if not name.startswith(MINE)}
    found.update({name: Path(folder) for name, folder in st.session_state.get("corpus_mine", {}).items()})
    return found


def no_runs_note() -> None:
    """How runs get here: the operator's folder (or how to set one), the command line, and the form above."""
    from attnviz import ui

    command = "attnviz corpus run --model toy-gpt2 --data texts.jsonl --window 64 --window 256 --out"
    if ui.runs_dir() is None:
        st.info("This server has no runs folder. Its operator sets one before starting attnviz: "
                f"`{ui.RUNS_DIR_ENV}=/srv/attnviz-runs attnviz app`. Every subfolder holding a run is then listed "
                f"here by its name. Runs are started from the command line, `{command} /srv/attnviz-runs/NAME` "
                "(`attnviz corpus run --help` for the rest), and can be opened while they run. Meanwhile, start a "
                "small run on your own texts above.")
    else:
        st.info("No runs in this server's runs folder yet. Its operator starts them from the command line with "
                f"`{command} <runs folder>/NAME`; each appears here by its name. Meanwhile, start a small run on "
                "your own texts above.")


def checked_link(names: list[str]) -> None:
    """The run (and run B) a link asked for, put into the pickers when this visitor may open it; else one warning
    that says which runs there are."""
    for staged, key in (("corpus_link_run", "corpus_run"), ("corpus_link_b", "corpus_run_b")):
        if staged not in st.session_state:
            continue
        asked = st.session_state.pop(staged)
        if asked in names:
            st.session_state[key] = asked
            continue
        there = (f"the runs here are {', '.join(names[:8])}" + (f" and {len(names) - 8} more" if len(names) > 8
                                                                 else "")) if names else "there are no runs here"
        mine = (" A run started on this page lasts as long as the visitor's session: it cannot be shared by a link."
                if asked.startswith(MINE) else "")
        st.warning(f"The link's {links.shown(staged.removeprefix('corpus_link_'), asked)} is not a run on this "
                   f"server ({there}).{mine}")


def open_run(name: str, folder: Path) -> CorpusRun | None:
    """CorpusRun(folder, name=name), or None after a message naming the run only."""
    return _read(name, lambda: CorpusRun(folder, name=name))


def _read(name: str, compute):
    """compute(), or None after a message: the library's own (it names the run), or, for a file that cannot be
    read (a shard removed or damaged while the page reads it), one that says so, the details going to the log."""
    from attnviz import ui

    try:
        return compute()
    except CorpusError as exc:
        ui.show_error(exc)
    except Exception as exc:  # duckdb and pyarrow raise their own kinds on a damaged file: never a traceback here
        log.warning("corpus run %s cannot be read: %r", name, exc)
        st.error(f"The run {name} cannot be read: one of its files is missing or damaged (the server's log says "
                 "which). Start it again with the same command: it goes on from its last whole shard.")
    return None


def state_of(run: CorpusRun) -> tuple:
    """A token that changes whenever the run's files do (its manifest and each shard's name, size and mtime), for
    the cache keys beside its folder: a run still going shows its new shards."""
    files = [run.folder.path / MANIFEST, *sorted((run.folder.path / "shards").glob("shard-*.parquet"))]
    out = []
    for f in files:
        try:
            info = f.stat()
            out.append((f.name, info.st_size, info.st_mtime_ns))
        except OSError:
            out.append((f.name,))
    return tuple(out)


def summary(name: str, run: CorpusRun) -> pd.DataFrame | None:
    """CorpusRun.summary(), once per run and state of its files; None after a message."""
    return _read(name, lambda: _summary(str(run.folder.path), state_of(run), run))


@st.cache_data(show_spinner="Reading the run's statistics…", max_entries=32)
def _summary(folder: str, state: tuple, _run: CorpusRun) -> pd.DataFrame:
    return _run.summary()


def top(name: str, run: CorpusRun, stat: str, layer: int, head: int, k: int, window: int | None):
    """CorpusRun.top(stat, layer, head, k, window=window), once per run state; None after a message."""
    return _read(name, lambda: _top(str(run.folder.path), state_of(run), stat, layer, head, k, window, run))


@st.cache_data(show_spinner=False, max_entries=64)
def _top(folder: str, state: tuple, stat: str, layer: int, head: int, k: int, window: int | None, _run):
    return _run.top(stat, layer, head, k, window=window)


def against_length(name: str, run: CorpusRun, stat: str):
    """CorpusRun.against_length(stat): rows (layer, head), a column per window length; None after a message."""
    return _read(name, lambda: _against_length(str(run.folder.path), state_of(run), stat, run))


@st.cache_data(show_spinner=False, max_entries=32)
def _against_length(folder: str, state: tuple, stat: str, _run):
    return _run.against_length(stat)


def compare(names: tuple[str, str], a: CorpusRun, b: CorpusRun, stat: str):
    """CorpusRun.compare(b, stat): head by head, for the window lengths both runs have; None after a message."""
    return _read(" and ".join(names), lambda: _compare(str(a.folder.path), state_of(a), str(b.folder.path),
                                                       state_of(b), stat, a, b))


@st.cache_data(show_spinner=False, max_entries=16)
def _compare(folder_a: str, state_a: tuple, folder_b: str, state_b: tuple, stat: str, _a, _b):
    return _a.compare(_b, stat)


def same_shape(a: CorpusRun, b: CorpusRun) -> bool:
    return (a.manifest["layers"], a.manifest["heads"]) == (b.manifest["layers"], b.manifest["heads"])


def summary_file(table: pd.DataFrame, fmt: str) -> bytes:
    """The summary as the bytes of a .csv or .parquet file."""
    import io

    if fmt == "csv":
        return table.to_csv(index=False).encode("utf-8")
    buffer = io.BytesIO()
    table.to_parquet(buffer, index=False)
    return buffer.getvalue()


def file_stem(name: str) -> str:
    """A run's name as a file name: letters, digits, '-', '_' and '.', the rest '-'."""
    import re

    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "run"


# -- what a run's manifest says, in words a visitor may read ---------------------------------------------------

def listed_models() -> set[str]:
    from attnviz.models import available_models

    return {s.name for s in available_models()}


def model_shown(name: str) -> str:
    """A run's model as the page names it: attnviz's own names as they are; a folder or file of the server by its
    last part only."""
    if name in listed_models() or name.startswith("lab/"):
        return name
    return f"{Path(name).name or 'a model'} (a model folder of this server)"


def describe(run: CorpusRun) -> str:
    m = run.manifest
    lengths = ", ".join(f"{w:,}" for w in m["windows"])
    data = ", ".join(m.get("data", [])[:4]) + (f" and {len(m['data']) - 4} more" if len(m.get("data", [])) > 4 else "")
    return (f"{model_shown(m['model'])}, {m['layers']} layers × {m['heads']} heads; windows of {lengths} tokens "
            f"from {m['documents']:,} document{'s' if m['documents'] != 1 else ''} of {data or 'its data'}; "
            f"{run.n_windows_done:,} of {m['n_windows']:,} windows done"
            + (f" (at most {m['max_windows']:,} per length)" if m.get("max_windows") else "") + ".")


def heads_link(model: str, text: str, layer: int, head: int) -> dict | None:
    """The Heads page's link query that opens `text` through `model` on layer `layer`, head `head` (its One head
    tab), or None when the text is over HEADS_LINK_CHARS or the model is not one of attnviz's own names (a folder's
    path must not go into a link)."""
    if len(text) > HEADS_LINK_CHARS or not text.strip() or model not in listed_models():
        return None
    return {"model": model, "text": text, "layer": str(layer), "head": str(head), "tab": "head"}


# -- a small run started on the page ---------------------------------------------------------------------------


