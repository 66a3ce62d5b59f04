"""The models and captures every browser session shares: loaded or captured once under the one memory budget,
keyed on the model's name and the version of its files, a capture sliced from a wider one already made; and how a
refusal is shown (show_error: the message, never a server path).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import streamlit as st

from attnviz.once import ComputeOnce

log = logging.getLogger("attnviz")

MAX_TEXT_CHARS = 170_000  # Gemma 3 270M's full 32,768 tokens of English (about 161,000 characters)


def model_roots() -> tuple[Path, ...]:
    """The folders this server's visitors may open models under (attnviz.models.allowed_roots): ATTNVIZ_MODEL_ROOTS
    and the list `model_roots` in .streamlit/secrets.toml, each resolved; empty: the listed models only."""
    import os

    from attnviz.models import allowed_roots

    listed = []
    try:
        if st.secrets.load_if_toml_exists():
            value = st.secrets.get("model_roots", [])
            listed = [value] if isinstance(value, str) else [str(v) for v in value]
    except Exception:  # a malformed secrets file: Streamlit's own error says why in the server log
        log.exception("could not read model_roots from the secrets file")
    return allowed_roots(os.pathsep.join([os.environ.get("ATTNVIZ_MODEL_ROOTS", ""), *listed]))


def model_version(name: str | None) -> tuple:
    """A token that changes whenever the files behind `name` change on disk, for cache keys next to the name.

    A toy-lab model ("lab/<folder>", replaced in place when the lab saves under a name already used), and a folder
    or hub snapshot under this server's model folders: the resolved folder, then (file name, inode, size,
    mtime_ns) of each file in it (a hub snapshot's folder names its commit); a GGUF file: its path, inode, size and
    mtime_ns. Toy and bundled models, and names this server does not open: () (built from a seed, or read from an
    installed package and converted once: their weights cannot change while the server runs). A save replaces the lab
    folder with freshly written files, so their inodes differ even when size and mtime (coarse on some file systems) do
    not. Costs one directory listing.
    """
    from attnviz.models import ModelError, is_registered, lab_folder, user_folder

    if not name:
        return ()
    if name.startswith("lab/"):
        folder = lab_folder(name)
        return () if folder is None else _folder_version(folder)
    if is_registered(name):
        return ()
    try:
        return _folder_version(user_folder(name, model_roots())[1])
    except ModelError:  # not opened here: loading it will say so
        return ()


def _folder_version(folder: Path) -> tuple:
    try:
        if folder.is_file():  # a GGUF file: its own identity
            info = folder.stat()
            return (str(folder), info.st_ino, info.st_size, info.st_mtime_ns)
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
        files = []
        for entry in entries:
            if entry.is_file():  # follows links: a hub snapshot's files are links to its blobs
                info = entry.stat()
                files.append((entry.name, info.st_ino, info.st_size, info.st_mtime_ns))
    except OSError:  # no such folder (yet): loading it will say so
        return (str(folder),)
    return (str(folder), *files)


MAX_MODELS = 4  # models kept loaded at once, inside the memory budget; the least recently used goes first


_MODELS = None  # budget.HeldCache of LoadedModels, made on first use


_CAPTURES = None  # budget.HeldCache of AttentionCaptures, made on first use


def _caches():
    """(models, captures): results shared by every session, holding their memory in the one budget. Captures
    are dropped before models when other work needs the room (a model costs more to load again)."""
    global _MODELS, _CAPTURES
    from attnviz import budget

    with _CACHES_LOCK:
        if _MODELS is None:
            _MODELS = budget.HeldCache(budget.BUDGET, max_items=MAX_MODELS, priority=1)
            _CAPTURES = budget.HeldCache(budget.BUDGET, max_items=4, priority=0)
    return _MODELS, _CAPTURES


_CACHES_LOCK = threading.Lock()


def cached_model(name: str, version: tuple, **wait):
    """The LoadedModel of `name` (at `version`: model_version), loaded once for every session under the memory
    budget: its weights' estimated bytes are admitted before loading, so a load that can never fit is refused and
    one that must wait for other work waits (**wait: budget.MemoryBudget.acquire's messages)."""
    from attnviz.models import load_bytes, load_model

    roots = model_roots()

    def load():  # models.load_model runs one load at a time (transformers' loading is not thread-safe)
        return load_model(name, roots=roots)

    return _caches()[0].get((name, version), load, need=load_bytes(name, roots), what=f"Loading {name}", **wait)


def get_model(name: str | None):
    """The LoadedModel for `name`, loaded once per process (per version of its files: model_version) and shared
    by every session (read-only!).

    Shows a spinner while loading; when it cannot be loaded shows why (st.error) and returns None.
    """
    if not name:
        return None
    return _get_model(name, model_version(name))


def _get_model(name: str, version: tuple):
    from attnviz import budget
    from attnviz.models import ModelError

    found, loaded = _caches()[0].peek((name, version))
    if found:
        return loaded
    note = _first_load_note(name)
    waiting = st.empty()

    def on_wait(held, position):
        waiting.info(f"Waiting for memory to load {name}: other visitors' work holds {held / 2**30:.1f} GiB of the "
                     f"{budget.BUDGET.limit / 2**30:.1f} GiB budget ({position} ahead). It starts by itself.")

    try:
        with st.spinner(f"Loading {name}…{note}"):
            return cached_model(name, version, on_wait=on_wait, on_poll=lambda: None)
    except (ModelError, budget.OverBudget) as exc:
        show_error(exc)
        return None
    finally:
        waiting.empty()


def _first_load_note(name: str) -> str:
    """What a GGUF model's first load costs: its weights are dequantized to float32 once, then read in seconds. The
    size is read from the files, with no promise of time (it depends on the machine and how busy it is)."""
    from attnviz.models import pending_conversion_bytes

    size = pending_conversion_bytes(name)
    if size:
        return (f" Its first load converts its {size / 1e6:,.0f} MB GGUF file to float32, once for every visitor; "
                "later loads read the converted copy in seconds.")
    if name.lower().endswith(".gguf"):
        return " The first load of a GGUF file converts it to float32 once; later loads read the converted copy."
    return ""


def show_error(exc: Exception) -> None:
    """st.error with a refusal's message (attnviz's errors say why without naming the server's files); what
    only the operator should see (a path, a library's exception) goes to the server log."""
    detail = getattr(exc, "detail", None)
    if detail:
        log.warning("%s (%s)", exc, detail)
    st.error(str(exc))


def _cached_capture(name: str, version: tuple, text: str, layers: tuple[int, ...] | None, with_scores: bool,
                    store: str = "pattern", progress=None, need: int | None = None, **wait):
    """The capture, computed once for every session that asks for the same arguments (at most 4 kept: a long
    smollm2 capture is ~1 GB), its peak `need` bytes (default: capture_need) admitted by the memory budget and
    what it keeps held there while it is kept (**wait: budget.MemoryBudget.acquire's messages). Not an
    st.cache_resource: the capture reports its progress to the calling page, and a Streamlit cache may not touch
    page elements from inside."""
    from attnviz.capture import capture_attention

    made = _made_capture(name, version, text, layers, with_scores, store)
    if made is not None:
        return made

    loaded = cached_model(name, version)  # kept while this capture waits for room and runs (keep= below)

    def compute():
        during = None
        if store == "qk":
            # each layer's attention output, statistics and grid tiles from one pass over its scores, during the
            # forward pass (attnviz.stats.streaming_attend): the Heads page's first view costs no second pass
            from attnviz.figures.heads import GRID_TILE
            from attnviz.stats import streaming_attend

            during = streaming_attend(loaded.tokenizer(text).input_ids, pool=GRID_TILE)
        return capture_attention(loaded, text, layers=layers, with_scores=with_scores, store=store,
                                 progress=progress, during=during)

    if need is None:
        need = capture_need(loaded, len(loaded.tokenizer(text).input_ids), layers, store)
    wait.setdefault("what", "This capture")
    return _caches()[1].get((name, version, text, layers, with_scores, store), compute, need=need,
                            keep=(name, version), **wait)


def capture_need(loaded, n_tokens: int, layers, store: str) -> int:
    """The estimated peak bytes of a capture of `layers` (None: all) beyond the model (budget.capture_working_bytes),
    its dense maps counted as the pattern store keeps them (capture.maps_of: a linear mixer's at its own heads)."""
    from attnviz import budget
    from attnviz.capture import maps_of, numbered_attention, uses_interface

    modules = list(numbered_attention(loaded.model).values())
    n_layers = loaded.shape.layers if layers is None else len(set(layers))
    return budget.capture_working_bytes(loaded.model.config, n_tokens, n_layers, store=store,
                                        uses_sdpa=not modules or uses_interface(modules[0]),
                                        maps=maps_of(loaded, layers) if store == "pattern" else None)


def _made_capture(name, version, text, layers, with_scores, store):
    """The capture if it was already made, never computing: its own entry, or the same text's capture of any
    layers that include these, restricted to them (narrowing the layer range needs no new forward pass). Else
    None."""
    _CAPTURES = _caches()[1]
    found, capture = _CAPTURES.peek((name, version, text, layers, with_scores, store))
    if found:
        return capture
    if layers is None:
        return None

    def covers(key) -> bool:
        return key[:3] == (name, version, text) and key[4:] == (with_scores, store) and (
            key[3] is None or set(layers) <= set(key[3]))

    found, _, wider = _CAPTURES.find(covers)
    return wider.select(layers) if found else None


_TOKEN_COUNTS = ComputeOnce(max_items=32)  # (model, version, text) -> its number of tokens, every session


def token_count(name: str, text: str, loaded) -> int:
    """How many tokens the model's tokenizer makes of `text`, counted once: every rerun asks (which store a capture
    takes, what it needs), and tokenizing again took 8 ms at 1,800 tokens, 0.18 s at 32,768 (SmolLM2)."""
    return _TOKEN_COUNTS.get((name, model_version(name), text),
                             lambda: int(loaded.tokenizer(text, return_tensors="pt").input_ids.shape[1]))


def capture_store(name: str, text: str, layers=None) -> tuple[str, str, int]:
    """(store, why, n_tokens) for a capture of `text` through `name`: capture.choose_store, the front door's own
    rule for store="auto" (every N x N map the pattern store would keep, the linear mixers' included), with the dense
    store also held within half of what the server gives all visitors' work."""
    from attnviz import budget
    from attnviz.capture import choose_store

    loaded = get_model(name)
    n_tokens = token_count(name, text, loaded)
    store, why = choose_store(loaded, n_tokens, layers, limit_bytes=budget.BUDGET.limit // 2)
    return store, why, n_tokens


def get_capture(name: str | None, text: str, layers=None, with_scores: bool = False, store: str = "pattern"):
    """The AttentionCapture of `text` through `name`, cached on all arguments and on model_version(name), and
    shared between sessions.

    store: "pattern", "qk" or "auto" (capture_store decides, and the page is told why in an info line).
    Its arrays are read-only. On bad input (empty or too long text, unknown layer, unloadable model) shows
    st.error and returns None. A page that caches results computed from the capture should key them on
    model_version(name) too, or a toy-lab model saved again under the same name shows stale results.
    Long captures are admitted under one memory budget for every visitor (attnviz.budget): one that has to wait
    says so, and one that could never fit is refused with the reason.
    """
    from attnviz import budget
    from attnviz.capture import CaptureError
    from attnviz.models import ModelError

    if not name:
        return None
    if not text or not text.strip():
        st.error("The text is empty: type some text to run the model on.")
        return None
    if len(text) > MAX_TEXT_CHARS:
        st.error(f"The text is {len(text):,} characters; the limit is {MAX_TEXT_CHARS:,}. Shorten it.")
        return None
    version = model_version(name)
    loaded = _get_model(name, version)
    if loaded is None:
        return None
    key_layers = None if layers is None else tuple(sorted({int(i) for i in layers}))
    try:
        n_tokens = None
        if store == "auto":
            store, why, n_tokens = capture_store(name, text, key_layers)
            if store == "qk":
                st.info(f"{n_tokens:,} tokens: {why}.")
        if n_tokens is None:
            n_tokens = token_count(name, text, loaded)
        # already made (by this visitor or another): no memory to admit, no waiting
        made = _made_capture(name, version, text, key_layers, bool(with_scores), store)
        if made is not None:
            return made
        need = capture_need(loaded, n_tokens, key_layers, store)
        return _capture_shown(name, version, text, key_layers, bool(with_scores), store, need, n_tokens)
    except (CaptureError, ModelError, budget.OverBudget) as exc:
        show_error(exc)
        return None


def _capture_shown(name: str, version: tuple, text: str, layers, with_scores: bool, store: str, need: int,
                   n_tokens: int):
    """_cached_capture with the page told what happens: a progress bar by layer, and while the memory budget
    makes it wait, how much other visitors hold (refreshed every half second, so Streamlit can stop a run the
    visitor left)."""
    from attnviz import budget

    waiting = st.empty()

    def on_wait(held, position):
        waiting.info(f"Waiting for memory: other visitors' work holds {held / 2**30:.1f} GiB of the "
                     f"{budget.BUDGET.limit / 2**30:.1f} GiB budget (this one needs {need / 2**30:.2f} GiB; "
                     f"{position} ahead of it). It starts by itself as soon as they finish.")

    def on_poll():
        waiting.info(f"Waiting for memory: other visitors' work holds {budget.BUDGET.held / 2**30:.1f} GiB "
                     f"of the {budget.BUDGET.limit / 2**30:.1f} GiB budget. It starts by itself as soon as they "
                     "finish.")

    bar = st.progress(0.0, text=f"Running {name} and capturing every head…")

    def progress(done, total):
        waiting.empty()
        bar.progress(done / total, text=f"Running {name}: layer {done} of {total} captured")

    try:
        return _cached_capture(name, version, text, layers, with_scores, store, progress=progress, need=need,
                               on_wait=on_wait, on_poll=on_poll, what=f"Capturing {n_tokens:,} tokens")
    finally:
        bar.empty()
        waiting.empty()
