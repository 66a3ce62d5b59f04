"""Bytes that naive attention and the tiled kernel move through main memory (HBM on a GPU), for one head.

Naive attention writes the [n_query, n_key] scores S = Q K^T, reads them for the softmax, writes P, and reads P for
P V. The tiled kernel (FlashAttention-2, Dao 2023, Algorithm 1) never stores S or P: it reads Q once, each key block
it visits (stages.stage_bounds) once per query block, K and V alike, and writes O once. So tiling moves less only
while the re-reads of K and V cost less than the four trips of the square matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

from .stages import keys_read
from .limits import ITEMSIZE


def naive_traffic(n_query, n_key, d, itemsize) -> dict:
    """Bytes naive attention moves through main memory: read Q, K; write S = Q K^T; read S, write P = softmax(S);
    read P, V; write O. The [n_query, n_key] matrix is written twice and read twice. Keys "read", "written"."""
    square = n_query * n_key * itemsize
    return {"read": (n_query + 2 * n_key) * d * itemsize + 2 * square,
            "written": n_query * d * itemsize + 2 * square}


def tiled_traffic(n_query, n_key, d, itemsize, *, block_m, block_n, causal, window=None) -> dict:
    """Bytes the tiled kernel moves: read Q once and L rows of K and of V (L = stages.keys_read, the keys all query
    blocks load together), write O once. Keys "read", "written", "keys_read" (L)."""
    keys = keys_read(n_query, n_key, block_m=block_m, block_n=block_n, causal=causal, window=window)
    return {"read": (n_query + 2 * keys) * d * itemsize, "written": n_query * d * itemsize, "keys_read": keys}


def break_even_head_dim(n_query, n_key, keys) -> float:
    """The head dim below which tiling moves fewer bytes than naive attention (inf: at any head dim).

    Tiled moves (2 n_query + 2 L) d values, naive (2 n_query + 2 n_key) d + 4 n_query n_key, so tiled < naive
    exactly while 2 (L - n_key) d < 4 n_query n_key, i.e. d < 2 n_query n_key / (L - n_key): 2N² / (L - N) when
    n_query = n_key = N. keys: L of tiled_traffic."""
    return 2 * n_query * n_key / (keys - n_key) if keys > n_key else float("inf")


@dataclass(frozen=True)
class Traffic:
    """Naive against tiled for one head of [n, d] in one dtype. naive, tiled: total bytes moved; naive_read,
    naive_written: naive's split; keys_read: L; break_even: the head dim below which tiled < naive."""

    naive: int
    naive_read: int
    naive_written: int
    tiled: int
    keys_read: int
    break_even: float

    @property
    def tiled_saves(self) -> bool:
        return self.tiled < self.naive


def compare_traffic(n, d, *, block_m, block_n, causal, dtype, window=None) -> Traffic:
    """Naive and tiled traffic of self-attention over n tokens (n_query = n_key = n), dtype "float32", "float16" or
    "bfloat16" (limits.ITEMSIZE bytes a value); window: a sliding window, whose skipped key blocks the tiled kernel
    never reads (naive still moves the whole N x N matrix)."""
    itemsize = ITEMSIZE[dtype]
    naive = naive_traffic(n, n, d, itemsize)
    tiled = tiled_traffic(n, n, d, itemsize, block_m=block_m, block_n=block_n, causal=causal, window=window)
    return Traffic(naive=naive["read"] + naive["written"], naive_read=naive["read"], naive_written=naive["written"],
                   tiled=tiled["read"] + tiled["written"], keys_read=tiled["keys_read"],
                   break_even=break_even_head_dim(n, n, tiled["keys_read"]))
