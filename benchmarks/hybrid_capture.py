"""A hybrid model's capture against its plain forward pass at 512 tokens.

Goal (issue 38): attnviz.capture of a hybrid (Gated DeltaNet layers with gated softmax attention, as Qwen3-Next and
Qwen3.5 mix them, three in four linear) within 1.5x of transformers' own forward pass of the same model on the same ids.
The capture records every layer (the softmax layers' patterns, the linear layers' kernel calls and output gates); a
linear layer's exact implicit map is built from its record when first read, and "+ every map" is the capture with every
such map built, the whole cost of seeing every layer. No hybrid checkpoint is on the package index: the model is a
random Qwen3.5 text model of a small real shape (hidden 1,024, 8 layers, 8 heads of 128; 16 value heads and 8 key heads
of 128 in the linear layers), run through transformers' reference PyTorch kernels as on any CPU.

It prints, from one run: the float32 matmul rate (benchmarks/longcontext.py's yardstick), the fastest of the plain
forward and of the capture (alternating runs, by the wall clock and by this process's CPU time), and their ratio
against the goal; the long-text store's capture (linear layers kept as their kernel calls, maps built on demand)
beside it.

    python benchmarks/hybrid_capture.py
    python benchmarks/hybrid_capture.py --quick     a tiny model at 64 tokens (seconds, not figures)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.longcontext import matmul_rate

GOAL = 1.5


def hybrid(quick: bool):
    """A random Qwen3.5 text model (three Gated DeltaNet layers to one gated softmax layer) and a byte tokenizer."""
    from transformers import AutoModelForCausalLM, Qwen3_5TextConfig

    from attnviz.tokenizer import byte_tokenizer

    size = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                linear_value_head_dim=16) if quick else dict(
        hidden_size=1024, intermediate_size=3072, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
        linear_num_value_heads=16, linear_num_key_heads=8, linear_key_head_dim=128, linear_value_head_dim=128)
    layers = 4 if quick else 8
    config = Qwen3_5TextConfig(**size, num_hidden_layers=layers, linear_conv_kernel_dim=4, vocab_size=257,
                               bos_token_id=256, eos_token_id=256, pad_token_id=256,
                               layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (layers // 4))
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval(), byte_tokenizer()


def timed(fn) -> tuple[float, float]:
    started, used = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - started, time.process_time() - used


def main() -> None:
    import attnviz

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    n, repeats = (64, 1) if quick else (512, 3)
    model, tokenizer = hybrid(quick)
    letters = torch.randint(97, 123, (n - 1,), generator=torch.Generator().manual_seed(1))
    text = "".join(map(chr, letters.tolist()))  # one byte token each, after <bos>
    ids = torch.tensor([tokenizer(text).input_ids])
    n = ids.shape[1]

    def plain():
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False)

    def every_map():
        cap = attnviz.capture(model, text, tokenizer=tokenizer, store="pattern")
        for layer in cap.linear_layers:
            cap.layer_rows(layer, 0, 1)  # builds the layer's whole map

    runs = {"forward": plain, "capture": lambda: attnviz.capture(model, text, tokenizer=tokenizer, store="pattern"),
            "+ every map": every_map, "capture qk": lambda: attnviz.capture(model, text, tokenizer=tokenizer,
                                                                            store="qk")}
    for fn in runs.values():
        fn()  # warm-up
    best = {name: (float("inf"), float("inf")) for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            wall, cpu = timed(fn)
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    print(f"float32 matmul rate {matmul_rate(256 if quick else 2048) / 1e9:.1f} GFLOP/s, "
          f"{torch.get_num_threads()} threads; {n} tokens, {model.config.num_hidden_layers} layers "
          f"({', '.join(attnviz.capture(model, text[:8], tokenizer=tokenizer).layer_kinds)})")
    print("run          wall s   cpu s  x forward (wall, cpu)  goal 1.5x")
    for name, (wall, cpu) in best.items():
        ratio = (wall / best["forward"][0], cpu / best["forward"][1])
        verdict = "" if name == "forward" else ("met" if max(ratio) <= GOAL else "NOT met")
        print(f"{name:<11} {wall:>7.3f} {cpu:>7.3f}  {ratio[0]:>8.2f} {ratio[1]:>8.2f}       {verdict}")


if __name__ == "__main__":
    main()
