"""Where one layer's streamed statistics spend their time: SmolLM2-135M's layer 15 at 8,192 tokens, every head,
with its output (what the command line's `stats` computes for each layer during the forward pass).

It prints, measured in one run: the float32 matmul rate at 2,048³ on all threads (the yardstick of
benchmarks/longcontext.py), the rate of the pass's own products at its tile shapes (q·k: [group x 128 rows, 64] x
[64, KEY_BLOCK keys] per KV head; p·v: [group x 128, KEY_BLOCK] x [KEY_BLOCK, 64]) run two ways: each product split
over all threads, and as the pass runs them, a tile per core on every core at once (attnviz.cores); then the
layer's time (best of 3), the time its q·k and p·v FLOPs take at the second rate, and the rest: the softmax's and
the statistics' elementwise work, which no FLOP count includes.

    python benchmarks/attention_layer.py
    python benchmarks/attention_layer.py --quick    toy-llama-gqa's layer 1 at 256 tokens, a 256³ matmul rate
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks.longcontext import long_text, matmul_rate

MODEL, N_TOKENS, LAYER, ROWS = "smollm2-135m", 8192, 15, 128


def best_of(fn, repeats: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def tile_rate(n_kv: int, rows: int, keys: int, d: int, per_core: bool) -> float:
    """FLOP/s of q·k and p·v products at the pass's tile shapes (float32): 20 pairs split over all threads, or
    (per_core) 20 pairs on each core at once, a core each."""
    from attnviz import cores

    n_cores = cores.workers() if per_core else 1
    tensors = [(torch.randn(n_kv, rows, d), torch.randn(n_kv, keys, d), torch.rand(n_kv, rows, keys),
                torch.zeros(n_kv, rows, d), torch.empty(n_kv, rows, keys)) for _ in range(n_cores)]

    def pairs(i):
        q, k, p, out, scores = tensors[i]
        for _ in range(20):
            torch.matmul(q, k.transpose(-1, -2), out=scores)
            out.baddbmm_(p, k)

    return n_cores * 20 * 2 * (2 * n_kv * rows * keys * d) / best_of(lambda: cores.run_each(pairs, range(n_cores)))


def main() -> None:
    from attnviz.capture import capture_attention
    from attnviz.models import load_model
    from attnviz.streamed import KEY_BLOCK, InductionMatch, streamed_stats

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the smallest case: a toy model, 256 tokens")
    args = parser.parse_args()
    name, n_tokens, layer_index, size = ("toy-llama-gqa", 256, 1, 256) if args.quick else (MODEL, N_TOKENS, LAYER,
                                                                                            2048)
    loaded = load_model(name)
    text = long_text(n_tokens, loaded.tokenizer)
    cap = capture_attention(loaded, text, store="qk", layers=[layer_index])
    x, ids = cap.inputs[layer_index], cap.token_ids
    n, heads, n_kv, d = x.n_query, x.n_heads, x.k.shape[0], x.head_dim
    values = torch.randn(n_kv, n, d)
    peak = matmul_rate(size)
    split = tile_rate(n_kv, heads // n_kv * ROWS, KEY_BLOCK, d, per_core=False)
    at_tiles = tile_rate(n_kv, heads // n_kv * ROWS, KEY_BLOCK, d, per_core=True)
    match = InductionMatch(ids)  # as in a capture: found on the first layer, kept for the others
    layer = best_of(lambda: streamed_stats(x, match, values=values))
    flops = 2 * 2 * d * heads * n * (n + 1) / 2  # q·k and p·v over the causal pairs
    products = flops / at_tiles
    print(f"{name} layer {layer_index}, {n:,} tokens, {heads} heads / {n_kv} KV heads, head dim {d}, "
          f"{torch.get_num_threads()} threads")
    print(f"float32 matmul rate at {size:,}³: {peak / 1e9:.0f} GFLOP/s; at the pass's tile shapes, each product "
          f"split over {torch.get_num_threads()} threads: {split / 1e9:.0f} GFLOP/s ({split / peak:.0%}); a tile per "
          f"core on every core at once, as the pass runs them: {at_tiles / 1e9:.0f} GFLOP/s ({at_tiles / peak:.0%})")
    print(f"layer (statistics and output): {layer:.3f} s; its q·k and p·v ({flops / 1e9:.1f} GFLOP) at the tile "
          f"rate: {products:.3f} s ({products / layer:.0%}); the rest (elementwise): {layer - products:.3f} s")
    print(f"the layer against the {size:,}³ limit: {layer / (flops / peak):.2f}x; its products alone at the tile "
          f"rate: {products / (flops / peak):.2f}x")


if __name__ == "__main__":
    main()
