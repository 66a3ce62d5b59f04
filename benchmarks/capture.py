"""Capture benchmarks, each a ratio measured in this one run (the machine may be shared and noisy):

1. capture overhead: capture_attention on smollm2-135m at 256 tokens against a plain eager forward of the same
   decoder with output_attentions=True (goal: ratio <= 1.10). Runs alternate; the fastest of each is compared,
   in process CPU time and in wall time.
2. bytes sent to the browser per cell of a 1024 x 1024 attention map: the Heads page's figure (a palette PNG in a
   go.Image) against plotly's default go.Heatmap of the same floats (goal: <= 1 byte per cell).
3. load time of smollm2-135m: first load (GGUF dequantized and converted, into a fresh cache folder) against a
   later load of the converted safetensors folder.

Run: python benchmarks/capture.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attnviz.capture import capture_attention
from attnviz.figures.heads import head_detail
from attnviz.models import load_model

PARAGRAPH = ("Attention lets every token look back at the tokens before it and take a weighted mix of what it finds. "
             "Some heads look at the previous token, some copy what followed an earlier copy of the current token, "
             "and many park their attention on the first token when nothing else is useful. ")


def text_of(loaded, n_tokens: int) -> str:
    """A text that the model's tokenizer cuts into exactly n_tokens tokens."""
    ids = loaded.tokenizer(PARAGRAPH * (n_tokens // 20 + 2)).input_ids
    for cut in range(n_tokens, n_tokens - 20, -1):
        text = loaded.tokenizer.decode(ids[:cut])
        if len(loaded.tokenizer(text).input_ids) == n_tokens:
            return text
    raise RuntimeError("could not build a text of the wanted length")


def overhead(loaded, n_tokens: int = 256, repeats: int = 7) -> dict[str, float]:
    """Fastest of `repeats` alternating runs, in wall time and in process CPU time (all threads): on a shared
    machine the CPU time is the steadier of the two, since waiting for a core is not counted."""
    text = text_of(loaded, n_tokens)
    enc = loaded.tokenizer(text, return_tensors="pt")
    decoder = loaded.model.base_model

    def plain():
        with torch.inference_mode():
            out = decoder(**enc, output_attentions=True, use_cache=False)
        return [a[0].numpy() for a in out.attentions]

    def ours():
        return capture_attention(loaded, text).pattern

    assert np.array_equal(np.stack(plain()), ours())  # the same numbers, so the timing compares like with like
    times: dict[str, list[float]] = {"plain wall": [], "ours wall": [], "plain cpu": [], "ours cpu": []}
    for _ in range(repeats):
        for name, fn in (("plain", plain), ("ours", ours)):
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            times[f"{name} wall"].append(time.perf_counter() - wall)
            times[f"{name} cpu"].append(time.process_time() - cpu)
    return {key: min(values) for key, values in times.items()}


def bytes_per_cell(loaded, n_tokens: int = 1024) -> tuple[float, float]:
    capture = capture_attention(loaded, text_of(loaded, n_tokens), layers=[20])
    p = capture.pattern[0, 0]
    ours = len(head_detail(p, capture.tokens, title="layer 20, head 0").to_json())
    default = len(go.Figure(go.Heatmap(z=p)).to_json())
    return ours / p.size, default / p.size


def load_times() -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        previous = os.environ.get("ATTNVIZ_CACHE_DIR")
        os.environ["ATTNVIZ_CACHE_DIR"] = tmp
        try:
            start = time.perf_counter()
            load_model("smollm2-135m")
            first = time.perf_counter() - start
            start = time.perf_counter()
            load_model("smollm2-135m")
            cached = time.perf_counter() - start
        finally:
            if previous is None:
                os.environ.pop("ATTNVIZ_CACHE_DIR")
            else:
                os.environ["ATTNVIZ_CACHE_DIR"] = previous
    return first, cached


def main() -> None:
    torch.manual_seed(0)
    first, cached = load_times()
    loaded = load_model("smollm2-135m")
    t = overhead(loaded)
    ours_b, default_b = bytes_per_cell(loaded)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device cpu")
    for clock in ("cpu", "wall"):
        ours, plain = t[f"ours {clock}"], t[f"plain {clock}"]
        print(f"capture overhead, smollm2-135m, 256 tokens, {clock} time (fastest of 7): capture {ours * 1e3:.0f} ms "
              f"vs eager forward with output_attentions {plain * 1e3:.0f} ms -> ratio {ours / plain:.2f} "
              "(goal <= 1.10)")
    print(f"bytes to the browser per cell, 1024 x 1024 map: palette PNG figure {ours_b:.2f} B vs plotly default "
          f"heatmap {default_b:.1f} B -> {default_b / ours_b:.0f}x smaller (goal <= 1 B)")
    print(f"load smollm2-135m: first (GGUF -> safetensors) {first:.1f} s vs cached {cached:.2f} s -> "
          f"{first / cached:.0f}x faster (goal >= 20x)")


if __name__ == "__main__":
    main()
