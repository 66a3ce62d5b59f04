"""The fused kernel of triton_attention, in plain torch, one (query block, key block) step at a time.

The two functions below mirror the kernel's two: `_attn_fwd_inner` is its loop over key blocks with the kernel's
names (m_i, l_i, acc, alpha, m_ij, l_ij, p), and `_attn_fwd` one program: it loads the query tile, calls the inner
loop for stage 1 (key blocks every query sees in full: no mask) and stage 2 (the causal diagonal and the ragged last
block: masked), with the bounds of stages.stage_bounds, then divides acc by l_i. They are generators: each key block
yields its state, so the page can show it, and `yield from` hands the state on as the kernel's calls return it.

One change of units: the kernel keeps scores in log2 units and uses exp2 (exp(x) = exp2(x log2 e)); the stepper keeps
them in natural units and uses exp, so m_i reads like the scores. FlashAttention-2: Dao, 2023, Algorithm 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch

from .stages import stage_bounds


@dataclass(frozen=True)
class TileStep:
    """The state of one (query block, key block) step. Arrays are numpy; rows are the block's real queries
    (rows = q_stop - q_start), cols its real keys (cols = k_stop - k_start).

    scores: [rows, cols]  s = q k^T * scale, -inf where the causal mask (or a sliding window) hides a key
    p: [rows, cols]       exp(s - m_i), in the dtype the kernel multiplies with v
    m_prev, l_prev: [rows]  running max and running sum before the step; m_i, l_i: after it
    alpha: [rows]         exp(m_prev - m_i), the factor the old l and acc are rescaled by
    acc_rescaled: [rows, d]  acc_prev * alpha;  acc: [rows, d] = acc_rescaled + p v
    out: [rows, d]        O = acc / l_i, only on the block's last step (last=True), else None
    masked: the step ran in stage 2, with masks (the causal diagonal or the ragged last key block); partial: the
    causal mask hides some of the tile's scores; first: the block's first key tile
    flops: 4 * rows * cols * d (q k^T and p v, a multiply-add counted as 2)
    bytes_loaded: K and V tiles, plus the Q tile on the block's first step; bytes_stored: the O tile on the last
    """

    index: int
    batch: int
    head: int
    q_block: int
    k_block: int
    q_start: int
    q_stop: int
    k_start: int
    k_stop: int
    masked: bool
    partial: bool
    scores: np.ndarray
    p: np.ndarray
    m_prev: np.ndarray
    l_prev: np.ndarray
    m_i: np.ndarray
    l_i: np.ndarray
    alpha: np.ndarray
    acc_rescaled: np.ndarray
    acc: np.ndarray
    first: bool
    last: bool
    out: np.ndarray | None
    flops: int
    bytes_loaded: int
    bytes_stored: int


@dataclass(frozen=True)
class _Inner:
    """What one pass of _attn_fwd_inner's loop body leaves behind (torch tensors), before TileStep's bookkeeping."""

    start_n: int
    cols: torch.Tensor
    qk: torch.Tensor
    p: torch.Tensor
    m_prev: torch.Tensor
    l_prev: torch.Tensor
    m_i: torch.Tensor
    l_i: torch.Tensor
    alpha: torch.Tensor
    acc_rescaled: torch.Tensor
    acc: torch.Tensor
    masked: bool
    partial: bool


def _attn_fwd_inner(acc, l_i, m_i, q, K, V, lo, hi, qk_scale, n_key, causal_offset, offs_m, *, block_n, masked,
                    causal, window=None):
    """Key blocks lo, lo + block_n, ... < hi, as the kernel's _attn_fwd_inner: yields an _Inner per block and
    returns (acc, l_i, m_i). K, V: [n_key, d] of one head; q: [rows, d]; offs_m: the rows' query positions."""
    for start_n in range(lo, hi, block_n):
        cols = torch.arange(start_n, min(start_n + block_n, n_key))  # the kernel masks the loads past n_key
        m_prev, l_prev = m_i, l_i
        # -- compute qk --
        k = K[cols].to(q.dtype)  # [cols, d]
        qk = (q @ k.T) * qk_scale  # [rows, cols]
        visible = torch.ones_like(qk, dtype=torch.bool)
        if masked:
            visible = cols[None, :] < n_key
            if causal:
                visible = visible & (cols[None, :] <= offs_m[:, None] + causal_offset)
            if window:  # a sliding window: only the last `window` keys, the query's own included
                visible = visible & (cols[None, :] > offs_m[:, None] + causal_offset - window)
            qk = torch.where(visible, qk, float("-inf"))
            m_ij = torch.maximum(m_i, qk.amax(1))
            # a row that has seen no visible key yet keeps m = -inf; shifting by 0 then gives p = 0, not NaN
            m_shift = torch.where(m_ij == float("-inf"), 0.0, m_ij)
        else:  # every key of the block is visible to every row, so the new max is finite
            m_ij = torch.maximum(m_i, qk.amax(1))
            m_shift = m_ij
        p = torch.exp(qk - m_shift[:, None])
        l_ij = p.sum(1)
        # -- update m_i and l_i --
        alpha = torch.exp(m_i - m_shift)
        l_i = l_i * alpha + l_ij
        # -- update output accumulator --
        acc = acc * alpha[:, None]
        acc_rescaled = acc
        v = V[cols]
        p = p.to(v.dtype).to(q.dtype)  # the kernel multiplies p in v's dtype
        acc = acc + p @ v.to(q.dtype)
        m_i = m_ij
        yield _Inner(start_n, cols, qk, p, m_prev, l_prev, m_i, l_i, alpha, acc_rescaled, acc, masked,
                     bool((~visible).any()))
    return acc, l_i, m_i


def _attn_fwd(Q, K, V, start_m, sm_scale, *, block_m, block_n, causal, dtype, window=None):
    """One program of the kernel: query block start_m // block_m of one head. Q: [n_query, d], K, V: [n_key, d].
    Yields the _Inner of every key block (the window's edge, stage 1, then stage 2), and returns O [rows, d] =
    acc / l_i."""
    n_query, n_key = Q.shape[0], K.shape[0]
    causal_offset = n_key - n_query
    offs_m = torch.arange(start_m, min(start_m + block_m, n_query))
    # initialize the running max, the running sum and the accumulator
    m_i = torch.full((len(offs_m),), float("-inf"), dtype=dtype)
    l_i = torch.zeros(len(offs_m), dtype=dtype)
    acc = torch.zeros(len(offs_m), Q.shape[1], dtype=dtype)
    q = Q[offs_m].to(dtype)  # [rows, d]: it stays on chip for the whole loop
    lo, left, mid, hi = stage_bounds(start_m // block_m, n_query=n_query, n_key=n_key, block_m=block_m,
                                     block_n=block_n, causal=causal, window=window)
    common = (sm_scale, n_key, causal_offset, offs_m)
    # the left edge of a sliding window, masked (key blocks left of lo are never loaded)
    acc, l_i, m_i = yield from _attn_fwd_inner(acc, l_i, m_i, q, K, V, lo, left, *common, block_n=block_n,
                                               masked=True, causal=causal, window=window)
    # Stage 1, no masks: key blocks every query of this block sees in full
    acc, l_i, m_i = yield from _attn_fwd_inner(acc, l_i, m_i, q, K, V, left, mid, *common, block_n=block_n,
                                               masked=False, causal=causal)
    # Stage 2, masked: the blocks on the causal diagonal and the ragged last block of keys
    acc, l_i, m_i = yield from _attn_fwd_inner(acc, l_i, m_i, q, K, V, mid, hi, *common, block_n=block_n,
                                               masked=True, causal=causal, window=window)
    # epilogue: O = acc / l; a row that saw no key at all (l = 0) gets 0, as attnviz.attention gives
    l_safe = torch.where(l_i == 0.0, 1.0, l_i)
    return acc / l_safe[:, None]


def tiled_steps(q, k, v, *, causal=False, scale=None, block_m=32, block_n=32, window=None) -> Iterator[TileStep]:
    """Yields a TileStep for every (batch, head, query block, key block) the kernel runs, in the kernel's order
    within a program (stage 1's key blocks left to right, then stage 2's), programs by batch, head, then query
    block. Each program's last step carries its output, so it is yielded once the program has returned.

    q: [batch, head, n_query, d], k and v: [batch, head, n_key, d] (torch or numpy). Computes in float32 (float64
    for float64 input); p is rounded to v's dtype before p v, as the kernel does. window (with causal): each query
    sees only its last `window` keys, its own included; the key blocks left of every query's window are skipped.
    """
    q, k, v = (torch.as_tensor(x).cpu() for x in (q, k, v))
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    batch, heads, n_query, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    itemsize = q.element_size()
    index = 0
    for b in range(batch):
        for h in range(heads):
            for start_m in range(0, n_query, block_m):
                program = _attn_fwd(q[b, h], k[b, h], v[b, h], start_m, scale, block_m=block_m, block_n=block_n,
                                    causal=causal, dtype=dtype, window=window)
                held, first = None, True
                while True:
                    try:
                        inner = next(program)
                    except StopIteration as done:
                        out = done.value
                        break
                    if held is not None:
                        yield held
                    held = _tile_step(inner, index, b, h, start_m, block_m, block_n, n_query, d, itemsize, first)
                    index += 1
                    first = False
                if held is not None:
                    rows = held.q_stop - held.q_start
                    yield replace(held, last=True, out=out.numpy(), bytes_stored=rows * d * itemsize)


def _tile_step(inner: _Inner, index, b, h, start_m, block_m, block_n, n_query, d, itemsize, first) -> TileStep:
    rows, cols = min(start_m + block_m, n_query) - start_m, len(inner.cols)
    return TileStep(
        index=index, batch=b, head=h, q_block=start_m // block_m, k_block=inner.start_n // block_n,
        q_start=start_m, q_stop=start_m + rows, k_start=inner.start_n, k_stop=inner.start_n + cols,
        masked=inner.masked, partial=inner.partial, scores=inner.qk.numpy(), p=inner.p.numpy(),
        m_prev=inner.m_prev.numpy(), l_prev=inner.l_prev.numpy(), m_i=inner.m_i.numpy(), l_i=inner.l_i.numpy(),
        alpha=inner.alpha.numpy(), acc_rescaled=inner.acc_rescaled.numpy(), acc=inner.acc.numpy(),
        first=first, last=False, out=None, flops=4 * rows * cols * d,
        bytes_loaded=(2 * cols + (rows if first else 0)) * d * itemsize, bytes_stored=0,
    )


def online_attention(q, k, v, *, causal=False, scale=None, block_m=32, block_n=32, window=None):
    """O assembled from tiled_steps' last step of every query block: the stepper as an attention function.
    Rows that see no key at all get 0. Returns [batch, head, n_query, d] in float32 (float64 for float64 input)."""
    q = torch.as_tensor(q)
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.zeros(q.shape, dtype=dtype)
    for step in tiled_steps(q, k, v, causal=causal, scale=scale, block_m=block_m, block_n=block_n, window=window):
        if step.last:
            out[step.batch, step.head, step.q_start:step.q_stop] = torch.from_numpy(step.out)
    return out


def trace_difference(trace, step: TileStep) -> tuple[float, float]:
    """The largest |m_i| and |l_i| differences between a step of the stepper and the same step in the kernel's
    own trace (triton_attention.KernelTrace), over the step's rows."""
    rows = slice(step.q_start, step.q_stop)
    kernel_m = trace.m_i[step.batch, step.head, step.k_block, rows]
    kernel_l = trace.l_i[step.batch, step.head, step.k_block, rows]
    with np.errstate(invalid="ignore"):  # a row masked whole has m_i = -inf on both sides: -inf - -inf is NaN, skipped
        return (float(np.nanmax(np.abs(kernel_m - step.m_i), initial=0)),
                float(np.nanmax(np.abs(kernel_l - step.l_i), initial=0)))
