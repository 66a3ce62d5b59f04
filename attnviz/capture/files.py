"""Capture files: an AttentionCapture (or a part of it: some layers, some heads, float16) written as npz or
safetensors, and read back. Plain arrays and JSON metadata only: nothing in a file can run code (no pickle).

The pattern is streamed into the file a block of query rows of one head at a time (write_capture): neither the
[layer, head, n, n] array nor a second in-memory copy of the file is ever built, so a long export costs the
file on disk plus one block. npz: each array a member of a zip archive (numpy.load reads it, as np.savez_compressed
writes it); safetensors: the 8-byte header length, the JSON header with every tensor's offsets, then the raw bytes.
"""

from __future__ import annotations

import io
import json
import os
import struct
import zipfile
from pathlib import Path

import numpy as np

from attnviz.capture.modules import CaptureError
from attnviz.capture.store import AttentionCapture

MAX_EXPORT_BYTES = 2 * 1024**3  # the largest pattern an export writes
ROWS_PER_BLOCK = 256  # query rows of one head computed (long-text store) and written at a time
_SAFETENSORS_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int64): "I64"}


def export_bytes(capture: AttentionCapture, *, layers=None, heads=None, dtype=np.float32) -> int:
    """Bytes of the pattern array (and the linear mixers' maps) write_capture would write for these layers and heads
    (before compression)."""
    layers = None if layers is None else sorted({int(i) for i in layers})
    softmax, linear = _linear_plan(capture, layers, heads)
    n_heads = capture.n_heads if heads is None else len(set(heads))
    heads_written = len(softmax) * n_heads + sum(capture.layer_heads(i, "linear") for i in linear)
    return heads_written * capture.n_tokens ** 2 * np.dtype(dtype).itemsize


def _linear_plan(capture: AttentionCapture, layers, heads) -> tuple[list[int], list[int]]:
    """(softmax layers, linear layers) of an export: a linear mixer's map goes whole (every head) into its own
    array, linear_map_<layer>, when every head is exported."""
    linear = [i for i in capture.linear_layers if heads is None and (layers is None or i in layers)]
    if layers is None:
        return list(capture.layers), linear
    return [i for i in layers if i not in linear or i in capture.layers], linear


def _plan(capture: AttentionCapture, layers, heads, dtype):
    """(layers, linear layers, heads, dtype, the small arrays, metadata) of an export, checked before anything is
    written."""
    layers = None if layers is None else sorted({int(i) for i in layers})
    layers, linear = _linear_plan(capture, layers, heads)
    for layer in layers:
        capture.index_of(layer)  # a CaptureError names the captured layers
    heads = list(range(capture.n_heads)) if heads is None else sorted({int(h) for h in heads})
    if not heads or any(not 0 <= h < capture.n_heads for h in heads):
        raise CaptureError(f"Heads must lie in 0 .. {capture.n_heads - 1}.")
    out_dtype = np.dtype(dtype) if dtype is not None else (
        capture.pattern.dtype if capture.pattern is not None else np.dtype(np.float32))
    need = export_bytes(capture, layers=layers + linear, heads=heads, dtype=out_dtype)
    if need > MAX_EXPORT_BYTES:
        raise CaptureError(f"{len(layers)} layers x {len(heads)} heads x {capture.n_tokens:,}² weights would be "
                           f"{need / 2**30:.1f} GiB (limit {MAX_EXPORT_BYTES / 2**30:.0f} GiB): export fewer "
                           "layers or heads, or float16.")
    numbers = capture.head_numbers
    small = {"token_ids": np.asarray(capture.token_ids, dtype=np.int64),
             "layers": np.asarray(layers, dtype=np.int64),
             "heads": np.asarray([numbers[h] for h in heads], dtype=np.int64),
             "kv_head_of": np.asarray([capture.kv_head_of[h] for h in heads], dtype=np.int64)}
    meta = {"tokens": capture.tokens, "model_name": capture.model_name, "causal": capture.causal,
            "scaling": capture.scaling, "head_dim": capture.head_dim}
    if capture.layer_kinds:
        meta["layer_kinds"] = list(capture.layer_kinds)
    return layers, linear, heads, out_dtype, small, meta


def _pattern_blocks(capture: AttentionCapture, layers, heads, dtype):
    """The exported pattern [layer, head, query, key] in C order, as blocks of rows of one head."""
    n = capture.n_tokens
    for layer in layers:
        for h in heads:
            for a in range(0, n, ROWS_PER_BLOCK):
                b = min(n, a + ROWS_PER_BLOCK)
                yield np.ascontiguousarray(capture.layer_rows(layer, a, b, heads=[h])[0], dtype=dtype)


def _map_blocks(capture: AttentionCapture, layer: int, dtype):
    """A linear layer's implicit map [head, query, key] in C order, as blocks of rows of one head."""
    n = capture.n_tokens
    for h in range(capture.layer_heads(layer, "linear")):
        for a in range(0, n, ROWS_PER_BLOCK):
            rows = capture.layer_rows(layer, a, min(n, a + ROWS_PER_BLOCK), heads=[h], mixer="linear")[0]
            yield np.ascontiguousarray(rows, dtype=dtype)


def _score_blocks(capture: AttentionCapture, layers, heads):
    for layer in layers:
        for h in heads:
            yield np.ascontiguousarray(capture.computed_scores[capture.index_of(layer), h])


def write_capture(capture: AttentionCapture, out, fmt: str = "npz", *, layers=None, heads=None,
                  dtype=None) -> None:
    """Writes the capture to `out` (a binary file object) as "npz" (numpy.load) or "safetensors"
    (safetensors.numpy.load_file; tokens and names in the metadata as JSON). Arrays: pattern [layer, head, query,
    key], token_ids, layers, heads (the model's head numbers), kv_head_of (of the heads written), scores if the
    capture has them, and linear_map_<layer> [head, query, key] for each linear mixer's implicit map (written with
    every head), with the layers' kinds in the metadata.

    layers, heads: write only these model layers and heads (default all captured); dtype: np.float16 halves the
    file (default: the capture's own dtype). In the long-text store the weights are computed from q and k, a block
    of rows at a time, as they are written. More than MAX_EXPORT_BYTES of pattern is refused with the size, before
    anything is written."""
    if fmt not in ("npz", "safetensors"):
        raise CaptureError(f"Unknown export format {fmt!r}: use npz or safetensors.")
    layers, linear, heads, dtype, small, meta = _plan(capture, layers, heads, dtype)
    n = capture.n_tokens
    big = {"pattern": ((len(layers), len(heads), n, n), dtype, lambda: _pattern_blocks(capture, layers, heads, dtype))}
    for layer in linear:
        big[f"linear_map_{layer}"] = ((capture.layer_heads(layer, "linear"), n, n), dtype,
                                      lambda layer=layer: _map_blocks(capture, layer, dtype))
    if capture.computed_scores is not None:  # computed because they were asked for (with_scores, --scores)
        scores_dtype = capture.computed_scores.dtype
        big["scores"] = ((len(layers), len(heads), n, n), scores_dtype, lambda: _score_blocks(capture, layers, heads))
    if fmt == "npz":
        _write_npz(out, big, small, meta)
    else:
        _write_safetensors(out, big, small, meta)


def _write_npz(out, big: dict, small: dict, meta: dict) -> None:
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as archive:
        for name, (shape, dtype, blocks) in big.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
                          "shape": shape}
                np.lib.format.write_array_header_2_0(member, header)
                for block in blocks():
                    member.write(block.tobytes())
        for name, array in {**small, "meta": np.asarray(json.dumps(meta))}.items():
            with archive.open(f"{name}.npy", "w") as member:
                np.lib.format.write_array(member, array, allow_pickle=False)


def _write_safetensors(out, big: dict, small: dict, meta: dict) -> None:
    entries, offset = {}, 0
    for name, (shape, dtype, _) in big.items():
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        entries[name] = {"dtype": _SAFETENSORS_DTYPES[np.dtype(dtype)], "shape": list(shape),
                         "data_offsets": [offset, offset + size]}
        offset += size
    for name, array in small.items():
        entries[name] = {"dtype": _SAFETENSORS_DTYPES[array.dtype], "shape": list(array.shape),
                         "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    header = json.dumps({"__metadata__": {"attnviz": json.dumps(meta)}, **entries}, separators=(",", ":"))
    header = header.encode("utf-8")
    header += b" " * (-len(header) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    out.write(struct.pack("<Q", len(header)))
    out.write(header)
    for _, _, blocks in big.values():
        for block in blocks():
            out.write(block.astype(block.dtype.newbyteorder("<"), copy=False).tobytes())
    for array in small.values():
        out.write(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())


def capture_to_bytes(capture: AttentionCapture, fmt: str = "npz", *, layers=None, heads=None,
                     dtype=None) -> bytes:
    """write_capture into memory: the file's bytes (small captures and tests; the page and the command line write
    to a file)."""
    buffer = io.BytesIO()
    write_capture(capture, buffer, fmt, layers=layers, heads=heads, dtype=dtype)
    return buffer.getvalue()


def save_capture(capture: AttentionCapture, path, *, layers=None, heads=None, dtype=None) -> None:
    """write_capture to path; the format follows the suffix (.npz or .safetensors). Nothing is left at path when
    the export is refused or fails."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in ("npz", "safetensors"):
        raise CaptureError(f"Output file {path.name!r} must end in .npz or .safetensors.")
    _plan(capture, layers, heads, dtype)  # refused before the file exists
    try:
        with open(path, "wb") as fh:
            write_capture(capture, fh, fmt, layers=layers, heads=heads, dtype=dtype)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def export_to_temporary_file(capture: AttentionCapture, fmt: str, *, layers=None, heads=None, dtype=None):
    """write_capture into a temporary file, returned open for reading (an io.BufferedReader, what a download
    button reads). The file has no name left on disk: it goes when the reader is closed."""
    import tempfile

    fd, name = tempfile.mkstemp(prefix="attnviz-export-", suffix=f".{fmt}")
    try:
        with os.fdopen(fd, "wb") as fh:
            write_capture(capture, fh, fmt, layers=layers, heads=heads, dtype=dtype)
        return open(name, "rb")
    finally:
        try:
            os.unlink(name)
        except OSError:  # a system that cannot remove an open file: it stays in the temporary folder
            pass


def load_capture(path) -> AttentionCapture:
    """Reads a file written by write_capture (either format) back into an AttentionCapture. A file of some heads
    keeps the model's head numbers (AttentionCapture.head_numbers); its pattern's head axis follows them in order."""
    path = Path(path)
    if path.suffix.lower() == ".npz":
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(str(arrays.pop("meta")))
    else:
        from safetensors import safe_open
        from safetensors.numpy import load_file

        arrays = load_file(str(path))
        with safe_open(str(path), framework="numpy") as fh:
            meta = json.loads(fh.metadata()["attnviz"])
    heads = arrays["heads"].tolist() if "heads" in arrays else list(range(arrays["pattern"].shape[1]))
    saved = {"scaling": meta["scaling"], "head_dim": meta["head_dim"]}
    if heads != list(range(len(heads))):
        saved["heads"] = heads
    maps = {int(name.removeprefix("linear_map_")): array for name, array in arrays.items()
            if name.startswith("linear_map_")}
    for array in maps.values():
        array.flags.writeable = False
    kinds = meta.get("layer_kinds")
    return AttentionCapture(tokens=list(meta["tokens"]), token_ids=arrays["token_ids"].tolist(),
                            pattern=arrays["pattern"], layers=arrays["layers"].tolist(),
                            kv_head_of=arrays["kv_head_of"].tolist(), model_name=meta["model_name"],
                            causal=bool(meta["causal"]), computed_scores=arrays.get("scores"), file_facts=saved,
                            layer_kinds=tuple(kinds) if kinds else None, maps=maps or None)
