"""Capture benchmarks, each a ratio measured in this one run (the machine may be shared and noisy):

1. capture overhead: capture_attention on smollm2-135m at 256 tokens against a plain eager forward of the same
   decoder with output_attentions=True (goal: ratio <= 1.10). Runs alternate; the fastest of each is compared,
   in process CPU time and in wall time.
2. bytes sent to the browser per cell of a 1024 x 1024 attention map: the Heads page's figure (a palette PNG in a
   go.Image) against plotly's default go.Heatmap of the same floats (goal: <= 1 byte per cell).
3. load time of smollm2-135m: first load (GGUF dequantized and converted, into a fresh cache folder) against a
   later load of the converted safetensors folder.

Run: python benchmarks/capture.py
     python benchmarks/capture.py --quick    the smallest case of each (toy-llama-gqa, 64 tokens, 2 repeats; the
                                             load of a toy written as a GGUF file): seconds, not figures
     python benchmarks/capture.py --load gemma3-270m    part 3 only, for that bundled model
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # attnviz, and tests.gguf_files for --quick

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


def bytes_per_cell(loaded, n_tokens: int = 1024, layer: int = 20) -> tuple[float, float]:
    capture = capture_attention(loaded, text_of(loaded, n_tokens), layers=[layer])
    p = capture.pattern[0, 0]
    ours = len(head_detail(p, capture.tokens, title=f"layer {layer}, head 0").to_json())
    default = len(go.Figure(go.Heatmap(z=p)).to_json())
    return ours / p.size, default / p.size


def toy_gguf(folder: Path) -> str:
    """toy-llama-gqa written as a float32 GGUF file in `folder` (tests/gguf_files.py): a file that load_model
    converts as it converts a bundled model's."""
    from tests.gguf_files import write_llama

    toy = load_model("toy-llama-gqa")
    return str(write_llama(folder / "toy-llama-gqa.gguf", toy.model, toy.tokenizer))


def load_times(name: str = "smollm2-135m") -> tuple[float, float]:
    """(first load, converting into a fresh cache folder; a later load of the converted folder) of `name`, or with
    name None of toy_gguf's file."""
    with tempfile.TemporaryDirectory() as tmp:
        previous = os.environ.get("ATTNVIZ_CACHE_DIR")
        os.environ["ATTNVIZ_CACHE_DIR"] = tmp
        try:
            name = name or toy_gguf(Path(tmp))
            start = time.perf_counter()
            load_model(name)
            first = time.perf_counter() - start
            start = time.perf_counter()
            load_model(name)
            cached = time.perf_counter() - start
        finally:
            if previous is None:
                os.environ.pop("ATTNVIZ_CACHE_DIR")
            else:
                os.environ["ATTNVIZ_CACHE_DIR"] = previous
    return first, cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the smallest case of each part")
    parser.add_argument("--load", metavar="MODEL", help="only part 3, for this bundled model (gemma3-270m: its "
                        "GGUF's 262,144-token vocabulary)")
    args = parser.parse_args()
    if args.load:
        first, cached = load_times(args.load)
        print(f"load {args.load}: first (GGUF -> safetensors) {first:.1f} s vs cached {cached:.2f} s")
        return
    name, n_tokens, repeats, map_tokens, layer = (("toy-llama-gqa", 64, 2, 64, 1) if args.quick
                                                   else ("smollm2-135m", 256, 7, 1024, 20))
    torch.manual_seed(0)
    first, cached = load_times(None if args.quick else name)
    loaded = load_model(name)
    t = overhead(loaded, n_tokens, repeats)
    ours_b, default_b = bytes_per_cell(loaded, map_tokens, layer)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device cpu; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for clock in ("cpu", "wall"):
        ours, plain = t[f"ours {clock}"], t[f"plain {clock}"]
        print(f"capture overhead, {name}, {n_tokens} tokens, {clock} time (fastest of {repeats}): capture "
              f"{ours * 1e3:.0f} ms vs eager forward with output_attentions {plain * 1e3:.0f} ms -> ratio "
              f"{ours / plain:.2f} (goal <= 1.10)")
    print(f"bytes to the browser per cell, {map_tokens} x {map_tokens} map: palette PNG figure {ours_b:.2f} B vs "
          f"plotly default heatmap {default_b:.1f} B -> {default_b / ours_b:.0f}x smaller (goal <= 1 B)")
    loaded_name = "toy-llama-gqa as a GGUF file" if args.quick else name
    print(f"load {loaded_name}: first (GGUF -> safetensors) {first:.1f} s vs cached {cached:.2f} s -> "
          f"{first / cached:.0f}x faster (goal >= 20x)")


if __name__ == "__main__":
    main()
