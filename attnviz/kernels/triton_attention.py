"""The FlashAttention-2 forward pass (Dao, 2023, Algorithm 1) as a Triton kernel.

Written in the style of the Triton tutorial 06-fused-attention.py: one program per (query block, batch*head), a loop
over key blocks keeping the running row max m_i, the running row sum l_i and the accumulator acc, with the old state
rescaled by alpha = 2^(m_old - m_new) whenever the max grows. Scores are kept in log2 units (s * log2 e) so the
exponentials are exp2, as in the tutorial; the trace converts m_i back to natural units. As in the tutorial, the loop
runs in two stages: the key blocks that every query of the block sees in full go first, without any mask; the
blocks on the causal diagonal and the ragged last block follow, masked.

Loads and stores are masked, so N need not be a multiple of the block sizes and the head dim is padded to a power
of two. On a machine without CUDA this module must be imported with TRITON_INTERPRET=1 already set (the package
__init__ does it), and before triton.language was first imported without it (else UNAVAILABLE says why not); then
the kernel runs under the Triton interpreter, on the CPU, with numpy. On a GPU the same kernel compiles.
"""

from __future__ import annotations

import contextlib
import math
import threading
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from attnviz.errors import AttnvizError
from attnviz.kernels import interpreted

MAX_HEAD_DIM = 128
# software-pipelining depth on a GPU: K and V tiles for this many key blocks are held in shared memory at once
NUM_STAGES = 3
# (BLOCK_M, BLOCK_N, num_warps, num_stages) launch configs that benchmarks/kernel.py tries at every size on a GPU,
# as the Triton tutorial's autotuner does; the GPU tests check each of them against float64
GPU_LAUNCH_CONFIGS = ((128, 64, 4, 3), (128, 64, 8, 3), (128, 64, 4, 4), (128, 128, 8, 3), (64, 64, 4, 3),
                      (128, 32, 4, 4))


class KernelError(AttnvizError, ValueError):
    """The kernel refuses these inputs or launch settings (a shape, a dtype, blocks that need more shared memory than
    the GPU has); the message says why."""


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q,  #
                    K, V, stride_kn, stride_kk, stride_vn, stride_vk,  #
                    TraceM, TraceL, TraceS, trace_offset,  #
                    lo, hi, qk_scale, N_Q, N_K, causal_offset, WINDOW,  #
                    offs_m, offs_d,  #
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,  #
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr, TRACE: tl.constexpr, PRECISION: tl.constexpr,  #
                    HAS_WINDOW: tl.constexpr):
    """Key blocks lo, lo + BLOCK_N, ... < hi. MASKED=False is the fast path for blocks that lie wholly inside the
    keys, wholly left of the causal diagonal and wholly inside every row's window, so no load and no score needs a
    mask (the tutorial's stage 1); MASKED=True checks every key against N_K, the causal mask and the sliding window
    (the diagonal, the window's left edge and the ragged last block)."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k_ptrs = K + cols[None, :] * stride_kn + offs_d[:, None] * stride_kk
        v_ptrs = V + cols[:, None] * stride_vn + offs_d[None, :] * stride_vk
        # -- compute qk --
        if MASKED:
            k = tl.load(k_ptrs, mask=(cols[None, :] < N_K) & (offs_d[:, None] < HEAD_DIM), other=0.0)
        elif D_PAD != HEAD_DIM:
            k = tl.load(k_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
        else:
            k = tl.load(k_ptrs)
        qk = tl.dot(q, k, input_precision=PRECISION)  # [BLOCK_M, BLOCK_N], q . k
        if MASKED:
            qk = qk * qk_scale  # log2 units
            visible = cols[None, :] < N_K
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None] + causal_offset)
            if HAS_WINDOW:  # only the last WINDOW keys, the query's own included
                visible = visible & (cols[None, :] > offs_m[:, None] + causal_offset - WINDOW)
            qk = tl.where(visible, qk, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            # a row that has seen no visible key yet keeps m = -inf; shifting by 0 then gives p = 0, not NaN
            m_shift = tl.where(m_ij == float("-inf"), 0.0, m_ij)
            p = tl.math.exp2(qk - m_shift[:, None])
        else:
            # every key of the block is visible to every row, so the new max is finite; the scale goes into one
            # fused multiply-add, as in the tutorial (scale > 0, so max(s * x) = s * max(x))
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_shift = m_ij
            p = tl.math.exp2(qk * qk_scale - m_shift[:, None])
        l_ij = tl.sum(p, 1)
        # -- update m_i and l_i --
        alpha = tl.math.exp2(m_i - m_shift)
        l_i = l_i * alpha + l_ij
        # -- update output accumulator --
        acc = acc * alpha[:, None]
        if MASKED:
            v = tl.load(v_ptrs, mask=(cols[:, None] < N_K) & (offs_d[None, :] < HEAD_DIM), other=0.0)
        elif D_PAD != HEAD_DIM:
            v = tl.load(v_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_ij
        if TRACE:
            trace_ptrs = trace_offset + (start_n // BLOCK_N) * BLOCK_M + tl.arange(0, BLOCK_M)
            tl.store(TraceM + trace_ptrs, m_i * 0.6931471805599453, mask=offs_m < N_Q)  # ln 2: back to natural units
            tl.store(TraceL + trace_ptrs, l_i, mask=offs_m < N_Q)
            if MASKED:  # which stage ran this step: 2 masked, 1 not (attnviz.kernels.stages' tile codes)
                stage = tl.full([BLOCK_M], 2.0, tl.float32)
            else:
                stage = tl.full([BLOCK_M], 1.0, tl.float32)
            tl.store(TraceS + trace_ptrs, stage, mask=offs_m < N_Q)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, Out, TraceM, TraceL, TraceS, sm_scale,  #
              stride_qb, stride_qh, stride_qm, stride_qk,  #
              stride_kb, stride_kh, stride_kn, stride_kk,  #
              stride_vb, stride_vh, stride_vn, stride_vk,  #
              stride_ob, stride_oh, stride_om, stride_ok,  #
              H, N_Q, N_K, causal_offset, N_K_BLOCKS, WINDOW,  #
              HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,  #
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,  #
              CAUSAL: tl.constexpr, TRACE: tl.constexpr, PRECISION: tl.constexpr, HAS_WINDOW: tl.constexpr):
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // H
    off_h = off_bh % H
    Q += off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
    K += off_b.to(tl.int64) * stride_kb + off_h.to(tl.int64) * stride_kh
    V += off_b.to(tl.int64) * stride_vb + off_h.to(tl.int64) * stride_vh
    Out += off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
    # initialize offsets
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    # initialize the running max, the running sum and the accumulator
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # 1/ln(2): exp(x) = exp2(x * log2 e)
    # load q: it stays on chip for the whole loop
    q_mask = (offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk, mask=q_mask, other=0.0)
    trace_offset = (off_bh * tl.num_programs(0) + start_m) * N_K_BLOCKS * BLOCK_M
    # Stage 1, no masks: key blocks wholly inside the keys and, when causal, wholly left of the diagonal for every
    # query of this block (key j is visible to query i when j <= i + causal_offset). attnviz.kernels.stages'
    # stage_bounds computes the same mid and hi for the stepper and the tile map; a test holds it to the trace.
    full_blocks = N_K // BLOCK_N
    lo = 0
    left = 0
    if CAUSAL:
        full_blocks = tl.minimum(full_blocks, tl.maximum(start_m * BLOCK_M + causal_offset + 1, 0) // BLOCK_N)
        # key blocks wholly right of the diagonal are never loaded: no query of this block may see them
        hi = tl.maximum(tl.minimum(tl.minimum((start_m + 1) * BLOCK_M, N_Q) + causal_offset, N_K), 0)
        if HAS_WINDOW:
            # nor those wholly left of the first query's window; the blocks the window's edge cuts for some row
            # (left of the first key the last query sees) run masked
            lo = tl.minimum(tl.maximum(start_m * BLOCK_M + causal_offset - WINDOW + 1, 0) // BLOCK_N * BLOCK_N,
                            full_blocks * BLOCK_N)
            edge = tl.maximum(tl.minimum((start_m + 1) * BLOCK_M, N_Q) - 1 + causal_offset - WINDOW + 1, 0)
            left = tl.minimum(tl.maximum((edge + BLOCK_N - 1) // BLOCK_N * BLOCK_N, lo), full_blocks * BLOCK_N)
    else:
        hi = N_K
    mid = full_blocks * BLOCK_N
    # The window's left edge, masked: [lo, left)
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q,  #
                                    K, V, stride_kn, stride_kk, stride_vn, stride_vk,  #
                                    TraceM, TraceL, TraceS, trace_offset,  #
                                    lo, left, qk_scale, N_Q, N_K, causal_offset, WINDOW,  #
                                    offs_m, offs_d,  #
                                    BLOCK_M, BLOCK_N, HEAD_DIM, D_PAD, True, CAUSAL, TRACE, PRECISION, HAS_WINDOW)
    # Stage 1, no masks: [left, mid)
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q,  #
                                    K, V, stride_kn, stride_kk, stride_vn, stride_vk,  #
                                    TraceM, TraceL, TraceS, trace_offset,  #
                                    left, mid, qk_scale, N_Q, N_K, causal_offset, WINDOW,  #
                                    offs_m, offs_d,  #
                                    BLOCK_M, BLOCK_N, HEAD_DIM, D_PAD, False, CAUSAL, TRACE, PRECISION, HAS_WINDOW)
    # Stage 2, masked: the blocks on the causal diagonal and the ragged last block of keys
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q,  #
                                    K, V, stride_kn, stride_kk, stride_vn, stride_vk,  #
                                    TraceM, TraceL, TraceS, trace_offset,  #
                                    mid, hi, qk_scale, N_Q, N_K, causal_offset, WINDOW,  #
                                    offs_m, offs_d,  #
                                    BLOCK_M, BLOCK_N, HEAD_DIM, D_PAD, True, CAUSAL, TRACE, PRECISION, HAS_WINDOW)
    # epilogue: O = acc / l; a row that saw no key at all (l = 0) gets 0, as attnviz.attention gives
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    acc = acc / l_safe[:, None]
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :] * stride_ok, acc.to(Out.dtype.element_ty),
             mask=q_mask)


INTERPRETED = type(_attn_fwd).__name__ == "InterpretedFunction"
# tl.max and tl.sum are triton.language's own @triton.jit functions, decorated when it was first imported: compiled
# ones, if that was before TRITON_INTERPRET was set, which an interpreted kernel cannot call
UNAVAILABLE = None if not INTERPRETED or type(tl.max).__name__ == "InterpretedFunction" else (
    "The Triton kernel cannot run in this process: there is no GPU, so it needs the Triton interpreter, but "
    "triton.language was imported before TRITON_INTERPRET=1 was set (building a transformers model imports it). "
    "Import attnviz.kernels before anything else, or start Python with TRITON_INTERPRET=1.")
if UNAVAILABLE:
    warnings.warn(UNAVAILABLE, RuntimeWarning)
if INTERPRETED:
    interpreted.no_overflow_checks()
    interpreted.builtins_found_once()
KERNEL_DEVICE = torch.device("cpu") if INTERPRETED else torch.device("cuda")
# The interpreter patches triton.language while a kernel runs, so two threads (two app sessions) must take turns,
# whichever of attnviz's kernels each launches (triton_stats takes this lock too).
LAUNCH_LOCK = threading.Lock() if INTERPRETED else contextlib.nullcontext()


@dataclass(frozen=True)
class KernelTrace:
    """The kernel's online-softmax state after every key block, written by the kernel itself.

    m_i: [batch, head, key_block, query]  running max of the scaled scores (natural units, like softmax's input)
    l_i: [batch, head, key_block, query]  running sum of exp(score - m_i)
    stage: [batch, head, key_block, query]  the stage that ran the step: 1 unmasked, 2 masked (TILE_FULL and
           TILE_MASKED of attnviz.kernels.stages)
    NaN where the kernel never ran that (query block, key block) step (key blocks skipped by the causal mask or left
    of a sliding window).
    """

    m_i: np.ndarray
    l_i: np.ndarray
    stage: np.ndarray
    block_m: int
    block_n: int


def flash_attention(q, k, v, *, causal=False, scale=None, block_m=32, block_n=32, trace=False, out=None,
                    num_warps=None, num_stages=None, window=None):
    """softmax(q k^T * scale) v by the fused tiled kernel, never materialising the [n_query, n_key] matrix.

    q: [batch, head, n_query, d], k and v: [batch, head, n_key, d], float16 or float32 (bfloat16 on a GPU only);
    d from 1 to 128. causal: query i sees key j <= i + (n_key - n_query), as attnviz.attention.causal_mask.
    window (with causal): a sliding window, each query sees only its last `window` keys, its own included (as
    transformers' sliding_window_overlay); the key blocks left of every query's window are never loaded.
    scale=None means 1/sqrt(d). block_m, block_n: powers of two, 16 to 256.
    out: optional tensor [batch, head, n_query, d] on the kernel's device to write into (any strides).
    num_warps, num_stages: GPU launch settings (default 4 warps up to d = 64, else 8; NUM_STAGES stages); the
    interpreter ignores them.
    Returns the output [batch, head, n_query, d] on q's device, and a KernelTrace as well when trace=True.
    """
    if UNAVAILABLE:
        raise RuntimeError(UNAVAILABLE)
    _check_inputs(q, k, v, block_m, block_n)
    if window is not None and (not causal or int(window) < 1):
        raise KernelError("a sliding window needs causal=True and at least 1 key")
    home = q.device
    q, k, v = (x.to(KERNEL_DEVICE) for x in (q, k, v))
    batch, heads, n_query, d = q.shape
    n_key = k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    out = _output_for(q, out)
    n_q_blocks, n_k_blocks = triton.cdiv(n_query, block_m), triton.cdiv(n_key, block_n)
    trace_m, trace_l, trace_s = _trace_buffers(q, n_q_blocks, n_k_blocks, block_m, trace)
    grid = (n_q_blocks, batch * heads)
    try:
        with LAUNCH_LOCK:
            _attn_fwd[grid](
                q, k, v, out, trace_m, trace_l, trace_s, scale,  #
                *q.stride(), *k.stride(), *v.stride(), *out.stride(),  #
                heads, n_query, n_key, n_key - n_query, n_k_blocks, int(window or 0),  #
                HEAD_DIM=d, D_PAD=max(16, triton.next_power_of_2(d)),  #
                BLOCK_M=block_m, BLOCK_N=block_n,  #
                CAUSAL=bool(causal), TRACE=bool(trace), HAS_WINDOW=bool(window),
                # float32 in float32 out: without "ieee" a GPU rounds the products to TF32 (~1e-3 error)
                PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                **({} if INTERPRETED else {"num_warps": num_warps or (4 if d <= 64 else 8),
                                           "num_stages": num_stages or NUM_STAGES}),
            )
    except OutOfResources as exc:
        raise KernelError(f"BLOCK_M = {block_m}, BLOCK_N = {block_n} with head dim {d} need more shared memory than "
                         f"this GPU has ({exc}): use smaller blocks") from exc
    result = out.to(home)
    if not trace:
        return result

    def by_query(x):  # [batch, head, q_block, k_block, BLOCK_M] -> [batch, head, k_block, query]
        x = x.permute(0, 1, 3, 2, 4).reshape(batch, heads, n_k_blocks, n_q_blocks * block_m)
        return x[..., :n_query].cpu().numpy()

    return result, KernelTrace(m_i=by_query(trace_m), l_i=by_query(trace_l), stage=by_query(trace_s),
                               block_m=block_m, block_n=block_n)

def _output_for(q, out):
    """`out` checked against q (shape, dtype, device), or a new output like q."""
    if out is None:
        return torch.empty_like(q)
    if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise KernelError(f"out must be a {tuple(q.shape)} {q.dtype} tensor on {q.device}")
    return out


def _trace_buffers(q, n_q_blocks: int, n_k_blocks: int, block_m: int, trace: bool):
    """The kernel's m_i, l_i and stage records per (q block, k block, row) when tracing (NaN where never written),
    else one-element placeholders."""
    if not trace:
        placeholder = torch.empty(1, device=q.device)
        return placeholder, placeholder, placeholder
    trace_m = torch.full((*q.shape[:2], n_q_blocks, n_k_blocks, block_m), float("nan"), device=q.device)
    return trace_m, torch.full_like(trace_m, float("nan")), torch.full_like(trace_m, float("nan"))


def _check_inputs(q, k, v, block_m, block_n):
    """Raises ValueError with what to change when the kernel cannot run on these inputs."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise KernelError(f"{name} must be a 4-d torch tensor [batch, head, n, d]")
    if not (q.dtype == k.dtype == v.dtype):
        raise KernelError(f"q, k and v must share one dtype (got {q.dtype}, {k.dtype}, {v.dtype})")
    if q.dtype not in (torch.float16, torch.float32, torch.bfloat16):
        raise KernelError(f"dtype {q.dtype} is not supported: use float16 or float32")
    if q.dtype == torch.bfloat16 and INTERPRETED:
        raise KernelError("bfloat16 is refused under the Triton interpreter, which computes bfloat16 tl.dot wrongly: "
                         "use float16 or float32 here, or run on a GPU")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise KernelError(f"shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; "
                         "want q [b, h, n_query, d] and k, v [b, h, n_key, d]")
    if min(q.shape) < 1 or k.shape[2] < 1:
        raise KernelError("every dimension must be at least 1")
    if q.shape[3] > MAX_HEAD_DIM:
        raise KernelError(f"head dim {q.shape[3]} is over {MAX_HEAD_DIM}")
    for name, b in (("block_m", block_m), ("block_n", block_n)):
        if not (isinstance(b, int) and 16 <= b <= 256 and b & (b - 1) == 0):
            raise KernelError(f"{name} must be a power of two from 16 to 256 (got {b!r})")
