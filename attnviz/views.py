"""What the Heads page draws of a long capture, computed from what attention saw without the N x N matrix.

A capture in the "qk" store (attnviz.capture) keeps each layer's q and k, O(N d). The views here make each map a
block of query rows at a time with attnviz.attention.layer_pattern and keep only what is drawn:
- pooled_heads: every head of a layer max-pooled to a small square (the all-heads grid, a one-head overview), with
  the same block edges as attnviz.figures.heads.max_pool, so a pooled view equals max_pool of the dense pattern;
- head_window: one head's weights in a window of queries and keys, at full resolution (zoom).
Both can hide the first-token sink the way the Heads page does (sink_hidden: column 0 zeroed, rows rescaled to 1, rows
with under MIN_REMAINING of their weight off token 0 blank). The page's other arithmetic on maps lives here too:
mass_off_sink (what hiding the sink rescales), blank_rows, and map_difference (largest difference and total
variation between two maps, Compare). PooledMaxima pools every head in attnviz.streamed's pass over the scores.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from attnviz import attention as core
from attnviz.pooling import MIN_REMAINING, block_reduce, pool_edges

OVERVIEW = 512  # pixels per side of a long head's overview (the Heads page and the notebook views)
# From this many tokens the Heads page's statistics pass also pools every head's overview (stats.streaming_attend),
# float16 (72 heads of Gemma 3 270M: 75 MB, held with the capture): from this length a layer change that pooled a
# head's N² scores afresh would take about a second or more on a 2-core CPU (benchmarks/longcontext.py times the
# reruns).
OVERVIEW_IN_PASS_FROM = 16_384


def overview_in_pass(n_tokens: int) -> int | None:
    """The overview size the Heads page's statistics pass pools for a text of n_tokens (OVERVIEW from
    OVERVIEW_IN_PASS_FROM tokens), or None: what streaming_attend pools and what the memory budget admits for it."""
    return OVERVIEW if n_tokens >= OVERVIEW_IN_PASS_FROM else None

# Above this many tokens one head is drawn as the max-pooled overview and a zoom window in both stores: a full-size
# PNG of a dense map is as many pixels as weights (1,800 tokens: a 1 MB chart redrawn on every layer or head change),
# shown in about 700 screen pixels, where the browser's own downsampling can drop a one-token stripe that max-pooling
# keeps; the zoom window reads the weights token by token.
FULL_MAP_MAX_TOKENS = 1024


def choose_store(n_layers: int, n_heads: int, n_tokens: int, *, limit_bytes: int, itemsize: int = 4,
                 can_stream: bool = True, max_dense_tokens: int | None = None) -> tuple[str, str]:
    """("pattern" or "qk", why): the dense store while [layer, head, n, n] fits limit_bytes (and the text is at most
    max_dense_tokens long), else the qk store."""
    need = n_layers * n_heads * n_tokens * n_tokens * itemsize
    if can_stream and max_dense_tokens is not None and n_tokens > max_dense_tokens:
        return "qk", (f"the text is longer than the {max_dense_tokens:,} tokens the dense pattern store takes, so "
                      "only each layer's q and k are kept and every map is computed from them, a block of rows at "
                      "a time: the N x N matrix is never built")
    if need <= limit_bytes or not can_stream:
        return "pattern", (f"the dense pattern ({need / 2**20:,.0f} MiB) fits the "
                           f"{limit_bytes / 2**30:.0f} GiB budget")
    return "qk", (f"the dense pattern would need {need / 2**30:,.1f} GiB (budget {limit_bytes / 2**30:.0f} GiB), so "
                  "only each layer's q and k are kept and every map is computed from them, a block of rows at a "
                  "time: the N x N matrix is never built")


def mass_off_sink(source, head: int | None = None, *, block: int = 512) -> np.ndarray:
    """The weight each query row puts on keys other than token 0: the mass that hiding the sink rescales to 1.

    source: a pattern [..., query, key] -> [..., query] float64; or a layer's LayerInputs with the `head` to read
    -> [query] float64, computed a block of rows at a time (the long-text store)."""
    if isinstance(source, core.LayerInputs):
        out = np.zeros(source.n_query)
        for a in range(0, source.n_query, block):
            b = min(source.n_query, a + block)
            w, _ = core.layer_pattern(source, a, b, heads=[head])
            out[a:b] = w[0, :, 1:].double().sum(-1).numpy()
        return out
    return np.asarray(source)[..., 1:].sum(-1, dtype=np.float64)


def blank_rows(p: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """A float copy of p [..., query, key] with every row where keep [..., query] is False set to NaN (drawn grey)."""
    out = np.array(p, dtype=np.float64 if np.asarray(p).dtype == np.float64 else np.float32)
    out[~np.asarray(keep, dtype=bool)] = np.nan
    return out


def sink_hidden(p: np.ndarray, keys=(0,)) -> np.ndarray:
    """p [..., query, key] (a copy comes back: captures are shared and read-only) with its sink keys hidden: the
    one rule the Heads and Sinks pages (and the notebook views) draw with. The columns of `keys` (token 0 by
    default; negative indices count from the end, keys outside the map are ignored) are zeroed, each row is
    rescaled by the weight it keeps on the other keys, and a row that keeps under MIN_REMAINING is set to NaN
    (drawn blank): a few millionths rescaled to full brightness would draw a pattern that is not there, and a row
    that keeps nothing (query 0 of a causal model) has no pattern to draw. float64 in -> float64 out, else
    float32."""
    p = np.asarray(p)
    n_key = p.shape[-1]
    cols = sorted({int(k) % n_key for k in keys if -n_key <= int(k) < n_key})
    if cols == [0]:
        kept = mass_off_sink(p)  # [..., query]
    else:
        kept = p.sum(-1, dtype=np.float64) - p[..., cols].sum(-1, dtype=np.float64)
    ok = kept >= MIN_REMAINING
    out = blank_rows(p, ok)
    out[..., cols] = np.where(ok, 0.0, np.nan)[..., None]
    out /= np.where(ok, kept, 1.0)[..., None].astype(out.dtype)
    return out


def map_difference(a: np.ndarray, b: np.ndarray) -> dict | None:
    """Two maps [query, key] of the same shape compared over the rows blank (NaN) in neither: the largest |a - b|,
    the mean over those rows of the total variation distance 1/2 sum_k |a[q, k] - b[q, k]| (0 = same distribution,
    1 = disjoint supports), and how many rows were compared. None when every row is blank in a or b."""
    both = ~(np.isnan(a).any(-1) | np.isnan(b).any(-1))
    if not both.any():
        return None
    d = np.abs(np.asarray(a, dtype=np.float64)[both] - np.asarray(b, dtype=np.float64)[both])
    return {"max": float(d.max()), "total_variation": float(0.5 * d.sum(-1).mean()), "rows": int(both.sum()),
            "all_rows": bool(both.all())}


def pooled_heads(inputs: core.LayerInputs, size: int, *, hide_sink: bool = False, heads=None,
                 rows_per_pass: int = 256) -> np.ndarray:
    """[head, m, m] float32, m = min(n, size): each head's weights max-pooled over the blocks of pool_edges, one
    group of whole block rows (about rows_per_pass queries) at a time (NaN rows skipped; a block is NaN only when
    all its rows are)."""
    n = inputs.n_query
    heads = list(range(inputs.n_heads)) if heads is None else list(heads)
    rows_e, keys_e = pool_edges(n, size), pool_edges(inputs.n_key, size)
    out = np.full((len(heads), len(rows_e) - 1, len(keys_e) - 1), np.nan, dtype=np.float32)
    i = 0
    while i < len(rows_e) - 1:
        j = i + 1  # block rows i .. j - 1 go in one pass
        while j < len(rows_e) - 1 and rows_e[j + 1] - rows_e[i] <= rows_per_pass:
            j += 1
        a, b = int(rows_e[i]), int(rows_e[j])
        key_end = inputs.mask.key_end(a, b)
        if key_end:
            w, _ = core.layer_pattern(inputs, a, b, heads=heads, key_end=key_end)
            w = w.numpy()
            if hide_sink:
                w = sink_hidden(w)
            starts = keys_e[:-1][keys_e[:-1] < key_end]
            cols = block_reduce(np.fmax, w, starts, axis=-1)  # [head, rows, key blocks seen]
            out[:, i:j, :len(starts)] = block_reduce(np.fmax, cols, rows_e[i:j] - a, axis=-2)
            # blocks right of every key these rows may see hold only masked (zero) weight, or NaN when every row
            # of the block is blank (hidden sink), as max_pool of the dense rows gives
            blank = np.isnan(w).all(-1)  # [head, rows]
            all_blank = np.logical_and.reduceat(blank, rows_e[i:j] - a, axis=1)  # [head, block rows]
            out[:, i:j, len(starts):] = np.where(all_blank, np.nan, 0.0)[..., None]
        i = j
    return out


def head_window(inputs: core.LayerInputs, head: int, rows: tuple[int, int], keys: tuple[int, int], *,
                hide_sink: bool = False) -> np.ndarray:
    """One head's weights [rows, keys] for queries rows[0] .. rows[1] - 1 and keys keys[0] .. keys[1] - 1, exact.
    The sink is hidden over each whole row before the window is cut, as on the full map."""
    (a, b), (k0, k1) = rows, keys
    w, _ = core.layer_pattern(inputs, a, b, heads=[head], key_end=inputs.n_key)
    w = w.numpy()
    if hide_sink:
        w = sink_hidden(w)
    return w[0, :, k0:k1]


class PooledMaxima:
    """Every head max-pooled to one or more sizes ({result name: pixels}) in streamed_stats's pass.

    The key edges of every size, and key 0 alone, make one set of fine key blocks: each tile's raw scores are
    max-reduced over those once, and each size's blocks (and its first block without key 0, for the hidden sink)
    are maxima of fine blocks. Exp is monotone, so the largest weight of a block is exp(max s - m) / l, made once
    per row block from the row's final m and l."""

    def __init__(self, sizes: dict[str, int], n: int, n_keys: int, n_heads: int):
        edges = {name: (pool_edges(n, size), pool_edges(n_keys, size)) for name, size in sizes.items()}
        self.fine = np.unique(np.concatenate([k for _, k in edges.values()] + [[0, min(1, n_keys)]]))
        self.sizes = {}
        for name, (rows, keys) in edges.items():
            plain = np.full((n_heads, len(rows) - 1, len(keys) - 1), np.nan, dtype=np.float32)
            self.sizes[name] = (rows, np.searchsorted(self.fine, keys), plain, plain.copy())
        self.lock = threading.Lock()  # blocks of rows run at once, and a pooled row bin may span two of them

    def start(self, n_heads: int, rows: int) -> torch.Tensor:
        """A new block of query rows: its fine maxima, no score seen yet."""
        return torch.full((n_heads, rows, len(self.fine) - 1), float("-inf"))

    def tile(self, fine_max: torch.Tensor, s: torch.Tensor, k0: int, k1: int) -> None:
        """Keeps in fine_max the largest raw score of each fine block of the tile s [head, rows, k1 - k0] (before
        it is shifted)."""
        first = int(np.searchsorted(self.fine, k0, side="right")) - 1
        last = int(np.searchsorted(self.fine, k1 - 1, side="right")) - 1
        starts = np.maximum(self.fine[first:last + 1], k0) - k0
        tile_max = torch.from_numpy(np.maximum.reduceat(s.numpy(), starts, axis=-1))
        torch.maximum(fine_max[..., first:last + 1], tile_max, out=fine_max[..., first:last + 1])

    def finish(self, fine_max: torch.Tensor, a: int, b: int, m: torch.Tensor, total: torch.Tensor,
               kept: np.ndarray) -> None:
        """Rows a .. b - 1, whose final max m and normaliser total [head, rows] are known, pooled into each size;
        kept [head, rows]: each row's weight off token 0."""
        fine = (torch.exp(fine_max - m[..., None]) / total[..., None]).numpy()
        with self.lock:
            self._pool(fine, a, b, kept)

    def _pool(self, fine: np.ndarray, a: int, b: int, kept: np.ndarray) -> None:
        for rows_e, at, plain, off in self.sizes.values():
            w = np.maximum.reduceat(fine, at[:-1], axis=-1)  # [head, rows, blocks]: each block's largest weight
            # hiding the sink: key 0 out of the first block, each row divided by the weight it keeps off key 0
            hidden = w.copy()
            hidden[..., 0] = fine[..., 1:at[1]].max(-1) if at[1] > 1 else 0.0
            with np.errstate(invalid="ignore", divide="ignore"):
                hidden /= kept[..., None]
            hidden[kept < MIN_REMAINING] = np.nan
            first_bin = int(np.searchsorted(rows_e, a, side="right")) - 1
            for i in range(first_bin, len(rows_e) - 1):
                lo, hi = max(a, int(rows_e[i])), min(b, int(rows_e[i + 1]))
                if lo >= hi:
                    break
                plain[:, i] = np.fmax(plain[:, i], w[:, lo - a:hi - a].max(1))
                with np.errstate(invalid="ignore"):
                    off[:, i] = np.fmax(off[:, i], np.fmax.reduce(hidden[:, lo - a:hi - a], axis=1))

    def result(self) -> dict[str, np.ndarray]:
        """{name: pooled, name + "_nosink": with the sink hidden}; the overview's as float16."""
        out = {}
        for name, (_, _, plain, off) in self.sizes.items():
            dtype = np.float16 if name == "_overview" else np.float32
            out[name], out[name + "_nosink"] = plain.astype(dtype, copy=False), off.astype(dtype, copy=False)
        return out
