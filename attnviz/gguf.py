"""GGUF files: what a file's header says (its architecture, its tensors and how each one is stored) and whether
transformers can read it; attnviz.gguf_convert converts it once into a float32 safetensors folder.

The header is read here in one forward pass over the bytes rather than with gguf.GGUFReader, which makes a numpy
view of every entry of every array (Gemma 3's vocabulary is three arrays of 262,144 entries), where this reader
skips long arrays and stops at the tensor table. It also reads a
model shipped in pieces without joining them first. tests/test_gguf.py checks it against GGUFReader.
"""

from __future__ import annotations

import contextlib
import math
import re
import struct
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType, LlamaFileType

from attnviz.errors import AttnvizError

Progress = Callable[[str], None]

NOT_GGUF = ("That file is not a GGUF model. attnviz opens .gguf files and folders of transformers models "
            "(safetensors weights).")
TRUNCATED = "That GGUF file is incomplete: it ends before the last of its tensors (a download or copy cut short?)."
CORRUPT = "That GGUF file is corrupt: its header cannot be read."

KEEP_ARRAY = 64  # longer arrays (vocabularies, merges, scores) are skipped and kept as their length only
_MAX_STRING = 1 << 24  # 16 MiB: larger than any key, value or token; a larger length is a corrupt header
_MAX_COUNT = 1 << 32  # entries in one array, key/value pairs, tensors
_MAX_DIMS = 4  # GGML_MAX_DIMS
READ_BYTES = 4 << 20  # bytes read from the file at a time
_SCALAR = {GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
           GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
           GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
           GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d"}
_UNQUANTIZED = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16,
                GGMLQuantizationType.F64}


class GGUFError(AttnvizError, ValueError):
    """A file attnviz cannot read as a GGUF model. The message says why without naming the file (a server shows it
    to its visitors); `detail` holds the specifics, for the log."""

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail


@dataclass(frozen=True)
class LongArray:
    """An array of the metadata longer than KEEP_ARRAY, skipped: only its element type and length are kept."""

    type: GGUFValueType
    length: int


@dataclass(frozen=True)
class Tensor:
    """One entry of the tensor table. shape is in GGUF order, the row length first: token_embd.weight of shape
    (640, 262144) is 262,144 rows of 640 weights."""

    name: str
    shape: tuple[int, ...]
    type: GGMLQuantizationType
    offset: int  # from the start of the data section

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def n_bytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.type]
        return self.n_elements // block * size


@dataclass(frozen=True)
class Header:
    """A GGUF file's header: its metadata (long arrays as LongArray), its tensor table, where the tensor data
    starts and how many bytes the whole file has."""

    version: int
    metadata: dict[str, Any]
    tensors: tuple[Tensor, ...]
    data_offset: int
    size: int

    @property
    def architecture(self) -> str:
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else ""

    @property
    def file_type(self) -> str | None:
        """What the file says its weights were quantized as ("Q4_K_M", "F16", ...), or None when it does not say."""
        value = self.metadata.get("general.file_type")
        try:
            kind = LlamaFileType(int(value))
        except (TypeError, ValueError):
            return None
        return None if kind is LlamaFileType.GUESSED else kind.name.removeprefix("MOSTLY_").removeprefix("ALL_")

    @property
    def n_elements(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def quantized(self) -> bool:
        """Whether any weight matrix is stored in a quantized type (1-D norms and biases are F32 in every file)."""
        return any(t.type not in _UNQUANTIZED for t in self.tensors if len(t.shape) > 1)


def read_header(pieces: Sequence[Path]) -> Header:
    """The header of the GGUF file `pieces` (one file, or the pieces of one, in order). Raises GGUFError
    (NOT_GGUF, TRUNCATED or CORRUPT) for anything that is not a whole GGUF file."""
    size = sum(Path(p).stat().st_size for p in pieces)
    with _Stream(pieces) as stream:
        try:
            return _parse(stream, size)
        except GGUFError:
            raise
        except _EndOfFile as exc:
            raise GGUFError(TRUNCATED, f"the file ends inside its header ({size} bytes)") from exc
        except (struct.error, ValueError, KeyError, OverflowError) as exc:  # an unknown type, a bad number
            raise GGUFError(CORRUPT, f"{type(exc).__name__}: {exc}") from exc


@lru_cache(maxsize=32)
def _cached_header(identity: tuple) -> Header:
    return read_header([Path(name) for name, _size, _mtime in identity])


def header(pieces: Sequence[Path]) -> Header:
    """read_header, remembered per file as long as its pieces keep their size and modification time (the registry
    describes bundled models on every page view)."""
    identity = tuple((str(p), (st := Path(p).stat()).st_size, st.st_mtime_ns) for p in pieces)
    return _cached_header(identity)


def _parse(stream: _Stream, size: int) -> Header:
    if stream.available(4) < 4 or struct.unpack("<I", stream.take(4))[0] != GGUF_MAGIC:
        raise GGUFError(NOT_GGUF, "no GGUF magic at the start")
    version = stream.scalar("<I")
    if version not in (2, 3):  # a big-endian file reads as a version above 65535
        raise GGUFError(CORRUPT, f"GGUF version {version}, not 2 or 3")
    n_tensors, n_values = stream.count(), stream.count()
    metadata: dict[str, Any] = {}
    for _ in range(n_values):
        key = stream.string()
        metadata[key] = stream.value(GGUFValueType(stream.scalar("<I")))
    tensors = []
    for _ in range(n_tensors):
        name = stream.string()
        n_dims = stream.scalar("<I")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise GGUFError(CORRUPT, f"tensor {name!r} has {n_dims} dimensions")
        shape = tuple(stream.scalar("<Q") for _ in range(n_dims))
        tensors.append(Tensor(name, shape, GGMLQuantizationType(stream.scalar("<I")), stream.scalar("<Q")))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(CORRUPT, f"alignment {alignment!r}")
    data_offset = -(-stream.position // alignment) * alignment
    _check_tensors(tensors, data_offset, size)
    return Header(version, metadata, tuple(tensors), data_offset, size)


def _check_tensors(tensors: list[Tensor], data_offset: int, size: int) -> None:
    """Every tensor whole: a known type whose blocks fit its rows, a unique name, its bytes inside the file."""
    if len({t.name for t in tensors}) != len(tensors):
        raise GGUFError(CORRUPT, "two tensors share a name")
    for t in tensors:
        block = GGML_QUANT_SIZES[t.type][0]
        if min(t.shape) < 1 or t.shape[0] % block:
            raise GGUFError(CORRUPT, f"tensor {t.name!r}: shape {t.shape} does not fit blocks of {block}")
        end = data_offset + t.offset + t.n_bytes
        if end > size:
            raise GGUFError(TRUNCATED, f"tensor {t.name!r} ends at byte {end}; the file has {size}")


class _EndOfFile(Exception):
    pass


class _Stream:
    """The bytes of one file, or of its pieces one after another, read forward through a buffer."""

    def __init__(self, pieces: Sequence[Path]):
        self._pieces = [Path(p) for p in pieces]
        self._files = contextlib.ExitStack()
        self._file = None
        self._buffer = bytearray()
        self._start = 0  # where in the buffer the next read starts
        self._consumed = 0  # bytes dropped from the front of the buffer

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc) -> None:
        self._files.close()

    @property
    def position(self) -> int:
        return self._consumed + self._start

    def _fill(self) -> bool:
        """Reads the next block, keeping only what is still to be read; False at the end of the last piece."""
        del self._buffer[:self._start]
        self._consumed += self._start
        self._start = 0
        while self._pieces:
            if self._file is None:
                self._file = self._files.enter_context(open(self._pieces[0], "rb"))
            block = self._file.read(READ_BYTES)
            if block:
                self._buffer += block
                return True
            self._pieces.pop(0)
            self._file = None
        return False

    def available(self, n: int) -> int:
        """Makes up to n bytes readable and says how many are."""
        while len(self._buffer) - self._start < n and self._fill():
            pass
        return min(n, len(self._buffer) - self._start)

    def take(self, n: int) -> bytes:
        if self.available(n) < n:
            raise _EndOfFile
        self._start += n
        return bytes(self._buffer[self._start - n:self._start])

    def skip(self, n: int) -> None:
        while n:
            if self._start == len(self._buffer) and not self._fill():
                raise _EndOfFile
            step = min(n, len(self._buffer) - self._start)
            self._start += step
            n -= step

    def scalar(self, fmt: str):
        size = struct.calcsize(fmt)
        if len(self._buffer) - self._start < size and self.available(size) < size:
            raise _EndOfFile
        (value,) = struct.unpack_from(fmt, self._buffer, self._start)
        self._start += size
        return value

    def count(self) -> int:
        n = self.scalar("<Q")
        if n > _MAX_COUNT:
            raise GGUFError(CORRUPT, f"a count of {n}")
        return n

    def string(self) -> str:
        n = self.scalar("<Q")
        if n > _MAX_STRING:
            raise GGUFError(CORRUPT, f"a string of {n} bytes")
        return self.take(n).decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        for _ in range(count):
            n = self.scalar("<Q")
            if n > _MAX_STRING:
                raise GGUFError(CORRUPT, f"a string of {n} bytes")
            if len(self._buffer) - self._start >= n:  # the usual case, without a call
                self._start += n
            else:
                self.skip(n)

    def value(self, kind: GGUFValueType):
        if kind in _SCALAR:
            return self.scalar(_SCALAR[kind])
        if kind == GGUFValueType.STRING:
            return self.string()
        item, length = GGUFValueType(self.scalar("<I")), self.count()
        if length <= KEEP_ARRAY:
            return [self.value(item) for _ in range(length)]
        if item in _SCALAR:
            self.skip(length * struct.calcsize(_SCALAR[item]))
        elif item == GGUFValueType.STRING:
            self.skip_strings(length)
        else:  # an array of arrays: read through, element by element
            for _ in range(length):
                self.value(item)
        return LongArray(item, length)


def quantization(h: Header) -> str:
    """How the file stores its weights, read from it: what it says it was quantized as, then the types its weight
    matrices really have, by share of the weights (llama.cpp gives rows that its k-quant blocks do not fit another
    type), then the bits per weight over all its tensors. For example
    "4-bit: Q4_K_M (Q5_0, Q4_K, Q6_K and Q8_0 tensors, embeddings Q8_0; 6.9 bits per weight)"."""
    matrices = [t for t in h.tensors if len(t.shape) > 1]
    named = {t.name: t for t in matrices}
    body = Counter()
    for t in matrices:
        if t.name not in ("token_embd.weight", "output.weight"):
            body[t.type.name] += t.n_elements
    parts = [f"{_listing([name for name, _ in body.most_common()])} tensors"] if body else []
    for key, word in (("token_embd.weight", "embeddings"), ("output.weight", "output")):
        if key in named:
            parts.append(f"{word} {named[key].type.name}")
    bits = 8 * sum(t.n_bytes for t in h.tensors) / max(h.n_elements, 1)
    kind = h.file_type
    digits = re.search(r"\d+", kind or "")
    if kind and h.quantized and digits:
        prefix = f"{digits.group()}-bit: {kind}"
    elif kind:
        prefix = f"{'quantized' if h.quantized else 'not quantized'}: {kind}"
    else:
        prefix = "quantized" if h.quantized else "not quantized"
    return f"{prefix} ({', '.join(parts)}; {bits:.1f} bits per weight)"


def _listing(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


_NOT_SHOWN = {"mamba": "has no attention", "t5": "is an encoder-decoder", "umt5": "is an encoder-decoder"}


def readable_architectures() -> list[str]:
    """The GGUF architectures that transformers reads and attnviz can show: those of its config mapping and of its
    newer GGUF loader, less those without attention maps of the kinds attnviz reads (see _NOT_SHOWN)."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.integrations.gguf import GGUF_ARCHS

    return sorted((set(GGUF_CONFIG_MAPPING) - {"general", "tokenizer"} | set(GGUF_ARCHS)) - set(_NOT_SHOWN))


def check_readable(h: Header) -> None:
    """Raises GGUFError when transformers cannot build this file's model or tokenizer, or attnviz cannot show it."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import select_tokenizer_builder

    arch = h.architecture
    # llama.cpp spells some architectures differently from transformers' table: gpt-oss, qwen2moe, minimax-m2
    spellings = {arch, re.sub(r"(?<=[a-z0-9])moe$", "_moe", arch.replace("-", "_"))}
    shown = re.sub(r"[^\w.-]", "?", arch)[:40] or "unnamed"
    for name in spellings & set(_NOT_SHOWN):
        raise GGUFError(f"That GGUF file holds a {shown} model, which {_NOT_SHOWN[name]}: attnviz shows the "
                        "attention of decoders and encoders.", f"architecture {arch!r}")
    readable = readable_architectures()
    if not spellings & set(readable):
        raise GGUFError(f"That GGUF file holds a {shown} model, an architecture transformers cannot read from GGUF. "
                        f"It reads: {', '.join(readable)}.", f"architecture {arch!r}")
    tokenizer = h.metadata.get("tokenizer.ggml.model")
    try:
        select_tokenizer_builder(arch, tokenizer)
    except ValueError as exc:
        raise GGUFError("That GGUF file's tokenizer is of a kind transformers cannot build.",
                        f"tokenizer.ggml.model {tokenizer!r}: {exc}") from exc


