"""Capture files: an AttentionCapture (or a part of it: some layers, some heads, float16) written as npz or
safetensors, and read back. Plain arrays and JSON metadata only: nothing in a file can run code (no pickle)."""

from __future__ import annotations

import io
import json

import numpy as np

from attnviz.capture import AttentionCapture, CaptureError

MAX_EXPORT_BYTES = 2 * 1024**3  # the largest pattern an export builds


def export_bytes(capture: AttentionCapture, *, layers=None, heads=None, dtype=np.float32) -> int:
    """Bytes of the pattern array capture_to_bytes would write for these layers and heads (before compression)."""
    n_layers = capture.n_layers if layers is None else len(set(layers))
    n_heads = capture.n_heads if heads is None else len(set(heads))
    return n_layers * n_heads * capture.n_tokens ** 2 * np.dtype(dtype).itemsize


def capture_to_bytes(capture: AttentionCapture, fmt: str = "npz", *, layers=None, heads=None,
                     dtype=None) -> bytes:
    """The capture as a file: "npz" (numpy.load) or "safetensors" (safetensors.numpy.load; tokens and names in the
    metadata as JSON). Arrays: pattern [layer, head, query, key], token_ids, layers, heads, kv_head_of (of the heads
    written), scores if any.

    layers, heads: write only these model layers and heads (default all captured); dtype: np.float16 halves the
    file (default: the capture's own dtype). In the long-text store the weights are computed from q and k for the
    layers and heads asked; more than MAX_EXPORT_BYTES of pattern is refused with the size."""

    layers = list(capture.layers) if layers is None else sorted({int(i) for i in layers})
    heads = list(range(capture.n_heads)) if heads is None else sorted({int(h) for h in heads})
    if not heads or any(not 0 <= h < capture.n_heads for h in heads):
        raise CaptureError(f"Heads must lie in 0 .. {capture.n_heads - 1}.")
    out_dtype = np.dtype(dtype) if dtype is not None else (
        capture.pattern.dtype if capture.pattern is not None else np.dtype(np.float32))
    need = export_bytes(capture, layers=layers, heads=heads, dtype=out_dtype)
    if need > MAX_EXPORT_BYTES:
        raise CaptureError(f"{len(layers)} layers x {len(heads)} heads x {capture.n_tokens:,}² weights would be "
                           f"{need / 2**30:.1f} GiB (limit {MAX_EXPORT_BYTES / 2**30:.0f} GiB): export fewer "
                           "layers or heads, or float16.")
    if capture.pattern is not None:
        index = [capture.index_of(i) for i in layers]
        pattern = capture.pattern[np.ix_(index, heads)].astype(out_dtype, copy=False)
    else:  # computed a block of rows at a time into the one array written, never a float32 copy of it all
        pattern = np.empty((len(layers), len(heads), capture.n_tokens, capture.n_tokens), dtype=out_dtype)
        for li, layer in enumerate(layers):
            for a in range(0, capture.n_tokens, 256):
                b = min(capture.n_tokens, a + 256)
                pattern[li, :, a:b] = capture.layer_rows(layer, a, b, heads=heads)
    arrays = {"pattern": np.ascontiguousarray(pattern),
              "token_ids": np.asarray(capture.token_ids, dtype=np.int64),
              "layers": np.asarray(layers, dtype=np.int64),
              "heads": np.asarray(heads, dtype=np.int64),
              "kv_head_of": np.asarray([capture.kv_head_of[h] for h in heads], dtype=np.int64)}
    if capture._scores is not None:  # computed because they were asked for (with_scores, --scores)
        index = [capture.index_of(i) for i in layers]
        arrays["scores"] = np.ascontiguousarray(capture._scores[np.ix_(index, heads)])
    meta = {"tokens": capture.tokens, "model_name": capture.model_name, "causal": capture.causal,
            "scaling": capture.scaling, "head_dim": capture.head_dim}
    if fmt == "npz":
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays, meta=np.asarray(json.dumps(meta)))
        return buffer.getvalue()
    if fmt == "safetensors":
        from safetensors.numpy import save

        return save(arrays, metadata={"attnviz": json.dumps(meta)})
    raise CaptureError(f"Unknown export format {fmt!r}: use npz or safetensors.")


def save_capture(capture: AttentionCapture, path) -> None:
    """Writes capture_to_bytes to path; the format follows the suffix (.npz or .safetensors)."""
    from pathlib import Path

    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in ("npz", "safetensors"):
        raise CaptureError(f"Output file {path.name!r} must end in .npz or .safetensors.")
    path.write_bytes(capture_to_bytes(capture, fmt))


def load_capture(path) -> AttentionCapture:
    """Reads a file written by save_capture (either format) back into an AttentionCapture."""
    from pathlib import Path

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
    return AttentionCapture(tokens=list(meta["tokens"]), token_ids=arrays["token_ids"].tolist(),
                            pattern=arrays["pattern"], layers=arrays["layers"].tolist(),
                            kv_head_of=arrays["kv_head_of"].tolist(), model_name=meta["model_name"],
                            causal=bool(meta["causal"]), _scores=arrays.get("scores"),
                            _saved={"scaling": meta["scaling"], "head_dim": meta["head_dim"]})
