"""The rows and equations the MHA, GQA, MQA page shows, made from attnviz.cost's formulas (numbers formatted for
reading; the exact totals are kept beside them)."""

from __future__ import annotations

from collections.abc import Mapping

from attnviz.cost import (
    Architecture, attention_flops, crossover_seq_len, format_bytes, kv_cache_bytes, param_counts,
)


def crossover_latex(*, d_model: int, causal: bool = False, kv_dim: int | None = None) -> str:
    """LaTeX of crossover_seq_len's equation solved: projections = attention matmuls <=> N* = ... = value."""
    projections = r"8Nd^2" if kv_dim is None else rf"4Nd\,(d+{kv_dim})"
    attention = r"2N^2d" if causal else r"4N^2d"
    solved = (r"4d" if causal else r"2d") if kv_dim is None else (rf"2(d+{kv_dim})" if causal else rf"d+{kv_dim}")
    n_star = crossover_seq_len(d_model=d_model, causal=causal, kv_dim=kv_dim)
    return rf"{projections} = {attention} \iff N^* = {solved} = {n_star:,.0f}"


KV_FORMULA = "2 × layers × KV heads × head dim × context × batch × bytes"


def kv_cache_table(archs: Mapping[str, Architecture], *, context: int, batch: int = 1,
                   bytes_per_value: float = 2) -> list[dict]:
    """One row per architecture: the KV-cache formula with its numbers (column KV_FORMULA), the bytes per token and
    in total (binary units) and the exact total ("bytes")."""
    rows = []
    for name, a in archs.items():
        total = kv_cache_bytes(layers=a.layers, kv_heads=a.kv_heads, head_dim=a.head_dim, seq_len=context,
                               batch=batch, bytes_per_value=bytes_per_value)
        per_token = kv_cache_bytes(layers=a.layers, kv_heads=a.kv_heads, head_dim=a.head_dim, seq_len=1,
                                   bytes_per_value=bytes_per_value)
        rows.append({"model": name,
                     KV_FORMULA: f"2 × {a.layers} × {a.kv_heads} × {a.head_dim} × {context:,} × {batch} × "
                                 f"{bytes_per_value:g} B",
                     "per token": format_bytes(per_token), "total": format_bytes(total), "bytes": f"{total:,}"})
    return rows


def cost_table(arch: Architecture, seq_lens, *, d_model: int) -> list[dict]:
    """Per context length: the attention matmuls' FLOPs of one layer of width d_model, and arch's KV cache per
    token and in total (batch 1, 2-byte values)."""
    per_token = kv_cache_bytes(layers=arch.layers, kv_heads=arch.kv_heads, head_dim=arch.head_dim, seq_len=1)
    return [{"N": n,
             "Q Kᵀ + pattern V FLOPs per layer": f"{attention_flops(seq_len=n, d_model=d_model)['attention']:.3e}",
             "KV per token": format_bytes(per_token),
             "KV total (batch 1)": format_bytes(kv_cache_bytes(layers=arch.layers, kv_heads=arch.kv_heads,
                                                               head_dim=arch.head_dim, seq_len=n))}
            for n in seq_lens]


def param_table(archs: Mapping[str, Architecture]) -> list[dict]:
    """One row per architecture: its config values and param_counts' parts."""
    rows = []
    for name, a in archs.items():
        counts = param_counts(a)
        rows.append({
            "model": name, "variant": a.variant, "layers": a.layers, "d_model": a.d_model, "heads": a.heads,
            "KV heads": a.kv_heads, "head dim": a.head_dim, "MLP": f"{'gated ' if a.gated_mlp else ''}{a.d_ff}",
            "vocab": a.vocab, "tied": a.tied_embeddings, "attention": counts["attention"],
            "MLP params": counts["mlp"], "embeddings": counts["embeddings"], "total": counts["total"]})
    return rows
