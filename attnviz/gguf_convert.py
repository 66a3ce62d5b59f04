"""A GGUF file's one-time conversion into a float32 safetensors folder in attnviz's cache: the folder's name (from
the file's identity), the pieces of a split file joined and checked against their sha256, the weights dequantized by
transformers, all under a thread and a file lock, renamed into place only when whole (attnviz.gguf reads headers).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gguf as gguf_package
import numpy as np
from gguf import GGUFReader

from attnviz import paths
from attnviz.gguf import READ_BYTES, GGUFError, Progress


def file_key(path: Path) -> str:
    """16 hex digits that change when the file does: a hash of its resolved path, size and modification time."""
    resolved = Path(path).resolve()
    info = resolved.stat()
    return hashlib.sha256(f"{resolved}\0{info.st_size}\0{info.st_mtime_ns}".encode()).hexdigest()[:16]


def folder_name(path: Path) -> str:
    """The converted folder's name for a user's GGUF file: its stem (for whoever looks in the cache) and file_key."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(path).stem)[:40].strip(".-") or "model"
    return f"gguf-{stem}-{file_key(path)}"


def converted_folder(name: str) -> Path | None:
    """converted_dir()/name once a conversion has finished there, else None."""
    target = paths.converted_dir() / name
    return target if (target / "config.json").exists() else None


_convert_lock = threading.Lock()


def converted(pieces: Sequence[Path], name: str, report: Progress, sha256: str | None = None) -> Path:
    """The safetensors folder converted_dir()/name made from the GGUF file `pieces` (one file, or its pieces in
    order, joined first; sha256: what the joined bytes must hash to): every weight dequantized to float32 by
    transformers, saved with the tokenizer. Made once and shared: a lock between threads and a file lock between
    processes; written in a temporary folder beside it and renamed into place, so no one reads half a folder."""
    if (done := converted_folder(name)) is not None:
        return done
    target = paths.converted_dir() / name
    with _convert_lock, _file_lock(target.parent / f"{name}.lock"):
        if (done := converted_folder(name)) is not None:  # another process converted it while we waited
            return done
        with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=target.parent) as work:
            work = Path(work)
            file = Path(pieces[0])
            if len(pieces) > 1 or sha256 is not None:
                file = join(pieces, work / "model.gguf", report, sha256)
            dequantize(file, work / "model", report)
            os.replace(work / "model", target)
    return target


def join(pieces: Sequence[Path], out: Path, report: Progress, sha256: str | None = None) -> Path:
    """Writes the pieces one after another to `out`, a block at a time, and checks the result's sha256."""
    report(f"Joining the model's {len(pieces)} package files into one GGUF file…")
    digest = hashlib.sha256()
    with open(out, "wb") as sink:
        for piece in pieces:
            with open(piece, "rb") as source:
                while block := source.read(READ_BYTES):
                    digest.update(block)
                    sink.write(block)
    if sha256 is not None and digest.hexdigest() != sha256:
        raise GGUFError("The model's package files are damaged: joined, they are not the file they should be. "
                        "Reinstall the package.", f"sha256 {digest.hexdigest()}, expected {sha256}")
    return out


def dequantize(file: Path, out: Path, report: Progress) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    report("Dequantizing the GGUF to float32…")
    common: dict[str, Any] = dict(gguf_file=file.name, local_files_only=True, trust_remote_code=False)
    with read_once():
        # dequantize=True: transformers' newer GGUF loader would otherwise keep some weights in their quantized blocks
        model, info = AutoModelForCausalLM.from_pretrained(str(file.parent), dtype=torch.float32,
                                                           quantization_config=GgufConfig(dequantize=True),
                                                           output_loading_info=True, **common)
        if info["missing_keys"]:  # transformers would fill them with random weights, and warn only
            raise GGUFError("That GGUF file lacks some of the weights its architecture needs.",
                            f"missing: {sorted(info['missing_keys'])}")
        tokenizer = AutoTokenizer.from_pretrained(str(file.parent), **common)
    report("Saving the converted model as safetensors…")
    # The weights are plain float32 now; the GGUF quantizer left on the model is only bookkeeping, and
    # save_pretrained refuses to write while it is attached.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


@contextlib.contextmanager
def read_once():
    """transformers reads a GGUF file's metadata with gguf.GGUFReader three times in one conversion (for the config,
    the weights and the tokenizer), each a numpy view per vocabulary entry, sliced from a numpy memmap. Inside this
    block (one conversion at a time: the caller holds _convert_lock) gguf.GGUFReader is ArrayReader, one per file,
    made once and handed to each: for Gemma 3's 262,144 tokens, most of a conversion's time was those three reads
    (`benchmarks/capture.py --load gemma3-270m` times a conversion)."""
    own, readers = gguf_package.GGUFReader, {}

    def reader(path, mode: str = "r"):
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = ArrayReader(path, mode)
        return readers[key]

    gguf_package.GGUFReader = reader
    try:
        yield
    finally:
        gguf_package.GGUFReader = own


class ArrayReader(GGUFReader):
    """gguf's reader over the file's memory map as a plain array: each slice it takes is then a plain view (a
    memmap's slicing costs about four times more), with the same fields and tensors."""

    @property
    def data(self):
        return self._data

    @data.setter
    def data(self, value):
        self._data = value.view(np.ndarray) if isinstance(value, np.memmap) else value


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive lock between processes (fcntl where it exists; elsewhere only the in-process lock applies)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
