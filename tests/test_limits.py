"""attnviz.kernels.limits: what the Tiled kernel page refuses to run and why (sizes, the Triton interpreter's time
budget, the shared memory a compiled launch needs), each limit worked out by hand."""

from __future__ import annotations

from attnviz.kernels import INTERPRETED, refusal


def test_refusal_accepts_the_default_and_refuses_slow_sizes():
    assert refusal(64, 64, block_m=16, block_n=16, causal=False, dtype="float32") is None
    assert refusal(100_000, 64, block_m=16, block_n=16, causal=False, dtype="float32") is not None
    if INTERPRETED:
        assert "interpreter" in refusal(2048, 64, block_m=16, block_n=16, causal=False, dtype="float32")


H100_SHARED = 227 * 1024  # bytes per block, opt-in, from NVIDIA's H100 tuning guide


def test_refusal_refuses_blocks_that_need_more_shared_memory_than_the_gpu_has():
    # by hand: 3 pipeline stages x (K tile + V tile) x 128 keys x 128 dims x 4 bytes = 393,216 B > 232,448 B
    # (Triton's own sm_90 compile of this kernel reports exactly 393,216 B of shared memory for this case)
    reason = refusal(256, 128, block_m=128, block_n=128, causal=True, dtype="float32", interpreted=False,
                     shared_memory_bytes=H100_SHARED)
    assert reason is not None and "shared memory" in reason and "384 KiB" in reason and "227 KiB" in reason
    # 3 x 2 x 64 x 128 x 4 = 196,608 B fits; float16 halves the tile but adds the Q tile on Hopper:
    # 3 x 2 x 128 x 128 x 2 + 128 x 128 x 2 = 229,376 B, just fits
    assert refusal(256, 128, block_m=128, block_n=64, causal=True, dtype="float32", interpreted=False,
                   shared_memory_bytes=H100_SHARED) is None
    assert refusal(256, 128, block_m=128, block_n=128, causal=True, dtype="float16", interpreted=False,
                   shared_memory_bytes=H100_SHARED) is None
    # head dim 100 is padded to 128 inside the kernel, so it costs what 128 costs
    assert refusal(256, 100, block_m=16, block_n=128, causal=False, dtype="float32", interpreted=False,
                   shared_memory_bytes=H100_SHARED) is not None
    # the interpreter has no shared memory: the same size is not refused for it there
    assert refusal(256, 128, block_m=128, block_n=128, causal=True, dtype="float32", interpreted=True) is None


def test_interpreter_budget_counts_the_tile_size_not_just_the_steps():
    # 2048 / 128 = 16 query blocks x 16 key blocks = 256 steps (full mask). By hand, at 8 ms a step plus 14 ns per
    # 128 x 128 x 128 element: 256 x (0.008 + 14e-9 x 2,097,152) = 256 x 0.03736 = 9.56 s, over the 5 s budget
    reason = refusal(2048, 128, block_m=128, block_n=128, causal=False, dtype="float32", interpreted=True)
    assert reason is not None and "about 10 s" in reason and "interpreter" in reason
    # the same 256 steps with d = 16: 256 x (0.008 + 14e-9 x 262,144) = 256 x 0.01167 = 2.99 s, allowed
    assert refusal(2048, 16, block_m=128, block_n=128, causal=False, dtype="float32", interpreted=True) is None
    # 16 x 16 tiles, d = 16, N = 512: 32 x 32 = 1024 steps x (0.008 + 14e-9 x 4096) = 8.25 s, refused
    assert "about 8 s" in refusal(512, 16, block_m=16, block_n=16, causal=False, dtype="float32", interpreted=True)
