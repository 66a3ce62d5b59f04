"""attnviz.ui, the one attnviz package that imports streamlit: the page list, cached loaders and shared widgets.

This file holds what every page shares (the page list, the model picker, model and capture caches, the text box);
each topic's caches and widgets live beside it in attnviz/ui/<topic>.py. Nothing else in attnviz imports
streamlit.

Over 300 lines on purpose: the model and capture caches belong together (a capture is keyed on the model's
version, admitted by the memory budget, and sliced from a wider capture already made).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from attnviz.once import ComputeOnce

log = logging.getLogger("attnviz")


@dataclass(frozen=True)
class PageInfo:
    script: str
    title: str
    icon: str
    url_path: str
    summary: str
    default: bool = False
    state_prefix: str = ""  # every widget key on the page starts with it


PAGES: tuple[PageInfo, ...] = (
    PageInfo("app_pages/home.py", "Home", "🏠", "home", "What attnviz shows and where.", default=True),
    PageInfo("app_pages/heads.py", "Heads", "🧠", "heads",
             "Run a real or toy model on your text and explore every head's attention map and statistics.",
             state_prefix="heads_"),
    PageInfo("app_pages/corpus.py", "Corpus", "📚", "corpus",
             "Every head's statistics over many texts: open corpus runs, rank heads, read their top windows, compare "
             "runs and window lengths.", state_prefix="corpus_"),
    PageInfo("app_pages/sinks.py", "Attention sinks", "🕳️", "sinks",
             "Where the first token soaks up attention, and what breaks when it is evicted from the cache.",
             state_prefix="sinks_"),
    PageInfo("app_pages/positional.py", "Positional encodings", "📐", "positional",
             "Sinusoidal, RoPE and ALiBi: distance decay in theory and measured in real heads.",
             state_prefix="pos_"),
    PageInfo("app_pages/softmax.py", "Softmax saturation", "🌡️", "softmax",
             "Why attention divides by sqrt(d_k): saturation and vanishing gradients without it.",
             state_prefix="softmax_"),
    PageInfo("app_pages/variants.py", "MHA, GQA, MQA", "🧮", "variants",
             "How query heads share key/value heads, and what that saves in KV cache and FLOPs.",
             state_prefix="variants_"),
    PageInfo("app_pages/worked_example.py", "Worked example", "✏️", "worked-example",
             "Every number of scaled dot-product attention on a small example you can edit.",
             state_prefix="worked_"),
    PageInfo("app_pages/kernel.py", "Tiled kernel", "🧱", "kernel",
             "A FlashAttention-style Triton kernel, tile by tile, checked and timed against naive attention.",
             state_prefix="kernel_"),
    PageInfo("app_pages/experiments.py", "Experiments", "🔬", "experiments",
             "Does a head matter? Attention during generation, head knock-outs with their effect on the loss, "
             "and attention rollout.", state_prefix="exp_"),
    PageInfo("app_pages/toy_lab.py", "Toy lab", "🧪", "toy-lab",
             "Train a small transformer in the browser and watch previous-token and induction heads form.",
             state_prefix="lab_"),
)


_WARM_LOCK = threading.Lock()
_warm = False


def warm_up() -> None:
    """Imports every attnviz module (and with them transformers' names), once per server, before any page runs.
    transformers resolves its names lazily, which is not safe when the first visitors' sessions do it in several
    threads at once (benchmarks/load.py saw "cannot import name 'PreTrainedTokenizerFast' from 'transformers'" with
    8 visitors arriving together); the sessions behind the first wait here until it is done."""
    global _warm
    if _warm:
        return
    with _WARM_LOCK, st.spinner("Starting attnviz: loading its libraries, once for this server…"):
        if not _warm:
            import importlib
            import pkgutil

            import transformers

            import attnviz

            for module in pkgutil.walk_packages(attnviz.__path__, "attnviz."):
                importlib.import_module(module.name)
            for name in _LAZY_NAMES:  # the names attnviz's functions import from transformers when they run
                getattr(transformers, name)
            _warm = True


_LAZY_NAMES = ("AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoTokenizer", "PreTrainedTokenizerFast",
               "GPT2Config", "LlamaConfig", "BloomConfig", "DynamicCache")


CUSTOM_MODEL = "Other: a folder, a .gguf file or a hub id on this server…"
DEFAULT_TEXT = "The cat sat on the mat. The cat sat on the mat."
MAX_TEXT_CHARS = 170_000  # Gemma 3 270M's full 32,768 tokens of English (about 161,000 characters)


def model_picker(key: str, *, default: str = "toy-gpt2", label: str = "Model", allow_custom: bool = True) -> str | None:
    """A model selectbox: installed models first, then missing bundled ones with their install command.

    Returns the chosen model name (or the typed folder / hub id), or None after a st.warning when nothing usable is
    chosen. The selectbox's state is st.session_state[key]; the custom text box's is st.session_state[key + "_custom"].
    """
    from attnviz.models import available_models

    specs = {s.name: s for s in available_models()}
    installed = [name for name, s in specs.items() if s.installed]
    missing = [name for name, s in specs.items() if not s.installed]
    options = installed + missing + ([CUSTOM_MODEL] if allow_custom else [])

    def label_of(name: str) -> str:
        spec = specs.get(name)
        if spec is None:
            return name
        return f"{name} ({spec.family}, {spec.source})" + ("" if spec.installed else " — not installed")

    if st.session_state.get(key) not in options:  # a missing default falls back to the first installed model
        st.session_state[key] = default if default in installed else options[0]
    choice = st.selectbox(label, options, key=key, persist_state="session", format_func=label_of,
                          help="Toy models are instant; bundled real models load in about a second once converted.")
    if choice == CUSTOM_MODEL:
        custom = st.text_input("A transformers folder (safetensors weights), a .gguf file, or a hub id under this "
                               "server's model folders (never downloaded)", key=f"{key}_custom",
                               persist_state="session").strip()
        if not model_roots():
            st.info("This server opens the listed models only. Its operator can allow folders of models with "
                    "ATTNVIZ_MODEL_ROOTS or model_roots in .streamlit/secrets.toml (see the README).")
            return None
        if not custom:
            st.warning("Type the path of a transformers folder or a .gguf file under this server's model folders, "
                       "or the id of a hub model in a Hugging Face cache there.")
            return None
        return custom
    spec = specs[choice]
    if not spec.installed:
        st.warning(f"{choice} is not installed. Install it with the command below, then reload the page.")
        st.code(spec.install_command or "", language="bash")
        return None
    return choice


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


RUNS_DIR_ENV = "ATTNVIZ_RUNS_DIR"


def runs_dir() -> Path | None:
    """The operator's folder of corpus runs (ATTNVIZ_RUNS_DIR; each subfolder holding a manifest.json is a run made
    by `attnviz corpus run ... --out <folder>/<name>`), or None when it is not set. The Corpus page shows its runs by
    name; neither this path nor a run's is ever shown to a visitor."""
    value = os.environ.get(RUNS_DIR_ENV, "").strip()
    return Path(value).expanduser() if value else None


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
        n_layers = len(layers) if layers is not None else None
        need = capture_need(loaded, len(loaded.tokenizer(text).input_ids), n_layers, store)
    wait.setdefault("what", "This capture")
    return _caches()[1].get((name, version, text, layers, with_scores, store), compute, need=need,
                            keep=(name, version), **wait)


def capture_need(loaded, n_tokens: int, n_layers: int | None, store: str) -> int:
    """The estimated peak bytes of a capture beyond the model (budget.capture_working_bytes)."""
    from attnviz import budget
    from attnviz.capture import attention_modules, uses_interface

    modules = attention_modules(loaded.model)
    return budget.capture_working_bytes(loaded.model.config, n_tokens, n_layers or len(modules), store=store,
                                        uses_sdpa=uses_interface(modules[0]))


def _made_capture(name, version, text, layers, with_scores, store):
    """The capture if it was already made, never computing: its own entry, or the same text's capture of every
    layer restricted to these layers (narrowing the layer range needs no new forward pass). Else None."""
    _CAPTURES = _caches()[1]
    found, capture = _CAPTURES.peek((name, version, text, layers, with_scores, store))
    if not found and layers is not None:
        found, whole = _CAPTURES.peek((name, version, text, None, with_scores, store))
        capture = whole.select(layers) if found else None
    return capture if found else None


def capture_store(name: str, text: str, layers=None) -> tuple[str, str, int]:
    """(store, why, n_tokens) for a capture of `text` through `name`: capture.choose_store, with the dense store
    held within half of what the server gives all visitors' work."""
    from attnviz import budget
    from attnviz.capture import attention_modules, choose_store

    loaded = get_model(name)
    n_tokens = int(loaded.tokenizer(text, return_tensors="pt").input_ids.shape[1])
    n_layers = len(attention_modules(loaded.model)) if layers is None else len(set(layers))
    store, why = choose_store(loaded, n_tokens, n_layers, limit_bytes=budget.BUDGET.limit // 2)
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
            n_tokens = int(loaded.tokenizer(text, return_tensors="pt").input_ids.shape[1])
        # already made (by this visitor or another): no memory to admit, no waiting
        made = _made_capture(name, version, text, key_layers, bool(with_scores), store)
        if made is not None:
            return made
        need = capture_need(loaded, n_tokens, None if key_layers is None else len(key_layers), store)
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


def text_input(key: str, default: str = DEFAULT_TEXT, *, label: str = "Text", height: int = 100) -> str:
    """A text area with a stable key and a length cap; returns the text (possibly empty: check before use)."""
    if key not in st.session_state:
        st.session_state[key] = default
    # no max_chars: a browser silently refuses a paste over it and keeps the old text; the length is checked where
    # the text is used (get_capture), with a message that gives the limit
    return st.text_area(label, key=key, persist_state="session", height=height,
                        help=f"Up to {MAX_TEXT_CHARS:,} characters.")


def chart(fig, caption: str) -> None:
    """A plotly figure across the page's width, with the one sentence that says what to see under it, and a
    Figure files button that offers it as SVG, PDF and PNG (figure_files)."""
    st.plotly_chart(fig, width="stretch")
    st.caption(caption)
    figure_files(fig, caption)


PRINT_STYLE = "chart_print_style"  # this visitor's choice for every chart's files (the print style: True)
_FIGURE_FILES = ComputeOnce(max_items=32)  # (figure's digest, format, print style) -> the file's bytes, every session


def figure_files(fig, caption: str) -> None:
    """The figure as SVG, PDF and PNG (attnviz.export, plotly's own exporter), one download button each, and a Print
    style toggle, behind a small popover. Nothing is drawn on a rerun: a file is drawn when its button is pressed
    (Streamlit calls the button's function), and kept by figure. Without a browser, one caption says why."""
    from attnviz import export

    with st.popover("Figure files", icon=":material/download:", type="tertiary"):
        why = export.unavailable()
        if why:
            st.caption(why)
            return
        key = _chart_key(fig, caption)
        st.session_state[key] = st.session_state.get(PRINT_STYLE, True)  # the same choice on every chart
        styled = st.toggle("Print style", key=key, persist_state="session", on_change=_remember_print_style,
                           args=(key,), help="A white background, type legible at one column's width (3.3 in), "
                                             "colour-blind-safe colours; the PNG at 300 dpi.")
        name = export.file_stem(fig, caption)
        with st.container(horizontal=True):
            for fmt, mime in export.FORMATS.items():
                st.download_button(fmt.upper(), data=functools.partial(_figure_file, fig, fmt, styled),
                                   file_name=f"{name}.{fmt}", mime=mime, key=f"{key}_{fmt}", on_click="ignore")


def _chart_key(fig, caption: str) -> str:
    """A widget key for a chart's file buttons, stable across reruns: from its title and caption, numbered when the
    same pair is drawn again in one run."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    title = fig.layout.title.text or ""
    base = "chart_" + hashlib.blake2b(f"{title}\n{caption}".encode(), digest_size=6).hexdigest()
    shared = getattr(get_script_run_ctx(), "shared", None)
    used = getattr(shared, "widget_user_keys_this_run", ())
    key, n = base, 1
    while key in used:
        n += 1
        key = f"{base}_{n}"
    return key


def _remember_print_style(key: str) -> None:
    st.session_state[PRINT_STYLE] = bool(st.session_state[key])


def _figure_file(fig, fmt: str, styled: bool) -> bytes:
    """One file of the figure, drawn once for every session that asks (by the figure's JSON, format and style)."""
    from attnviz import export

    try:
        return _FIGURE_FILES.get((export.figure_digest(fig), fmt, styled),
                                 lambda: export.figure_bytes(fig, fmt, styled=styled))
    except export.ExportError as exc:
        log.warning("%s (%s)", exc, exc.detail)
        raise


def choice_box(label: str, options: list[int], key: str, default: int | None = None, *,
               link_asked_key: str | None = None) -> int:
    """A selectbox over integer options that keeps its remembered value (from a link, another model or text) while
    it is still an option. Otherwise the value becomes `default` when given, else the nearest option. When
    link_asked_key names a session-state dict of values a link asked for, a value the link asked for that does not
    exist is replaced with a warning that says so."""
    current = st.session_state.get(key, options[0] if default is None else default)
    if key not in st.session_state and current in options:
        st.session_state[key] = current  # the default reaches the selectbox on its first run
    if current not in options:
        if default is not None and default in options:
            st.session_state[key] = default
        else:
            st.session_state[key] = min(options, key=lambda o: abs(o - int(current)) if str(current).isdigit() else o)
        asked = st.session_state.get(link_asked_key, {}) if link_asked_key else {}
        if asked.get(key) == current:
            st.warning(f"The link asked for {label.lower()} {current}, which this model does not have "
                       f"({label.lower()}s {options[0]}–{options[-1]}): showing {st.session_state[key]}.")
    if link_asked_key:
        st.session_state.get(link_asked_key, {}).pop(key, None)
    return st.selectbox(label, options, key=key, persist_state="session")


BACKGROUND_BUILDS = 2  # prefetch threads for the whole server; a build asked for while they are busy is skipped
_background = threading.BoundedSemaphore(BACKGROUND_BUILDS)


def build_in_background(cached, calls: list[tuple], name: str) -> bool:
    """Calls the cached function `cached` (st.cache_resource or st.cache_data) with each argument tuple of `calls`
    in a daemon thread, so the results a visitor is likely to ask for next are in the shared cache by then; a call
    already cached costs nothing, and one a visitor asks for while it is being built waits for it (the cache's own
    lock per key). At most BACKGROUND_BUILDS run at once for all visitors together: a prefetch is only a guess, so
    one asked for while they are busy is skipped (returns False) rather than queued behind a slider's every move."""
    if not calls or not _background.acquire(blocking=False):
        return False

    def build():
        try:
            for args in calls:
                cached(*args)
        finally:
            _background.release()

    threading.Thread(target=build, daemon=True, name=name).start()
    return True


def started_by_button(label: str, key: str, hint: str, **button_args) -> bool:
    """A button that starts long work and stays pressed for this visitor: True from the click on (the section then
    reruns with its sliders without asking again), else False after an st.info with `hint`."""
    if st.button(label, key=key, **button_args):
        st.session_state[f"{key}_on"] = True
    if not st.session_state.get(f"{key}_on"):
        st.info(hint)
        return False
    return True


def computed_once(cache, key, label: str, compute, *, errors: tuple[type[Exception], ...] = ()):
    """cache.get(key, ...) of an attnviz.once.ComputeOnce shared by every session, with a progress bar while it
    runs: compute(progress) gets progress(done, total), and the bar says "label: done of total". A key already
    computed is returned at once, without a bar; a visitor whose key another is computing is told so while it
    waits. An exception of one of `errors` becomes an st.error and None."""
    found, value = cache.peek(key)
    if found:
        return value
    bar = st.progress(0.0, text=f"{label}…")

    def progress(done, total):
        bar.progress(min(1.0, done / max(total, 1)), text=f"{label}: {done} of {total}")

    def waiting(seconds: float) -> None:
        bar.progress(0.0, text=f"{label}: another visitor is computing the same; waiting for it ({seconds:.0f} s)")

    try:
        return cache.get(key, lambda: compute(progress), on_wait=waiting)
    except errors as exc:
        st.error(str(exc))
        return None
    finally:
        bar.empty()
