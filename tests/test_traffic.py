"""attnviz.kernels.traffic: the bytes naive attention and the tiled kernel move, against the tensors naive
attention makes, the stepper's own per-step byte counters, and FlashAttention-2's loop (Dao 2023, Algorithm 1)
counted out by hand; and the head dim below which tiling moves less."""

from __future__ import annotations

import pytest
import torch

from attnviz.kernels import (
    ITEMSIZE, break_even_head_dim, compare_traffic, keys_read, make_inputs, naive_traffic, tiled_steps, tiled_traffic,
)
from tests.kernel_cases import keys_read_by_definition as _keys_read


def test_naive_traffic_by_hand_and_by_the_tensors_naive_attention_makes():
    # Unfused naive attention: S = Q K^T reads Q, K and writes S; softmax reads S and writes P; P V reads P, V and
    # writes O. By hand for N_q = 3, N_k = 5, d = 4, 2-byte values: reads 24 (Q) + 40 (K) + 30 (S) + 30 (P) + 40 (V)
    # = 164 B = (N_q + 2 N_k) d b + 2 N_q N_k b; writes 30 (S) + 30 (P) + 24 (O) = 84 B = N_q d b + 2 N_q N_k b.
    assert naive_traffic(3, 5, 4, 2) == {"read": 164, "written": 84}
    # the same from the nbytes of the tensors each step of naive attention reads and writes
    q, k, v = torch.randn(1, 1, 37, 16), torch.randn(1, 1, 53, 16), torch.randn(1, 1, 53, 16)
    s = q @ k.transpose(-2, -1)
    p = torch.softmax(s, dim=-1)
    o = p @ v
    reads = q.nbytes + k.nbytes + s.nbytes + p.nbytes + v.nbytes
    writes = s.nbytes + p.nbytes + o.nbytes
    assert naive_traffic(37, 53, 16, 4) == {"read": reads, "written": writes}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n", [64, 256])
@pytest.mark.parametrize("block", [16, 32])
def test_tiled_traffic_is_flashattention_2s_loop_counted_by_hand(n, block, causal):
    # Algorithm 1 with N divisible by the blocks (B_r = B_c = block, T = N / block blocks each way): every query
    # block i loads Q_i once and writes O_i once, and loads K_j and V_j for each key block it visits: all T of them,
    # or with the causal mask blocks 0..i, i + 1 of them. Reads N d + 2 d block (T^2, or T (T + 1) / 2) values.
    d, t = 32, n // block
    blocks_visited = t * (t + 1) // 2 if causal else t * t
    for dtype, itemsize in (("float32", 4), ("float16", 2)):
        assert ITEMSIZE[dtype] == itemsize
        reads = (n * d + 2 * d * block * blocks_visited) * itemsize
        traffic = tiled_traffic(n, n, d, itemsize, block_m=block, block_n=block, causal=causal)
        assert traffic == {"read": reads, "written": n * d * itemsize, "keys_read": block * blocks_visited}


@pytest.mark.parametrize("causal", [True, False])
def test_tiling_moves_less_than_naive_exactly_below_the_stated_head_dim(causal):
    """The Kernel page's rule: tiled moves (2N + 2L)·d values (Q, O once; K, V per query block), naive
    4N·d + 4N² (Q, K, V, O and the N x N matrix written and read twice), so tiled < naive iff d < 2N²/(L − N).
    Checked against the stepper's own byte counters, naive_traffic, and the comparison made value by value."""
    outcomes = set()
    for n, block_m, block_n in [(1, 16, 16), (16, 16, 16), (40, 16, 32), (100, 16, 16), (130, 32, 16), (97, 64, 128)]:
        keys = _keys_read(n, block_m, block_n, causal)
        assert keys_read(n, n, block_m=block_m, block_n=block_n, causal=causal) == keys
        for d in (8, 32, 48, 64, 80, 128):
            q, k, v = make_inputs(n, d, dtype="float32", seed=0)
            steps = list(tiled_steps(q, k, v, causal=causal, block_m=block_m, block_n=block_n))
            assert sum(s.k_stop - s.k_start for s in steps) == keys
            tiled = sum(s.bytes_loaded + s.bytes_stored for s in steps)
            assert tiled == (2 * n + 2 * keys) * d * 4
            naive = naive_traffic(n, n, d, 4)
            assert naive["read"] + naive["written"] == (4 * n * d + 4 * n * n) * 4
            saves = keys <= n or d < 2 * n * n / (keys - n)
            assert (tiled < naive["read"] + naive["written"]) == saves, (n, d, block_m, block_n)
            traffic = compare_traffic(n, d, block_m=block_m, block_n=block_n, causal=causal, dtype="float32")
            assert (traffic.tiled, traffic.naive, traffic.keys_read) == (tiled, naive["read"] + naive["written"], keys)
            assert traffic.tiled_saves == saves == (d < traffic.break_even)
            outcomes.add(saves)
    assert outcomes == {True, False}  # the grid holds settings on both sides of the rule


def test_break_even_head_dim_with_more_keys_than_queries():
    # n_query = 10, n_key = 30, L = 50: tiled (20 + 100) d, naive (20 + 60) d + 1200: equal at 40 d = 1200, d = 30
    assert break_even_head_dim(10, 30, 50) == 30
    assert break_even_head_dim(10, 30, 30) == float("inf")  # each key read once: tiling always moves less
