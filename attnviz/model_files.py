"""Where a user's model lies and how its files are read, the checks no load can bypass: a server's model roots
(every path resolved, every file in a folder under a root), the local Hugging Face cache (never a download),
safetensors only and never remote code, GGUF headers and the one conversion to a safetensors folder, and a model's
memory read from its files' headers before loading. Every failure is a ModelError whose message names no file.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from attnviz import gguf, gguf_convert
from attnviz.capture.frugal import slim_tokenizer
from attnviz.errors import AttnvizError

log = logging.getLogger("attnviz")

Progress = Callable[[str], None]


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


LOAD_OVERHEAD_BYTES = 64 * 2**20  # the tokenizer, the Python objects, the attention buffers a model builds


def folder_bytes(folder: Path) -> int:
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


def gguf_bytes(pieces: list[Path]) -> int:
    """LOAD_OVERHEAD_BYTES plus 4 bytes for each weight of a GGUF file (its tensor shapes, read from its header)."""
    return LOAD_OVERHEAD_BYTES + 4 * gguf_header(pieces).n_elements


def gguf_header(pieces: list[Path]) -> gguf.Header:
    """The GGUF's header, or ModelError with the reason (not a GGUF, truncated, corrupt) and no file named."""
    try:
        return gguf.header(pieces)
    except gguf.GGUFError as exc:
        raise ModelError(str(exc), detail=f"{pieces[0]}: {exc.detail}") from exc
    except OSError as exc:
        raise ModelError("That file cannot be read.", detail=f"{pieces[0]}: {type(exc).__name__}: {exc}") from exc


def converted(pieces: list[Path], folder_name: str, report: Progress, first: str, sha256: str | None = None) -> Path:
    """gguf_convert.converted, with the progress sentence of a first load and its failures as ModelErrors naming
    no file."""
    if (done := gguf_convert.converted_folder(folder_name)) is not None:
        return done
    header = gguf_header(pieces)
    try:
        gguf.check_readable(header)
    except gguf.GGUFError as exc:
        raise ModelError(str(exc), detail=f"{pieces[0]}: {exc.detail}") from exc
    size = f"{header.size / 2**20:,.0f} MB"
    report(f"{first}: converting its {size} GGUF file to float32 safetensors, only this once…")
    try:
        return gguf_convert.converted(pieces, folder_name, report, sha256)
    except gguf.GGUFError as exc:
        raise ModelError(str(exc), detail=f"{pieces[0]}: {exc.detail}") from exc
    except Exception as exc:  # transformers raises anything from KeyError to RuntimeError on a file it cannot map
        raise ModelError("transformers could not convert that GGUF file to a model: its tensors do not match what "
                         "its architecture needs, or its metadata is incomplete.",
                         detail=f"{pieces[0]}: {type(exc).__name__}: {exc}") from exc


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
        resolved = resolved_path(part.strip()) if part.strip() else None
        if resolved is not None and resolved.is_dir() and resolved not in roots:
            roots.append(resolved)
    return tuple(roots)


def resolved_path(name: str | Path) -> Path | None:
    """`name` with ~ expanded, made absolute, and every .. and symbolic link resolved; None when it does not exist
    or cannot be resolved. Never raises."""
    try:
        return Path(name).expanduser().resolve(strict=True)
    except (OSError, RuntimeError, ValueError):
        return None


def within_roots(path: Path, roots: Sequence[Path]) -> bool:
    """Whether `path` and, for a folder, every entry in it resolve to places under one of `roots`."""
    resolved = resolved_path(path)
    if resolved is None or not any(resolved.is_relative_to(root) for root in roots):
        return False
    if not resolved.is_dir():
        return True
    try:
        entries = list(os.scandir(resolved))
    except OSError:
        return False
    return all((r := resolved_path(e.path)) is not None and any(r.is_relative_to(root) for root in roots)
               for e in entries)


def local_file(name: str) -> Path | None:
    """The existing regular file that a user's model name names (~ expanded), or None. Never raises."""
    try:
        file = Path(name).expanduser()
        return file if file.is_file() else None
    except (OSError, RuntimeError, ValueError):
        return None


def hub_repo_dir(repo_id: str) -> Path:
    """Where the local Hugging Face cache keeps a hub model (its snapshots/ and refs/), whether or not it is there."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"


def in_hub_cache(repo_id: str) -> bool:
    try:
        return hub_repo_dir(repo_id).is_dir()
    except OSError:  # e.g. a name longer than the file system allows
        return False


def cached_hub_folder(repo_id: str, quiet: bool = False) -> Path | None:
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


def check_safetensors(folder: Path) -> None:
    if not (folder / "config.json").exists():
        raise ModelError("That folder has no config.json: it is not a transformers model folder.", detail=str(folder))
    if any(folder.glob("*.safetensors")):
        return
    if any(p.suffix in PICKLE_SUFFIXES for p in folder.iterdir()):
        raise ModelError("That folder has only pickle weights. attnviz loads safetensors only, because unpickling "
                         "can run arbitrary code. Convert the weights to safetensors first.", detail=str(folder))
    raise ModelError("That folder has no .safetensors weights.", detail=str(folder))


def install_lab_variant(model, folder: Path) -> None:
    """A toy-lab attention variant that transformers does not build by itself: the head-wise output gate, which
    config.json flags and whose weights sit in the folder's safetensors (attnviz.lab.variants). Others: nothing."""
    from attnviz.lab.variants import GATE_FLAG, install_gate, load_gate_weights

    if getattr(model.config, GATE_FLAG, False):
        try:
            install_gate(model, load_gate_weights(folder))
        except ValueError as exc:
            raise ModelError("That model's config.json asks for a toy-lab head-wise gate, but its weights have none.",
                             detail=f"{folder}: {exc}") from exc


def from_folder(folder: Path, device_map: str | None = None):
    """A model and tokenizer from a transformers folder: safetensors, no remote code, eager attention."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False, local_files_only=True)
        causal_lm = any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in (config.architectures or []))
        auto = AutoModelForCausalLM if causal_lm else AutoModel
        kwargs: dict[str, Any] = dict(attn_implementation="eager", use_safetensors=True, trust_remote_code=False,
                                      local_files_only=True, dtype=torch.float32)
        if device_map:
            kwargs["device_map"] = device_map
        model = auto.from_pretrained(str(folder), **kwargs)
        install_lab_variant(model, folder)
        tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False, local_files_only=True)
        slim_tokenizer(tokenizer)  # its build-only Python copies of the vocabulary go (attnviz.capture.frugal)
    except ModelError:
        raise
    except Exception as exc:  # a corrupt or mismatched folder raises all sorts; the page must get a message
        raise ModelError("transformers could not load that model: its files are incomplete or corrupt, or its "
                         "architecture is one this version of transformers does not know.",
                         detail=f"{folder}: {type(exc).__name__}: {exc}") from exc
    return model, tokenizer


def gguf_note(header: gguf.Header) -> str:
    """How a GGUF model's weights were stored, read from its header: the model attnviz shows is that one."""
    if not header.quantized:
        return f"Read from a GGUF file, {gguf.quantization(header)}, and converted to float32."
    return (f"Read from a GGUF file, {gguf.quantization(header)}, and dequantized to float32: its attention maps and "
            "perplexities are those of the quantized weights, not of the original model.")


def gguf_load_bytes(pieces: list[Path], folder_name: str) -> int:
    """The converted folder's weights once it exists; before, the GGUF's weights twice (dequantized and saved)."""
    folder = gguf_convert.converted_folder(folder_name)
    return folder_bytes(folder) if folder is not None else 2 * gguf_bytes(pieces)


def recorded_key(distribution: str, file: Path) -> str | None:
    """16 hex digits of the sha256 that pip recorded for a bundled package's file at install (its RECORD) and the
    file's size: the same for every install of the same file, so reinstalling the package (a new venv, a new
    modification time) finds its conversion instead of making another. None where pip recorded no hash for it."""
    import hashlib
    import importlib.metadata

    try:
        files = importlib.metadata.distribution(distribution).files or []
        resolved = file.resolve()
        recorded = next((f.hash.value for f in files if f.hash is not None and f.hash.mode == "sha256"
                         and Path(f.locate()).resolve() == resolved), None)
        size = resolved.stat().st_size
    except (importlib.metadata.PackageNotFoundError, OSError):
        return None
    return None if recorded is None else hashlib.sha256(f"{recorded}\0{size}".encode()).hexdigest()[:16]


def family_of(folder: Path) -> str:
    import json

    try:
        return str(json.loads((folder / "config.json").read_text()).get("model_type", "unknown"))
    except (OSError, ValueError):
        return "unknown"
