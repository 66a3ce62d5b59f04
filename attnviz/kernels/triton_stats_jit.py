"""The Triton kernels of attnviz.kernels.triton_stats (every head's statistics from the FlashAttention-2 pass),
kept in the shape of the Triton tutorial's kernel.


One program per (query block, head), a loop over key blocks as in triton_attention._attn_fwd: the running row max
m_i, the running sum l_i and (with values) the output accumulator, rescaled by alpha = 2^(m_old - m_new) when the
max grows. The same loop carries, per query row, the sums the statistics need, with the identities
stats.streamed_stats uses (scores in log2 units t = s log2 e, so every exponential is exp2):
  A     sum_k e_k (t_k - m)       A <- alpha (A + (m_old - m_new) l) + sum_tile e (t - m_new)     (entropy)
  D     sum_k e_k |q - k|         D <- alpha D + sum_tile e |q - k|                                 (mean distance)
        (a causal tile left of the diagonal: (q - start) sum_tile e - sum_tile e (k - start), no |q - k| per element)
  I     sum over q's induction targets of e_k, carried like D                                        (induction)
  R     sum_{k > 0} e_k, carried like D (the weight off key 0, summed apart: l - e_0 would lose a row's digits
        where key 0 takes nearly all of it)
  t0, t_self, t_prev  the raw scores of key 0, key q and key q - 1, read from the tiles that hold them; their weight
        is 2^(t - m) / l at the end (sink mass, self, previous token)
with e_k = 2^(t_k - m). The epilogue joins the learned sink logit to m and l, then writes nine numbers per row:
entropy, distance, weight on key 0, on key q, on key q - 1, on the induction targets, the share of the row's weight
on real keys, log2 of the row's normaliser, and the weight off key 0 (triton_stats.ROW_FIELDS). kernel_stats
averages the rows as streamed_stats does.

Induction targets reach the kernel as one int32 per key, the token before it (prev_id[k] = ids[k - 1], -1 for key
0), and one per query, its own token: key t is a target of query q exactly when t < q and prev_id[t] == ids[q]
(stats.induction_targets' definition, each distinct target once). That is O(n) memory and exact, where a padded
[n, max_targets] list grows to O(n^2) on repetitive text. With keys that are not the queries' own tokens (n_key !=
n_query) induction is NaN.

The pooled grid tiles (the Heads page's [head, 48, 48] max-pooled picture) come from a second, light pass,
pool_fwd: a pooled cell is the largest weight 2^(t - lse) over its rows and keys, and a row's lse (log2 of its
final normaliser) is known only after its last key block, so the first pass could only keep every row's raw
maxima for every key bin ([block, bins] per program, 24 KiB of registers at 128 rows x 48 bins, or a
[head, n, bins] array in memory) and normalise them later. The second pass recomputes q.k (half the first pass's
matmul work, no p.v, no exponential: max(t - lse) is taken in the log domain) and reduces each tile to at most 2 x 2
pooled cells (pooling blocks are wider than tiles from n = 48 x block on), written with atomic max.

Mask rules: causal, sliding window and chunked (key blocks wholly outside every row's reach are never loaded, the
blocks every row sees in full run without a mask: K, V and the previous-token ids are loaded unmasked, and
without soft-cap or bias the scale joins the shift in one multiply-add, as in triton_attention's unmasked stage), or
none; soft-cap (c tanh(s / c)), an additional per-key bias
(ALiBi) and a learned sink logit per head; GQA through kv_head_of. Explicit-bit masks are refused (Unsupported):
the caller uses the torch path.
"""

import triton
import triton.language as tl

@triton.jit
def _tile_scores(q, K, Bias, cols, offs_m, offs_d, stride_kn, stride_kd, NQ, NK, off, WINDOW, CHUNK, qk_scale,
                 softcap, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                 HAS_WINDOW: tl.constexpr, HAS_CHUNK: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                 HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr):
    """The logits of one tile in log2 units, t = log2(e) (softcap(q.k scaling) + bias), -inf where the mask hides a
    key. MASKED=False: every key of the tile is inside the keys and visible to every row (no mask is built)."""
    k_ptrs = K + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd
    if MASKED:
        k = tl.load(k_ptrs, mask=(cols[None, :] < NK) & (offs_d[:, None] < HEAD_DIM), other=0.0)
    else:
        k = tl.load(k_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
    t = tl.dot(q, k, input_precision=PRECISION)
    if HAS_SOFTCAP:  # c tanh(x / c), tanh(y) = 1 - 2 / (e^(2y) + 1) (exact at both infinities)
        y = t * (qk_scale / softcap)
        t = (1.0 - 2.0 / (tl.math.exp2(y * (2.0 * 1.4426950408889634)) + 1.0)) * (softcap * 1.4426950408889634)
    else:
        t = t * (qk_scale * 1.4426950408889634)
    if HAS_BIAS:  # Bias is pre-multiplied by log2(e)
        t += tl.load(Bias + cols, mask=cols < NK, other=0.0)[None, :]
    if MASKED:
        pos = offs_m[:, None] + off
        visible = (cols[None, :] < NK) & (offs_m[:, None] < NQ)
        if CAUSAL:
            visible = visible & (cols[None, :] <= pos)
        if HAS_WINDOW:
            visible = visible & (cols[None, :] > pos - WINDOW)
        if HAS_CHUNK:
            visible = visible & (cols[None, :] // CHUNK == pos // CHUNK)
        t = tl.where(visible, t, float("-inf"))
    return t


@triton.jit
def _key_bounds(start_m, NQ, NK, off, WINDOW, CHUNK, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_CHUNK: tl.constexpr):
    """Key positions [lo, left) run masked (a window's left edge), [left, mid) unmasked (every row sees every key),
    [mid, hi) masked (the causal diagonal, the ragged last block). lo, left, mid are multiples of BLOCK_N; keys
    outside [lo, hi) are seen by no row of the block and never loaded (MaskRule.key_start / key_end)."""
    first = start_m * BLOCK_M + off  # the position of the block's first query
    last = tl.minimum((start_m + 1) * BLOCK_M, NQ) - 1 + off
    mid = NK // BLOCK_N * BLOCK_N
    lo = 0
    left = 0
    hi = NK
    if CAUSAL:
        hi = tl.maximum(tl.minimum(last + 1, NK), 0)
        mid = tl.minimum(mid, tl.maximum(first + 1, 0) // BLOCK_N * BLOCK_N)
        if HAS_WINDOW:
            lo = tl.minimum(tl.maximum(first - WINDOW + 1, 0) // BLOCK_N * BLOCK_N, mid)
            edge = tl.maximum(last - WINDOW + 1, 0)
            left = tl.minimum(tl.maximum((edge + BLOCK_N - 1) // BLOCK_N * BLOCK_N, lo), mid)
        elif HAS_CHUNK:  # every tile masked: a tile may straddle a chunk edge for some row
            lo = tl.minimum(tl.maximum(first, 0) // CHUNK * CHUNK // BLOCK_N * BLOCK_N, hi)
            left = lo
            mid = lo
    return lo, left, mid, hi


@triton.jit
def _raw_scores(q, K, cols, offs_d, stride_kn, stride_kd, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                PRECISION: tl.constexpr):
    """q.k of one tile whose keys are all inside the keys and visible to every row, unscaled: the caller folds the
    scale into one fused multiply-add, as triton_attention's unmasked stage does (no load mask where d needs no
    padding)."""
    k_ptrs = K + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd
    if D_PAD == HEAD_DIM:
        k = tl.load(k_ptrs)
    else:
        k = tl.load(k_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
    return tl.dot(q, k, input_precision=PRECISION)


@triton.jit
def _stats_inner(m_i, l_i, big_a, dist, ind, rest, t0, t_self, t_prev, acc, visits, q,
                 K, V, Bias, KeyPrev, tok, stride_kn, stride_kd, stride_vn, stride_vd,
                 lo, hi, NQ, NK, off, WINDOW, CHUNK, qk_scale, softcap, offs_m, offs_d, offs_dv,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                 V_DIM: tl.constexpr, DV_PAD: tl.constexpr,
                 MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_CHUNK: tl.constexpr,
                 HAS_SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_V: tl.constexpr,
                 INDUCTION: tl.constexpr, PRECISION: tl.constexpr, ALIGNED: tl.constexpr):
    """Key blocks lo, lo + BLOCK_N, ... < hi: the online softmax and the statistics' running sums (module doc).
    ALIGNED: causal with as many keys as queries, so an unmasked tile's keys are all left of every row (the
    distance needs no |q - k| per element, an induction target no k < q test). An unmasked tile without soft-cap
    or bias keeps q.k unscaled (FOLD): its max is taken raw and the scale joins the shift in one multiply-add."""
    FOLD: tl.constexpr = not MASKED and not HAS_SOFTCAP and not HAS_BIAS
    offs_n = tl.arange(0, BLOCK_N)
    first_row = tl.program_id(0) * BLOCK_M
    last_row = tl.minimum(first_row + BLOCK_M, NQ) - 1
    scale = qk_scale * 1.4426950408889634  # what t is multiplied by to give log2 units under FOLD
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if FOLD:
            t = _raw_scores(q, K, cols, offs_d, stride_kn, stride_kd, HEAD_DIM, D_PAD, PRECISION)
        else:
            t = _tile_scores(q, K, Bias, cols, offs_m, offs_d, stride_kn, stride_kd, NQ, NK, off, WINDOW, CHUNK,
                             qk_scale, softcap, HEAD_DIM, MASKED, CAUSAL, HAS_WINDOW, HAS_CHUNK, HAS_SOFTCAP,
                             HAS_BIAS, PRECISION)
        t0, t_self, t_prev = _single_keys(t, t0, t_self, t_prev, cols, offs_m, start_n, first_row, last_row, scale,
                                          BLOCK_N, FOLD)
        if FOLD:  # every key of the tile is visible to every row, so the new max is finite (scale > 0)
            m_new = tl.maximum(m_i, tl.max(t, 1) * scale)
            m_shift = m_new
            shifted = t * scale - m_shift[:, None]
        else:
            m_new = tl.maximum(m_i, tl.max(t, 1))
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw no key yet: p = 0, not NaN
            shifted = t - m_shift[:, None]
        p = tl.math.exp2(shifted)
        if MASKED:
            shifted = tl.where(p > 0.0, shifted, 0.0)  # no -inf * 0
        alpha = tl.math.exp2(m_i - m_shift)
        big_a = alpha * (big_a + (tl.where(l_i > 0.0, m_i, m_shift) - m_shift) * l_i) + tl.sum(p * shifted, 1)
        l_tile = tl.sum(p, 1)
        l_i = alpha * l_i + l_tile
        rest_tile = l_tile
        if start_n == 0:
            rest_tile = tl.sum(tl.where(cols[None, :] > 0, p, 0.0), 1)
        rest = alpha * rest + rest_tile
        if MASKED or not ALIGNED:
            gap = tl.abs(offs_m[:, None] - cols[None, :]).to(tl.float32)
            dist = alpha * dist + tl.sum(p * gap, 1)
        else:  # every key of the tile is left of every row: sum p (q - k) = (q - start) l - sum p (k - start)
            tile_gap = (offs_m - start_n).to(tl.float32) * l_tile - tl.sum(p * offs_n.to(tl.float32)[None, :], 1)
            dist = alpha * dist + tile_gap
        if INDUCTION:
            ind = alpha * ind + _induction_sum(p, KeyPrev, tok, cols, offs_m, NK, MASKED, ALIGNED)
        if HAS_V:
            v_ptrs = V + cols[:, None] * stride_vn + offs_dv[None, :] * stride_vd
            if MASKED:
                v = tl.load(v_ptrs, mask=(cols[:, None] < NK) & (offs_dv[None, :] < V_DIM), other=0.0)
            elif DV_PAD == V_DIM:
                v = tl.load(v_ptrs)
            else:
                v = tl.load(v_ptrs, mask=offs_dv[None, :] < V_DIM, other=0.0)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new
        visits += 1
    return m_i, l_i, big_a, dist, ind, rest, t0, t_self, t_prev, acc, visits


@triton.jit
def _single_keys(t, t0, t_self, t_prev, cols, offs_m, start_n, first_row, last_row, scale, BLOCK_N: tl.constexpr,
                 FOLD: tl.constexpr):
    """The raw scores (log2 units) of key 0, key q and key q - 1, from the tiles that hold them; under FOLD t is
    q.k unscaled and the row's pick is scaled (scale > 0 keeps -inf and the max)."""
    if not FOLD:
        scale = 1.0
    if start_n == 0:
        t0 = tl.max(tl.where(cols[None, :] == 0, t, float("-inf")), 1) * scale
    if (start_n <= last_row) & (start_n + BLOCK_N > first_row):
        t_self = tl.maximum(t_self, tl.max(tl.where(cols[None, :] == offs_m[:, None], t, float("-inf")), 1) * scale)
    if (start_n <= last_row - 1) & (start_n + BLOCK_N > first_row - 1):
        t_prev = tl.maximum(t_prev,
                            tl.max(tl.where(cols[None, :] == offs_m[:, None] - 1, t, float("-inf")), 1) * scale)
    return t0, t_self, t_prev


@triton.jit
def _induction_sum(p, KeyPrev, tok, cols, offs_m, NK, MASKED: tl.constexpr, ALIGNED: tl.constexpr):
    """Each row's weight on its induction targets in this tile: keys k < q whose previous token is q's token. An
    unmasked tile's keys all lie inside the keys, and under ALIGNED left of every row, so neither needs a test."""
    if MASKED:
        before = tl.load(KeyPrev + cols, mask=cols < NK, other=-2)
    else:
        before = tl.load(KeyPrev + cols)
    match = before[None, :] == tok[:, None]
    if MASKED or not ALIGNED:
        match = match & (cols[None, :] < offs_m[:, None])
    return tl.sum(tl.where(match, p, 0.0), 1)


@triton.jit
def stats_fwd(Q, K, V, Out, Bias, Sink, KvOf, Tok, KeyPrev, Rows, Visits, qk_scale, softcap,
               stride_qh, stride_qm, stride_qd, stride_kh, stride_kn, stride_kd, stride_vh, stride_vn, stride_vd,
               stride_oh, stride_om, stride_od, stride_bh,
               NQ, NK, off, WINDOW, CHUNK,
               HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, V_DIM: tl.constexpr, DV_PAD: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
               HAS_CHUNK: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SINK: tl.constexpr,
               HAS_V: tl.constexpr, INDUCTION: tl.constexpr, PRECISION: tl.constexpr, ALIGNED: tl.constexpr):
    start_m = tl.program_id(0)
    h = tl.program_id(1)
    kv = tl.load(KvOf + h).to(tl.int64)
    Q += h.to(tl.int64) * stride_qh
    K += kv * stride_kh
    V += kv * stride_vh
    Bias += h.to(tl.int64) * stride_bh
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    offs_dv = tl.arange(0, DV_PAD)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=(offs_m[:, None] < NQ) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    tok = tl.load(Tok + offs_m, mask=offs_m < NQ, other=-3)
    neg = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    zero = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i, l_i, big_a, dist, ind, rest, t0, t_self, t_prev = neg, zero, zero, zero, zero, zero, neg, neg, neg
    acc = tl.zeros([BLOCK_M, DV_PAD], dtype=tl.float32)
    visits = 0
    lo, left, mid, hi = _key_bounds(start_m, NQ, NK, off, WINDOW, CHUNK, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW,
                                    HAS_CHUNK)
    # [lo, left) masked (a window's left edge), [left, mid) unmasked, [mid, hi) masked (diagonal, ragged end)
    m_i, l_i, big_a, dist, ind, rest, t0, t_self, t_prev, acc, visits = _stats_inner(
        m_i, l_i, big_a, dist, ind, rest, t0, t_self, t_prev, acc, visits, q, K, V, Bias, KeyPrev, tok,
        stride_kn, stride_kd, stride_vn, stride_vd, lo, left, NQ, NK, off, WINDOW, CHUNK, qk_scale, softcap,
        offs_m, offs_d, offs_dv, BLOCK_M, BLOCK_N, HEAD_DIM, D_PAD, V_DIM, DV_PAD, True, CAUSAL, HAS_WINDOW,
        HAS_CHUNK, HAS_SOFTCAP, HAS_BIAS, HAS_V, INDUCTION, PRECISION, ALIGNED)
    m_i, l_i, big_a, dist, ind, rest, t0, t_self, t_prev, acc, visits = _stats_inner(
        m_i, l_i, big_a, dist, ind, rest, t0, t_self, t_prev, acc, visits, q, K, V, Bias, KeyPrev, tok,
        stride_kn, stride_kd, stride_vn, stride_vd, left, mid, NQ, NK, off, WINDOW, CHUNK, qk_scale, softcap,
        offs_m, offs_d, offs_dv, BLOCK_M, BLOCK_N, HEAD_DIM, D_PAD, V_DIM, DV_PAD, False, CAUSAL, HAS_WINDOW,
        HAS_CHUNK, HAS_SOFTCAP, HAS_BIAS, HAS_V, INDUCTION, PRECISION, ALIGNED)
    m_i, l_i, big_a, dist, ind, rest, t0, t_self, t_prev, acc, visits = _stats_inner(
        m_i, l_i, big_a, dist, ind, rest, t0, t_self, t_prev, acc, visits, q, K, V, Bias, KeyPrev, tok,
        stride_kn, stride_kd, stride_vn, stride_vd, mid, hi, NQ, NK, off, WINDOW, CHUNK, qk_scale, softcap,
        offs_m, offs_d, offs_dv, BLOCK_M, BLOCK_N, HEAD_DIM, D_PAD, V_DIM, DV_PAD, True, CAUSAL, HAS_WINDOW,
        HAS_CHUNK, HAS_SOFTCAP, HAS_BIAS, HAS_V, INDUCTION, PRECISION, ALIGNED)
    # epilogue: the learned sink joins m and l (no key, no value), then every sum is divided by the final l
    m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
    l_keys = l_i
    if HAS_SINK:
        sink = tl.load(Sink + h) * 1.4426950408889634
        m_f = tl.maximum(m_safe, sink)
        alpha = tl.math.exp2(m_i - m_f)
        big_a = alpha * (big_a + (tl.where(l_i > 0.0, m_i, m_f) - m_f) * l_i)
        l_keys = alpha * l_i
        l_i = l_keys + tl.math.exp2(sink - m_f)
        dist = alpha * dist
        ind = alpha * ind
        rest = alpha * rest
        acc = acc * alpha[:, None]
        m_safe = m_f
    total = tl.where(l_i > 0.0, l_i, 1.0)
    mass = l_keys / total
    rows_ok = offs_m < NQ
    Rows += h.to(tl.int64) * 9 * NQ + offs_m  # triton_stats.ROW_FIELDS
    tl.store(Rows, tl.log(total) * mass - big_a * 0.6931471805599453 / total, mask=rows_ok)  # entropy, nats
    tl.store(Rows + NQ, dist / total, mask=rows_ok)
    tl.store(Rows + 2 * NQ, tl.math.exp2(t0 - m_safe) / total, mask=rows_ok)
    tl.store(Rows + 3 * NQ, tl.math.exp2(t_self - m_safe) / total, mask=rows_ok)
    tl.store(Rows + 4 * NQ, tl.math.exp2(t_prev - m_safe) / total, mask=rows_ok)
    tl.store(Rows + 5 * NQ, ind / total, mask=rows_ok)
    tl.store(Rows + 6 * NQ, mass, mask=rows_ok)
    tl.store(Rows + 7 * NQ, m_safe + tl.log2(total), mask=rows_ok)
    tl.store(Rows + 8 * NQ, rest / total, mask=rows_ok)
    tl.store(Visits + h * tl.num_programs(0) + start_m, visits)
    if HAS_V:
        Out += h.to(tl.int64) * stride_oh
        tl.store(Out + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od,
                 (acc / total[:, None]).to(Out.dtype.element_ty),
                 mask=rows_ok[:, None] & (offs_dv[None, :] < V_DIM))


@triton.jit
def _pool_max(Pool, t, rows_in, cols_in, rb, kb, R, C):
    """The largest t of the tile's elements in pooled cell (rb, kb) (rows_in / cols_in: which rows and keys of the
    tile lie in it), written with atomic max."""
    best = tl.max(tl.max(tl.where(rows_in[:, None] & cols_in[None, :], t, float("-inf")), 1), 0)
    tl.atomic_max(Pool + rb * C + kb, best, mask=(rb < R) & (kb < C) & (best > float("-inf")))


@triton.jit
def pool_fwd(Q, K, Bias, KvOf, Lse, LseOff, RowBin, KeyBin, Pool, PoolOff, qk_scale, softcap,
              stride_qh, stride_qm, stride_qd, stride_kh, stride_kn, stride_kd, stride_bh,
              NQ, NK, off, WINDOW, CHUNK, R, C,
              HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_CHUNK: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
              HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr):
    """The pooled grid: for every visible (row, key), log2 of its weight t - lse (and t - lse_off, the weight with
    the first-token sink hidden, key 0 left out), max-reduced into its pooled cell of Pool / PoolOff [R, C] per head
    (log2 units, -inf = nothing seen). A tile that spans at most 2 x 2 pooled cells is reduced on chip to 4 atomics;
    otherwise (pooling blocks narrower than a tile: short texts) every element goes to its cell."""
    start_m = tl.program_id(0)
    h = tl.program_id(1)
    kv = tl.load(KvOf + h).to(tl.int64)
    Q += h.to(tl.int64) * stride_qh
    K += kv * stride_kh
    Bias += h.to(tl.int64) * stride_bh
    Pool += h.to(tl.int64) * R * C
    PoolOff += h.to(tl.int64) * R * C
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    offs_n = tl.arange(0, BLOCK_N)
    rows_ok = offs_m < NQ
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=rows_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    lse = tl.load(Lse + h * NQ + offs_m, mask=rows_ok, other=float("inf"))
    lse_off = tl.load(LseOff + h * NQ + offs_m, mask=rows_ok, other=float("inf"))
    rbin = tl.load(RowBin + offs_m, mask=rows_ok, other=0)
    rb0 = tl.load(RowBin + start_m * BLOCK_M)
    rb1 = tl.load(RowBin + tl.minimum(start_m * BLOCK_M + BLOCK_M, NQ) - 1)
    lo, left, mid, hi = _key_bounds(start_m, NQ, NK, off, WINDOW, CHUNK, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW,
                                    HAS_CHUNK)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        t = _tile_scores(q, K, Bias, cols, offs_m, offs_d, stride_kn, stride_kd, NQ, NK, off, WINDOW, CHUNK,
                         qk_scale, softcap, HEAD_DIM, True, CAUSAL, HAS_WINDOW, HAS_CHUNK, HAS_SOFTCAP, HAS_BIAS,
                         PRECISION)
        w = t - lse[:, None]
        w_off = tl.where(cols[None, :] == 0, float("-inf"), t - lse_off[:, None])
        kbin = tl.load(KeyBin + cols, mask=cols < NK, other=0)
        kb0 = tl.load(KeyBin + start_n)
        kb1 = tl.load(KeyBin + tl.minimum(start_n + BLOCK_N, NK) - 1)
        if (rb1 - rb0 <= 1) & (kb1 - kb0 <= 1):
            for i in tl.static_range(2):
                for j in tl.static_range(2):
                    rows_in = (rbin == rb0 + i) & rows_ok
                    cols_in = (kbin == kb0 + j) & (cols < NK)
                    _pool_max(Pool, w, rows_in, cols_in, rb0 + i, kb0 + j, R, C)
                    _pool_max(PoolOff, w_off, rows_in, cols_in, rb0 + i, kb0 + j, R, C)
        else:
            cells = rbin[:, None] * C + kbin[None, :]
            valid = rows_ok[:, None] & (cols[None, :] < NK)
            tl.atomic_max(Pool + cells, w, mask=valid & (w > float("-inf")))
            tl.atomic_max(PoolOff + cells, w_off, mask=valid & (w_off > float("-inf")))
