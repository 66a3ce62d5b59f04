"""The online-softmax tiled attention of flash_attention, in plain torch, one (query block, key block) at a time.

tiled_steps mirrors _attn_fwd_inner line for line, with one change of units: the kernel keeps scores in log2 units
and uses exp2 (exp(x) = exp2(x log2 e)); the stepper keeps them in natural units and uses exp, so m_i reads like the
scores. The kernel skips the masks on tiles that every query of the block sees in full (TILE_FULL) and the stepper
masks every tile; a mask that hides nothing changes nothing, so its state equals the kernel's trace.
FlashAttention-2: Dao, 2023, Algorithm 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

TILE_SKIPPED, TILE_FULL, TILE_PARTIAL = 0, 1, 2


@dataclass(frozen=True)
class TileStep:
    """The state of one (query block, key block) step. Arrays are numpy; rows are the block's real queries
    (rows = q_stop - q_start), cols its real keys (cols = k_stop - k_start).

    scores: [rows, cols]  s = q k^T * scale, -inf where the causal mask hides a key
    p: [rows, cols]       exp(s - m_i), in the dtype the kernel multiplies with v
    m_prev, l_prev: [rows]  running max and running sum before the step; m_i, l_i: after it
    alpha: [rows]         exp(m_prev - m_i), the factor the old l and acc are rescaled by
    acc_rescaled: [rows, d]  acc_prev * alpha;  acc: [rows, d] = acc_rescaled + p v
    out: [rows, d]        O = acc / l_i, only on the block's last step (last=True), else None
    partial: the causal mask hides some of the tile's scores; first: the block's first key tile
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


def key_block_range(q_block, *, n_query, n_key, block_m, causal):
    """The end (exclusive) of the keys that query block q_block visits: all, or up to the causal diagonal."""
    if not causal:
        return n_key
    return max(0, min(min((q_block + 1) * block_m, n_query) + n_key - n_query, n_key))


def tiled_steps(q, k, v, *, causal=False, scale=None, block_m=32, block_n=32) -> Iterator[TileStep]:
    """Yields a TileStep for every (batch, head, query block, key block) the kernel runs, in the kernel's order
    within a program (key blocks left to right), programs by batch, head, then query block.

    q: [batch, head, n_query, d], k and v: [batch, head, n_key, d] (torch or numpy). Computes in float32 (float64
    for float64 input); p is rounded to v's dtype before p v, as the kernel does.
    """
    q, k, v = (torch.as_tensor(x).cpu() for x in (q, k, v))
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    batch, heads, n_query, d = q.shape
    n_key = k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    offset = n_key - n_query
    itemsize = q.element_size()
    index = 0
    for b in range(batch):
        for h in range(heads):
            for start_m in range(0, n_query, block_m):
                offs_m = torch.arange(start_m, min(start_m + block_m, n_query))
                q_tile = q[b, h, offs_m].to(dtype)  # [rows, d]
                m_i = torch.full((len(offs_m),), float("-inf"), dtype=dtype)
                l_i = torch.zeros(len(offs_m), dtype=dtype)
                acc = torch.zeros(len(offs_m), d, dtype=dtype)
                hi = key_block_range(start_m // block_m, n_query=n_query, n_key=n_key, block_m=block_m, causal=causal)
                for start_n in range(0, hi, block_n):
                    cols = torch.arange(start_n, min(start_n + block_n, n_key))
                    # -- compute qk --
                    k_tile = k[b, h, cols].to(dtype)  # [cols, d]
                    qk = (q_tile @ k_tile.T) * scale  # [rows, cols]
                    visible = torch.ones_like(qk, dtype=torch.bool)
                    if causal:
                        visible = cols[None, :] <= offs_m[:, None] + offset
                    qk = torch.where(visible, qk, float("-inf"))
                    m_ij = torch.maximum(m_i, qk.amax(1))
                    m_shift = torch.where(m_ij == float("-inf"), 0.0, m_ij)
                    p = torch.exp(qk - m_shift[:, None])
                    l_ij = p.sum(1)
                    # -- update m_i and l_i --
                    alpha = torch.exp(m_i - m_shift)
                    l_new = l_i * alpha + l_ij
                    # -- update output accumulator --
                    acc_rescaled = acc * alpha[:, None]
                    v_tile = v[b, h, cols]
                    p = p.to(v_tile.dtype)
                    acc_new = acc_rescaled + p.to(dtype) @ v_tile.to(dtype)
                    last = start_n + block_n >= hi
                    out = acc_new / torch.where(l_new == 0, 1.0, l_new)[:, None] if last else None
                    yield TileStep(
                        index=index, batch=b, head=h, q_block=start_m // block_m, k_block=start_n // block_n,
                        q_start=start_m, q_stop=start_m + len(offs_m), k_start=start_n, k_stop=start_n + len(cols),
                        partial=bool((~visible).any()), scores=qk.numpy(), p=p.to(dtype).numpy(),
                        m_prev=m_i.numpy(), l_prev=l_i.numpy(), m_i=m_ij.numpy(), l_i=l_new.numpy(),
                        alpha=alpha.numpy(), acc_rescaled=acc_rescaled.numpy(), acc=acc_new.numpy(),
                        first=start_n == 0, last=last, out=None if out is None else out.numpy(),
                        flops=4 * len(offs_m) * len(cols) * d,
                        bytes_loaded=(2 * len(cols) + (len(offs_m) if start_n == 0 else 0)) * d * itemsize,
                        bytes_stored=len(offs_m) * d * itemsize if last else 0,
                    )
                    index += 1
                    m_i, l_i, acc = m_ij, l_new, acc_new


def online_attention(q, k, v, *, causal=False, scale=None, block_m=32, block_n=32):
    """O assembled from tiled_steps' last step of every query block: the stepper as an attention function.
    Rows that see no key at all get 0. Returns [batch, head, n_query, d] in float32 (float64 for float64 input)."""
    q = torch.as_tensor(q)
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.zeros(q.shape, dtype=dtype)
    for step in tiled_steps(q, k, v, causal=causal, scale=scale, block_m=block_m, block_n=block_n):
        if step.last:
            out[step.batch, step.head, step.q_start:step.q_stop] = torch.from_numpy(step.out)
    return out


def tile_map(n_query, n_key, *, block_m, block_n, causal) -> np.ndarray:
    """[n_query_blocks, n_key_blocks] codes: TILE_SKIPPED (never loaded: wholly hidden by the causal mask),
    TILE_FULL (every score visible) or TILE_PARTIAL (the causal diagonal runs through it)."""
    n_qb, n_kb = -(-n_query // block_m), -(-n_key // block_n)
    codes = np.full((n_qb, n_kb), TILE_FULL, dtype=int)
    if not causal:
        return codes
    offset = n_key - n_query
    for i in range(n_qb):
        q0, q1 = i * block_m, min((i + 1) * block_m, n_query) - 1
        for j in range(n_kb):
            k0, k1 = j * block_n, min((j + 1) * block_n, n_key) - 1
            if k0 > q1 + offset:
                codes[i, j] = TILE_SKIPPED
            elif k1 > q0 + offset:
                codes[i, j] = TILE_PARTIAL
    return codes


def naive_traffic(n_query, n_key, d, itemsize) -> dict:
    """Bytes naive attention moves through main memory: read Q, K; write S = Q K^T; read S, write P = softmax(S);
    read P, V; write O. The [n_query, n_key] matrix is written twice and read twice. Keys "read", "written"."""
    square = n_query * n_key * itemsize
    return {"read": (n_query + 2 * n_key) * d * itemsize + 2 * square,
            "written": n_query * d * itemsize + 2 * square}
