"""streamed_stats: every statistic of attnviz.stats for one layer, computed from q and k a tile at a time (the
long-text store's statistics), never building the [n, n] pattern; attnviz.stats defines each statistic densely and
tests the two equal.

Every statistic of one layer is computed from what attention saw (attnviz.attention.LayerInputs) the way the
kernel page's FlashAttention kernel computes attention: tiles of `block` query rows (default 128, up to 512 under
a sliding window or chunk, whose rows read few keys) x `key_block` keys, with a running row max m_i and running
sum l_i, so no [n, n] array exists and each tile stays in the CPU's cache. Key tiles wholly right of a causal
block, or left of a sliding window's or a chunk's reach, are never computed.

The online softmax (Milakov and Gimelshein 2018; Dao 2023, the kernel page): after a tile with row max m_t,
m_new = max(m_i, m_t), alpha = exp(m_i - m_new), l_i <- alpha l_i + sum_tile exp(s - m_new). Every other sum
over keys is carried the same way and divided by the final l at the end, so no weight is normalised tile by
tile. The sums hold for any shift m, so m moves (and the sums are rescaled) only when a tile's weights would
pass 2^RESCALE_BITS (FlashAttention-4's conditional rescaling); most tiles just add to the sums:
- entropy: with A = sum_k exp(s_k - m)(s_k - m), H = -sum_k p_k ln p_k = ln(l) sum_k p_k - A / l, and A is
  rescaled as A <- alpha (A + (m_i - m_new) l_i) + sum_tile exp(s - m_new)(s - m_new): no logarithm per weight;
- mean distance: sum_k p_k |q - k|, as (q - a) sum_k p_k - (sum_k exp(s_k - m)(k - a)) / l for a row whose
  keys all lie at or before it (causal, sliding window, chunk; a the block's first row, so the numbers stay
  small), with no [rows, keys] array of distances;
- the weight of single keys (token 0, the diagonal, the previous token): their raw scores s are kept, and
  p = exp(s - m) / l at the end; a learned sink logit joins m and l at the end;
- induction (token_ids given, or the InductionMatch of them that every layer of a text shares; NaN without):
  query q's weight on the keys k < q whose previous token equals its own, ids[k - 1] == ids[q]
  (induction_targets' definition), carried like l: the matching (query, key) pairs of each tile are found
  from the token ids (O(tile / heads)), kept for the next layer up to a bound, and only their weights are
  added; no list of pairs over the whole text is made (a repetitive text makes it O(n²) long).
Each tile's weights are exponentiated once, as 2^((s - m) log2 e) (torch's exp2 takes a fifth of exp's time; a
weight's relative rounding grows by about 6e-8 per unit of m - s, so the large weights, which carry the
statistics, round as exp's do), into a buffer the thread's tiles reuse, and every sum reads them: l, the
distance as a product with the key positions, the output as e v, and the entropy's A by multiplying the
shifted scores in place. The scores too are written into one reused buffer. Blocks of rows run on every core
at once, each on one core (attnviz.cores; benchmarks/attention_layer.py measures the gain).
Sums over a tile run in float32, totals over rows in float64.
"""

from __future__ import annotations

import math
import threading
from collections import Counter

import numpy as np
import torch

from attnviz import attention as core
from attnviz.cores import run_each
from attnviz.views import PooledMaxima

LOG2E, LN2 = 1 / math.log(2), math.log(2)
RESCALE_BITS = 8  # a weight exp(s - m) may reach 2^8 before the running shift m moves (_Running.shift_for)
KEY_BLOCK = 512  # keys per tile of streamed_stats: [head, rows, KEY_BLOCK] float32 scores stay in the CPU's cache


def streamed_stats(inputs, token_ids=None, *, block: int | None = None, key_block: int = KEY_BLOCK,
                   pool: int | None = None, values: torch.Tensor | None = None,
                   overview: int | None = None) -> dict[str, np.ndarray]:
    """pattern_stats of one layer from what attention saw (attnviz.attention.LayerInputs), streamed as the module
    docstring says: tiles of `block` query rows x `key_block` keys, no [n, n] array.
    pool: also return "_pooled", every head max-pooled to `pool` pixels (attnviz.views.pooled_heads's result), from
    each pooling block's largest raw score (exp is monotone: the largest weight is exp(max s - m) / l), and
    "_pooled_nosink", the same with the first-token sink hidden (pooled_heads(hide_sink=True): column 0 out, rows
    rescaled by the weight they keep, rows keeping under MIN_REMAINING blank).
    overview: likewise "_overview" and "_overview_nosink" at `overview` pixels (the Heads page's One head
    overview), stored as float16, and "_kept" [head, n] float32, each row's weight off token 0
    (views.mass_off_sink). Both sizes come from one max over each tile's blocks (views.PooledMaxima).
    values: the layer's value vectors [kv_head, n_key, d_v]; also return "_output" [head, n, d_v] float32, the
    attention output sum_k p_k v_k, accumulated as acc <- alpha acc + exp(s - m_new) v: the layer's forward pass.
    On CUDA with kernels.triton_stats.USE_KERNEL on, the Triton kernel computes the same, and inputs on the GPU
    stay there; otherwise they are copied to the CPU as float32 first.
    """
    if torch.cuda.is_available():  # the Triton kernel when switched on (kernels.triton_stats)
        from attnviz.kernels.triton_stats import stats_on_device

        ids = token_ids.token_ids if isinstance(token_ids, InductionMatch) else token_ids
        on_gpu = stats_on_device(inputs, ids, pool=pool, values=values, overview=overview)
        if on_gpu is not None:
            return on_gpu
    inputs, values = inputs.on_cpu(), None if values is None else values.float().cpu()
    n = inputs.n_query
    block = _row_block(inputs, block, key_block)
    sizes = {name: size for name, size in (("_pooled", pool), ("_overview", overview)) if size}
    layer = _LayerPass(inputs, token_ids, key_block=key_block, block=block, values=values, pools=sizes)
    # blocks of rows run on every core at once, one core each (attnviz.cores); under a causal rule the last blocks,
    # which read the most keys, go first
    starts = sorted(range(0, n, block), reverse=bool(inputs.mask.causal))
    run_each(lambda a: layer.rows(a, min(n, a + block)), starts)
    return layer.result()


def _row_block(inputs, block: int | None, key_block: int) -> int:
    """The query rows per block: `block` when given; else 128, or under a sliding window or chunk (whose rows read
    one tile of about block + window keys) the reach, between 128 and 512 and at most half a key tile."""
    if block is not None:
        return block
    reach = inputs.mask.window or inputs.mask.chunk
    return min(max(128, reach), 512, key_block // 2) if reach else 128


class InductionMatch:
    """Which (query, key) pairs of a tile are induction targets: key k < q whose previous token is query q's own
    (ids[k - 1] == ids[q]), from the token ids alone; with_targets[q]: query q has at least one.

    One per text, shared by every layer's pass (streaming_attend, head_stats): a tile's pairs are found once and
    kept for the same tile of the next layer, up to MAX_KEPT_PAIRS pairs in all (a repetitive text has O(n²) of
    them); tiles past that are matched again each time. The kept pairs are copied into one block, `store`, sized
    to the text's number of pairs (counted from the ids) or the bound: kept as a small tensor per tile, made by
    whichever thread ran the tile, they were scattered through the C allocator's heaps, which then could not reuse
    the memory between them (a long text's heap grew by many times the pairs' own size)."""

    MAX_KEPT_PAIRS = 1_000_000  # 8 MB of int32 offsets

    def __init__(self, token_ids):
        self.token_ids = np.asarray(token_ids, dtype=np.int64)
        ids = torch.as_tensor(self.token_ids)
        self.ids = ids.to(torch.int32)
        self.before = torch.cat([torch.tensor([-1]), ids[:-1]]).to(torch.int32)  # none before key 0
        tokens, seen, pairs = ids.tolist(), Counter(), 0
        self.with_targets = np.zeros(len(tokens), dtype=bool)
        for q, tok in enumerate(tokens):  # query q's targets: the earlier j + 1 < q with ids[j] == ids[q]
            if q >= 2:
                seen[tokens[q - 2]] += 1
            pairs += seen[tok]
            self.with_targets[q] = seen[tok] > 0
        self.store = torch.empty(2, min(pairs, self.MAX_KEPT_PAIRS), dtype=torch.int32)  # rows; row x width + key
        self.kept: dict[tuple[int, int, int, int], tuple[int, int] | None] = {}  # a tile's slice of store
        self.n_kept, self.lock = 0, threading.Lock()

    def add_matched(self, into: torch.Tensor, e: torch.Tensor, a: int, b: int, k0: int, k1: int) -> None:
        """Adds to into [head, rows] each row's sum of e [head, rows a .. b - 1, keys k0 .. k1 - 1] over its
        matching keys (nothing where no pair of the tile matches)."""
        pairs = self._pairs(a, b, k0, k1)
        if pairs is not None:
            rows, flat = pairs
            into.index_add_(1, rows, e.view(e.shape[0], -1).index_select(1, flat))

    def _pairs(self, a: int, b: int, k0: int, k1: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The tile's matching pairs as (row offset, row offset x tile width + key offset), or None: from store
        where kept, else found and copied there while it has room."""
        tile = (a, b, k0, k1)
        if tile in self.kept:
            at = self.kept[tile]
            return None if at is None else (self.store[0, at[0]:at[1]], self.store[1, at[0]:at[1]])
        match = self.before[None, k0:k1] == self.ids[a:b, None]  # [rows, keys]
        if k1 > a:  # keys at or after a row's own position are never its targets
            match &= torch.arange(k0, k1)[None, :] < torch.arange(a, b)[:, None]
        rows, cols = match.nonzero(as_tuple=True)
        found = (rows, rows * (k1 - k0) + cols) if len(rows) else None
        with self.lock:  # blocks of rows run on several threads
            start, stop = self.n_kept, self.n_kept + len(rows)
            if stop <= self.store.shape[1]:
                if found is not None:
                    self.store[0, start:stop], self.store[1, start:stop] = found
                self.kept[tile], self.n_kept = (None if found is None else (start, stop)), stop
        return found


class _Running:
    """The online softmax's running values over one block's rows, [head, rows] each (streamed_stats): every weight
    is taken as exp(s - m) against a shift m per row, which moves to the row's largest score only when a tile's
    weights would pass 2^RESCALE_BITS (FlashAttention-4's conditional rescaling: the sums hold for any shift, and
    most tiles then skip the rescaling)."""

    def __init__(self, n_heads: int, rows: int, d_v: int | None):
        neg_inf = float("-inf")
        self.m = torch.full((n_heads, rows), neg_inf)  # the shift (-inf while nothing was seen)
        self.neg_shift = torch.zeros(n_heads, rows, 1)  # -m log2(e), 0 while nothing was seen: added to s log2(e)
        self.l = torch.zeros(n_heads, rows)
        self.rest = None  # sum exp(s - m) over the keys but token 0, when the weight off it is asked for (pooling)
        self.big_a = torch.zeros(n_heads, rows)  # A: sum exp(s - m)(s - m), in units of ln 2 (s - m in log2 units)
        self.dist = torch.zeros(n_heads, rows)  # sum exp(s - m) (k - a) (keys behind) or sum exp(s - m) |q - k|
        self.induction = torch.zeros(n_heads, rows)  # sum exp(s - m) over the keys after an earlier copy
        self.acc = torch.zeros(n_heads, rows, d_v) if d_v else None
        self.raw0, self.raw_self, self.raw_prev = (torch.full((n_heads, rows), neg_inf) for _ in range(3))
        self.fine_max = None  # the block's largest raw score per fine pooling block (views.PooledMaxima), when pooling
        self.exp_buffer = None  # where the tiles' weights are written (the thread's own)
        self.offsets = None  # the key positions counted from the block's first row (keys behind it)

    def shift_for(self, tile_max: torch.Tensor) -> bool:
        """Moves m to the rows' largest score so far when some row's tile_max passes it by RESCALE_BITS bits (or
        sees its first key), rescaling every running sum by alpha = exp(m_old - m_new). True when it moved."""
        if not bool((tile_max > self.m + RESCALE_BITS * LN2).any()):
            return False
        m_new = torch.maximum(self.m, tile_max)
        m_safe = torch.where(torch.isfinite(m_new), m_new, 0.0)
        alpha = torch.exp(self.m - m_safe)  # 0 while nothing was seen (m = -inf)
        # A <- alpha (A + (m_old - m_new) log2(e) l), 0 while l = 0
        self.big_a = alpha * (self.big_a + torch.where(self.l > 0, (self.m - m_safe) * LOG2E * self.l, 0.0))
        self.l = alpha * self.l
        if self.rest is not None:
            self.rest = alpha * self.rest
        self.dist, self.induction = alpha * self.dist, alpha * self.induction
        if self.acc is not None:
            self.acc *= alpha[..., None]
        self.m, self.neg_shift = m_new, (m_safe * -LOG2E)[..., None]
        return True

    def keep_single_keys(self, s: torch.Tensor, a: int, b: int, k0: int, k1: int) -> None:
        """The raw scores of token 0, each row's own key and its previous key, where the tile s holds them (rows
        a .. b - 1, keys k0 .. k1 - 1)."""
        if k0 == 0:
            self.raw0 = s[..., 0].clone()
        for raw, back in ((self.raw_self, 0), (self.raw_prev, 1)):
            lo, hi = max(a, k0 + back), min(b, k1 + back)  # the rows q whose key q - back is in the tile
            if lo < hi:  # a diagonal of the tile
                raw[:, lo - a:hi - a] = s[:, lo - a:hi - a, lo - back - k0:hi - back - k0].diagonal(dim1=1, dim2=2)


class _LayerPass:
    """One layer's streamed pass (streamed_stats): what stays the same over its tiles, the buffers each thread's
    tiles reuse, and the sums over its blocks of rows (kept per block, so blocks may run on several threads at
    once, and added in order at the end: the same sums whatever the order the blocks ran in)."""

    def __init__(self, inputs, token_ids, *, key_block: int, block: int, values, pools: dict[str, int]):
        self.x, self.key_block, self.block = inputs, key_block, block
        n, n_keys, n_heads = inputs.n_query, inputs.n_key, inputs.n_heads
        self.match = (None if token_ids is None else token_ids if isinstance(token_ids, InductionMatch)
                      else InductionMatch(token_ids))
        self.with_targets = self.match.with_targets if self.match is not None else np.zeros(n, dtype=bool)
        # every key a row may see is at or before it (causal, sliding window, chunk): |q - k| = q - k, so the
        # distance sum is a product with the key positions, counted from the block's first row (small numbers)
        self.keys_behind = inputs.mask.causal and inputs.mask.bits is None and n_keys == n
        self.positions = torch.arange(n_keys, dtype=torch.float32)
        self.v = self.grouped = self.output = None
        if values is not None:
            group = n_heads // values.shape[0]
            self.grouped = list(inputs.kv_head_of) == [h // group for h in range(n_heads)]
            self.v = values.float() if self.grouped else values.float()[list(inputs.kv_head_of)]
            self.output = torch.empty(n_heads, n, values.shape[-1])
        self.pools = PooledMaxima(pools, n, n_keys, n_heads) if pools else None
        n_blocks = -(-n // block)
        self.sums = {c: np.zeros((n_blocks, n_heads)) for c in ("entropy", "mean_distance", "sink_mass",
                                                                  "prev_token", "self", "learned_sink")}
        self.per_query = np.zeros((n_heads, n))  # induction, per query
        self.kept = np.zeros((n_heads, n), dtype=np.float32) if "_overview" in pools else None
        self.buffer_size = n_heads * min(block, n) * min(key_block, n_keys)
        self.buffers = threading.local()

    def _buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This thread's score and exp buffers, made on its first tile."""
        mine = self.buffers
        if not hasattr(mine, "scores"):
            mine.scores, mine.exp = torch.empty(self.buffer_size), torch.empty(self.buffer_size)
        return mine.scores, mine.exp

    def rows(self, a: int, b: int) -> None:
        """Every key tile query rows a .. b - 1 may see, then their statistics added to the sums."""
        x = self.x
        key_end = max(x.mask.key_end(a, b), min(b, x.n_key))  # the diagonal is always read (prev, self)
        run = _Running(x.n_heads, b - a, None if self.v is None else self.v.shape[-1])
        find = self.match is not None and x.n_key == x.n_query and bool(self.with_targets[a:b].any())
        if self.pools is not None:
            run.fine_max = self.pools.start(x.n_heads, b - a)
            run.rest = torch.zeros(x.n_heads, b - a)
        scores, run.exp_buffer = self._buffers()
        run.offsets = self.positions - a if self.keys_behind else None
        # key tiles left of every key the block's rows may see (a sliding window's, a chunk's) are never computed
        for k0 in range(min(x.mask.key_start(a, b), key_end), key_end, self.key_block):
            k1 = min(key_end, k0 + self.key_block)
            shape = (x.n_heads, b - a, k1 - k0)
            s = core.layer_scores(x, a, b, key_start=k0, key_end=k1, out=_view(scores, shape))
            self._tile(run, s, a, b, k0, k1, find)
        self._finish(run, a, b, find)

    def _tile(self, run: _Running, s: torch.Tensor, a: int, b: int, k0: int, k1: int, find: bool) -> None:
        """One tile's scores s [head, rows, k1 - k0] (-inf masked; overwritten) folded into the running values."""
        run.keep_single_keys(s, a, b, k0, k1)
        if self.pools is not None:
            self.pools.tile(run.fine_max, s, k0, k1)
        run.shift_for(s.amax(-1))
        # s <- (s - m) log2(e) in one pass, and exp(s - m) as 2^s: torch's exp2 takes a fifth of exp's time
        torch.add(run.neg_shift, s, alpha=LOG2E, out=s)
        masked_from = _first_masked_key(self.x, a, k0, k1)
        if masked_from is not None:  # masked: exp gives 0, and 0 * s stays 0 (no -inf * 0)
            s[..., masked_from:].clamp_(min=-1e30)
        e = torch.exp2(s, out=_view(run.exp_buffer, s.shape))
        weights = e.sum(-1)
        run.l += weights
        if run.rest is not None:  # summed apart, not l less token 0's: a row that keeps 1e-6 off it keeps its digits
            run.rest += e[..., 1:].sum(-1) if k0 == 0 else weights
        if self.keys_behind:
            run.dist += torch.matmul(e, run.offsets[k0:k1])
        if self.v is not None:
            self._accumulate_output(run, e, k0, k1)
        if find:
            self.match.add_matched(run.induction, e, a, b, k0, k1)
        run.big_a += s.mul_(e).sum(-1)  # sum exp(s - m)(s - m), s in log2 units
        if not self.keys_behind:
            distance = (torch.arange(a, b, dtype=torch.float32)[:, None] - self.positions[None, k0:k1]).abs_()
            run.dist += torch.mul(e, distance, out=s).sum(-1)

    def _accumulate_output(self, run: _Running, e: torch.Tensor, k0: int, k1: int) -> None:
        """acc += e v over the tile's keys (one product per KV head over its query heads' rows)."""
        if self.grouped:
            n_kv = self.v.shape[0]
            acc = run.acc.view(n_kv, -1, run.acc.shape[-1])
            acc.baddbmm_(e.reshape(n_kv, acc.shape[1], k1 - k0), self.v[:, k0:k1])
        else:
            run.acc += torch.matmul(e, self.v[:, k0:k1])

    def _finish(self, run: _Running, a: int, b: int, find: bool) -> None:
        """The rows' statistics from their final running values, added to the sums."""
        sink = self.x.sink
        m_safe = torch.where(torch.isfinite(run.m), run.m, 0.0)
        l_keys = l = run.l
        big_a, dist, induction, acc = run.big_a * LN2, run.dist, run.induction, run.acc
        rest = run.rest
        if sink is not None:  # the sink logit joins the normalisation, with no value and no key
            m_f = torch.maximum(m_safe, sink[:, None])
            alpha = torch.exp(run.m - m_f)
            rest = None if rest is None else alpha * rest
            big_a = alpha * (big_a + torch.where(l > 0, (run.m - m_f) * l, 0.0))
            l_keys = alpha * l
            l = l_keys + torch.exp(sink[:, None] - m_f)
            dist, induction = alpha * dist, alpha * induction
            acc = None if acc is None else alpha[..., None] * acc
            m_safe = m_f
        total = torch.where(l > 0, l, 1.0)
        mass = l_keys / total  # sum_k p_k: 1, or 1 - the sink's share
        i = a // self.block
        add = lambda name, x: self.sums[name].__setitem__(i, x.double().sum(-1).numpy())  # noqa: E731
        add("learned_sink", 1.0 - mass)
        add("entropy", torch.log(total) * mass - big_a / total)
        add("mean_distance", torch.arange(b - a) * mass - dist / total if self.keys_behind else dist / total)
        p0 = torch.exp(run.raw0 - m_safe) / total
        add("self", torch.exp(run.raw_self - m_safe) / total)
        first_row = 1 if a == 0 else 0  # query 0 has no previous token and is left out of the sink mass
        add("sink_mass", p0[:, first_row:])
        add("prev_token", (torch.exp(run.raw_prev - m_safe) / total)[:, first_row:])
        if find:
            self.per_query[:, a:b] = (induction / total).double().numpy()
        if acc is not None:
            torch.div(acc, total[..., None], out=self.output[:, a:b])
        if self.pools is not None:
            kept = (rest / total).numpy()
            self.pools.finish(run.fine_max, a, b, m_safe, total, kept)
            if self.kept is not None:
                self.kept[:, a:b] = kept

    def result(self) -> dict[str, np.ndarray]:
        n, n_heads = self.x.n_query, self.x.n_heads
        sums, none = {name: per_block.sum(0) for name, per_block in self.sums.items()}, np.full(n_heads, np.nan)
        out = {
            "entropy": sums["entropy"] / n,
            "sink_mass": sums["sink_mass"] / (n - 1) if n > 1 else none,
            "mean_distance": sums["mean_distance"] / n,
            "prev_token": sums["prev_token"] / (n - 1) if n > 1 else none,
            "self": sums["self"] / n,
            "induction": (self.per_query[:, self.with_targets].mean(-1) if self.with_targets.any() else none),
        }
        if self.x.sink is not None:
            out["learned_sink"] = sums["learned_sink"] / n
        if self.pools is not None:
            out.update(self.pools.result())
        if self.kept is not None:
            out["_kept"] = self.kept
        if self.output is not None:
            out["_output"] = self.output
        return out


def _view(buffer: torch.Tensor, shape) -> torch.Tensor:
    """The first prod(shape) elements of a flat buffer as a contiguous tensor of that shape."""
    return buffer[:int(np.prod(shape))].view(shape)


def _first_masked_key(inputs, a: int, k0: int, k1: int) -> int | None:
    """The first column of the tile (rows from a, keys k0 .. k1 - 1) that the mask may hide (as
    attnviz.attention.layer_scores applies it), or None when it hides none of them."""
    kind = inputs.mask.kind
    if kind == "full":
        return None
    if kind == "causal":
        lo = max(k0, a + inputs.mask.n_key - inputs.mask.n_query + 1)
        return lo - k0 if lo < k1 else None
    return 0
