"""attnviz.ui, the one attnviz package that imports streamlit: the page list, cached loaders and shared widgets.

This file holds what every page shares (the page list, the model picker, model and capture caches, the text box);
each topic's caches and widgets live beside it in attnviz/ui/<topic>.py. Nothing else in attnviz imports
streamlit.

The model and capture caches live in attnviz/ui/loaded.py, each chart's figure files in attnviz/ui/chart_files.py;
their public names are this package's too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from attnviz.ui.background import (  # noqa: F401
    BACKGROUND_BUILDS, build_in_background, foreground_work, visitor_waits)
from attnviz.ui.chart_files import PRINT_STYLE, figure_files  # noqa: F401  (the package's names)
from attnviz.ui.steady import same_axes, sendable, steady_reruns  # noqa: F401  (the package's names)
from attnviz.ui.loaded import (  # noqa: F401  (the package's names)
    MAX_MODELS, MAX_TEXT_CHARS, cached_model, capture_need, capture_store, get_capture, get_model, model_roots,
    model_version, show_error)

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
            numpy_blas_on_one_thread()
            _warm = True


def numpy_blas_on_one_thread() -> None:
    """numpy's OpenBLAS on one thread in this server. Its products here are small (a Softmax sweep's q·k is
    [256, d_k] x [d_k, keys]), and with a thread per core each waits until the other core is free: 8 ms for a 0.03 ms
    product on a loaded 2-core machine, 100 of them per Softmax setting. torch keeps its own threads (the models'
    products are large)."""
    from threadpoolctl import ThreadpoolController

    ThreadpoolController().select(internal_api="openblas").limit(limits=1)


_LAZY_NAMES = ("AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoTokenizer", "PreTrainedTokenizerFast",
               "GPT2Config", "LlamaConfig", "BloomConfig", "DynamicCache")


CUSTOM_MODEL = "Other: a folder, a .gguf file or a hub id on this server…"
DEFAULT_TEXT = "The cat sat on the mat. The cat sat on the mat."


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


RUNS_DIR_ENV = "ATTNVIZ_RUNS_DIR"


def runs_dir() -> Path | None:
    """The operator's folder of corpus runs (ATTNVIZ_RUNS_DIR; each subfolder holding a manifest.json is a run made
    by `attnviz corpus run ... --out <folder>/<name>`), or None when it is not set. The Corpus page shows its runs by
    name; neither this path nor a run's is ever shown to a visitor."""
    value = os.environ.get(RUNS_DIR_ENV, "").strip()
    return Path(value).expanduser() if value else None


def text_input(key: str, default: str = DEFAULT_TEXT, *, label: str = "Text", height: int = 100) -> str:
    """A text area with a stable key and a length cap; returns the text (possibly empty: check before use)."""
    if key not in st.session_state:
        st.session_state[key] = default
    # no max_chars: a browser silently refuses a paste over it and keeps the old text; the length is checked where
    # the text is used (get_capture), with a message that gives the limit
    return st.text_area(label, key=key, persist_state="session", height=height,
                        help=f"Up to {MAX_TEXT_CHARS:,} characters.")


def figure_cache(max_entries: int):
    """st.cache_resource for a function that returns figures (alone or in a tuple): one object for every session,
    handed out as it is. st.cache_data would hand each rerun a copy, unpickled, and plotly validates every property
    of a figure it unpickles again (20-30 ms a figure, the largest part of a Heads rerun's time in Python) before
    Streamlit serialises it. Nothing may change a figure once cached: ui.plot and the Figure files only read it
    (tests/test_heads_page.py checks a drawn figure against a fresh build)."""
    return st.cache_resource(show_spinner=False, max_entries=max_entries)


def frozen(array):
    """An array kept with a figure_cache'd figure, made read-only (None stays None): it too is shared."""
    if array is not None:
        array.flags.writeable = False
    return array


def chart(fig, caption: str) -> None:
    """A plotly figure across the page's width, with the one sentence that says what to see under it, and a
    Figure files button that offers it as SVG, PDF and PNG (figure_files)."""
    sent, theme = sendable(fig)
    st.plotly_chart(sent, width="stretch", theme=theme)
    st.caption(caption)
    figure_files(fig, caption)


def plot(fig, *, where=None, key: str | None = None, files: str = "", **options) -> None:
    """A plotly figure (in `where`, a column, when given; across its width by default) with its Figure files button
    under it, for a chart whose words the page writes itself (chart: with its one sentence). files: words that tell
    the chart's buttons apart from another chart of the same title."""
    options.setdefault("width", "stretch")
    with where if where is not None else contextlib.nullcontext():
        sent, theme = sendable(fig)
        st.plotly_chart(sent, key=key, theme=theme, **options)
        figure_files(fig, files or key or "")


def lazy_tabs(labels: list[str], key: str) -> list:
    """st.tabs that run only the open tab's code (on_change="rerun": each tab's .open; a control moved reruns and
    redraws the open tab's charts only), and that reopen on the tab last open when the visitor comes back to the page
    (a tab's state is not a persisted widget: it is remembered under f"{key}_open")."""
    remembered = f"{key}_open"
    if key not in st.session_state and st.session_state.get(remembered) in labels:
        st.session_state[key] = st.session_state[remembered]

    def remember():
        st.session_state[remembered] = st.session_state[key]

    return st.tabs(labels, key=key, on_change=remember)


def text_ready(text: str, max_chars: int, *, empty: str, too_long: str) -> bool:
    """Whether a typed text can be read; when not, the page is told why and nothing starts: over max_chars an error
    (`too_long` with {n} and {limit} filled in), empty or blank a warning (`empty`)."""
    if len(text) > max_chars:
        st.error(too_long.format(n=len(text), limit=max_chars))
        return False
    if not text.strip():
        st.warning(empty)
        return False
    return True


def export_fits(size: int, what: str) -> bool:
    """Whether an export of `size` bytes may be built here (it is held in memory once written: the capture files'
    limit, within the memory budget); when not, a warning that says what to pick instead."""
    from attnviz import budget
    from attnviz.capture.files import MAX_EXPORT_BYTES

    limit = min(MAX_EXPORT_BYTES, budget.BUDGET.limit)
    if size > limit:
        st.warning(f"{what} would be {size / 2**30:.1f} GiB, over the {limit / 2**30:.1f} GiB an export builds "
                   "here: pick one layer or one head, or float16.")
        return False
    return True


def fits_context(loaded, text: str, model: str) -> bool:
    """Whether the text's tokens fit the model's context; when not, an error that says to shorten it."""
    limit = loaded.shape.max_positions
    n = len(loaded.tokenizer(text)["input_ids"])
    if limit and n > limit:
        st.error(f"The text is {n:,} tokens, over the {limit:,} {model} reads at once: shorten it.")
        return False
    return True


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


NO_MOVE = object()  # neighbours' `previous` when the control did not move (None may be one of its options)


def neighbours(options, value, previous=NO_MOVE) -> list:
    """The values one step either way of value, for a prefetch of what a control moved by one step would ask for:
    options a list of values, or (low, high) integer bounds. The one further in the direction of the move from
    `previous` comes first (a control is mostly moved on the same way), the lower one when there was no move."""
    if previous is NO_MOVE:
        previous = value
    if isinstance(options, tuple):
        out = [v for v in (value - 1, value + 1) if options[0] <= v <= options[1]]
        rising = previous is not None and previous < value
    else:
        if value not in options:
            return []
        i = options.index(value)
        out = [options[j] for j in (i - 1, i + 1) if 0 <= j < len(options)]
        rising = previous in options and options.index(previous) < i
    return out[::-1] if rising else out


def last_setting(key: str, setting):
    """The setting this session's last run kept under `key` (None on a first run), keeping `setting` in its place:
    what a prefetch compares to find the control just moved."""
    previous = st.session_state.get(key)
    st.session_state[key] = setting
    return previous


def moved_neighbours(setting: dict, previous: dict, steps: dict) -> list[dict]:
    """The settings one step either way (neighbours) of each control that moved between `previous` and `setting`
    ({control: value}); steps: {control: its options, as neighbours takes them}, the controls that count."""
    return [{**setting, name: value} for name, options in steps.items() if previous.get(name) != setting[name]
            for value in neighbours(options, setting[name], previous.get(name))]


def build_moved_neighbours(cached, setting: dict, previous: dict | None, steps: dict, name: str, *more) -> None:
    """Builds cached(*neighbour.values(), *more) in the background for each of moved_neighbours(setting, previous,
    steps) (setting's keys in cached's own argument order); nothing on a first run (previous None)."""
    if previous is not None:
        build_in_background(cached, [(*s.values(), *more) for s in moved_neighbours(setting, previous, steps)], name)


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
