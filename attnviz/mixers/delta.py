"""The exact implicit attention map of a gated delta rule layer (Gated DeltaNet: Qwen3-Next, Qwen3.5).

The layer keeps a state S_t [key dim, value dim] per head and, as transformers' torch_recurrent_gated_delta_rule
does, updates it token by token:

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t,

with alpha_t = exp(g_t), q and k l2-normalised (eps 1e-6 inside the root) where the layer asks for it
(use_qk_l2norm_in_kernel) and q then multiplied by dk^-1/2. Unrolled, the output is linear in the values:

    o_t = sum_{s<=t} w_ts v_s,    w_ts = beta_s k_s^T P_{s+1} ... P_t q_t,    P_r = alpha_r (I - beta_r k_r k_r^T).

w is not a probability: it can be negative and its rows do not sum to 1. The short convolution before the kernel
is part of q, k and v (recorded after it), not of w.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from attnviz.cores import run_each, workers

CHUNK = 128  # with dk = 128 (Qwen3-Next), the earlier keys then cost N^2 dk multiply-adds per head
# Weights under TINY are set to 0 where they would be carried on: far below float32's resolution of any sum they
# enter (w's entries are O(1) at most), and as subnormal floats they make every later product ten to a hundred
# times slower on a CPU. 1e-18, so that the product of two kept numbers is still a normal float32 (over 1.2e-38).
TINY = 1e-18
LOCAL_BATCH = 64  # (head, chunk) pairs whose own work _local batches: [64, 128, 128] float32 stays in cache


def prepared(query, key, g, beta, *, l2norm: bool, dtype=torch.float32, heads: slice = slice(None)):
    """The kernel's own preparation: q, k [head, N, dk] (k heads repeated to the value heads, l2-normalised if
    `l2norm`, q scaled by dk^-1/2), g [head, N] (or [head, N, dk]), beta [head, N]. query, key [N, k heads, dk];
    g [N, value heads], or [N, value heads, dk] for a decay per key channel (Kimi Delta Attention, attnviz.mixers.kda);
    beta [N, value heads]. heads: only these value heads (each value head h reads k head
    h // (value heads / k heads), as the kernel's repeat_interleave)."""
    chosen = torch.arange(beta.shape[-1], device=beta.device)[heads]
    # [head, N, dk], contiguous copies (index_select's result), normalised in place: no second copy at a time
    query, key = (x.transpose(0, 1).index_select(0, chosen // (beta.shape[-1] // x.shape[1])).to(dtype)
                  for x in (query, key))
    g, beta = (x[:, heads].transpose(0, 1).to(dtype) for x in (g, beta))
    if l2norm:
        for x in (query, key):
            x.mul_(torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6))
    return query.mul_(query.shape[-1] ** -0.5), key, g, beta


def delta_rule_map(query, key, g, beta, *, l2norm: bool = True, chunk: int = CHUNK, dtype=torch.float32,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """w [value head, query, key] of a gated delta rule layer, so that o = w @ v per head.

    query, key: [N, k heads, dk] as the kernel receives them; g: [N, value heads], the log decay; beta:
    [N, value heads]. The chunkwise form of Yang et al. (2024) with the values set to the identity. The carried
    state S [dk, key] holds, for every key before the chunk, beta_s times its key vector propagated to the chunk's
    start (S_ts = P_t ... P_{s+1} beta_s k_s); a chunk's rows are then Q_hat S for the earlier keys and M T beta for
    its own, and S moves past the chunk as F S, where, with G the running log decay inside the chunk,
    Gamma_ts = e^(G_t - G_s) (s <= t), A = strictly lower (beta_t Gamma_ts k_t.k_s), T = (I + A)^-1,
    M = lower (Q K^T * Gamma): Q_hat = e^G Q - M T (beta e^G K) and F = e^(G_last) I - (K e^(G_last - G))^T T
    (beta e^G K), the chunk's transition P_last ... P_first in WY form (_chunk). Multiply-adds per head: N^2 (dk +
    dk^2 / chunk) / 2 for the earlier keys, about 6 N chunk dk for the chunks' own, no N^2 dk^2 term. The loop over
    chunks, the memory and the cores: chunked_map (out: where to write w)."""
    return chunked_map(prepared(query, key, g, beta, l2norm=l2norm, dtype=dtype), _chunk, chunk=chunk,
                       l2norm=l2norm, out=out)


def chunked_map(prepared_qkgb, chunk_of, *, chunk: int, l2norm: bool, out: torch.Tensor | None = None):
    """w [head, N, N] of a delta rule's chunkwise form, for the prepared (q, k, g, beta) (prepared) and the
    kind's chunk maths chunk_of (this module's _chunk for a scalar decay, attnviz.mixers.kda's for a decay per key
    channel): the rows of chunked_rows written in place. Keys whose decay since has fallen under TINY (1e-18) get
    weight 0 (see _bury). out: a [head, N, N] tensor of q's dtype to write w into (every entry is written);
    returned. Without it, w is fresh zeroed memory (zeros_for) and only its weights that are not 0 are written. The
    heads are split into a group per core, each run on one core (head_groups, attnviz.cores.run_each): no operator
    forks and joins over the cores, which a busy machine's other threads slow many times over."""
    q, k, g, beta = prepared_qkgb
    heads, n, _ = q.shape
    fresh = out is None
    out = zeros_for((heads, n, n), q.dtype, q.device) if fresh else checked_out(out, (heads, n, n), q.dtype)

    def group(part: slice) -> None:
        w = out[part]
        for a, b, _ in _rows(q[part], k[part], g[part], beta[part], chunk_of, chunk=chunk, l2norm=l2norm,
                             into=lambda a, b: w[:, a:b], zeroed=fresh):
            if not fresh:
                w[:, a:b, b:] = 0

    run_each(group, head_groups(heads))
    return out


def head_groups(heads: int) -> list[slice]:
    """The heads as contiguous groups, one per core that attnviz.cores.run_each runs on (one group without them)."""
    parts = min(workers(), heads)
    return [slice(i * heads // parts, (i + 1) * heads // parts) for i in range(parts)]


def zeros_for(shape, dtype, device) -> torch.Tensor:
    """A fresh zeroed array for a map. On the CPU, numpy's zeros: calloc's pages, zeroed by the kernel when first
    written, and never touched where the map is 0 (above the diagonal, forgotten keys), so a causal map costs about
    half the first-touch work of torch.empty filled in full (which, at 2,048 tokens x 32 heads, took about as long
    as the map's products)."""
    kind = {torch.float32: np.float32, torch.float64: np.float64}.get(dtype)
    if torch.device(device).type != "cpu" or kind is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.from_numpy(np.zeros(shape, dtype=kind))


def checked_out(out: torch.Tensor, shape, dtype) -> torch.Tensor:
    """out, when it is a `dtype` tensor of `shape` (the dense maps' out argument); else a ValueError."""
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype:
        raise ValueError(f"out must be a {dtype} tensor of shape {tuple(shape)}, got {out.dtype} {tuple(out.shape)}")
    return out


def delta_rule_rows(query, key, g, beta, *, l2norm: bool = True, chunk: int = CHUNK, dtype=torch.float32,
                    into=None, heads: slice = slice(None)):
    """The rows of delta_rule_map a chunk at a time, never an N x N array (chunked_rows): yields (a, b, rows), rows
    [value head, b - a, b] the map's rows a .. b - 1 on keys 0 .. b - 1, equal to delta_rule_map(...)[:, a:b, :b]
    (the same products). heads: only these value heads (rows [len, b - a, b])."""
    yield from chunked_rows(prepared(query, key, g, beta, l2norm=l2norm, dtype=dtype, heads=heads), _chunk,
                            chunk=chunk, l2norm=l2norm, into=into)


def chunked_rows(prepared_qkgb, chunk_of, *, chunk: int, l2norm: bool, into=None):
    """The rows of chunked_map(prepared_qkgb, chunk_of, ...) a chunk at a time: yields (a, b, rows), rows
    [head, b - a, b] the map's rows a .. b - 1 on keys 0 .. b - 1 (every later key's weight is 0). into(a, b):
    where to write them, a [head, b - a, >= b] tensor (its first b columns are written); by default one buffer that
    every chunk's rows reuse, so each block is valid until the next is asked for. Memory: the state,
    2 [head, dk, N], and one block."""
    q, k, g, beta = prepared_qkgb
    size, n, _ = q.shape
    if into is None:
        flat = torch.empty(size * min(chunk, n) * n, dtype=q.dtype, device=q.device)
        into = lambda a, b: flat[:size * (b - a) * b].view(size, b - a, b)  # noqa: E731
    yield from _rows(q, k, g, beta, chunk_of, chunk=chunk, l2norm=l2norm, into=into)


def _rows(q, k, g, beta, chunk_of, *, chunk: int, l2norm: bool, into, zeroed: bool = False):
    """(a, b, rows a .. b - 1 on keys 0 .. b - 1) of the map of prepared q, k, g, beta, a chunk at a time, written
    into into(a, b)[:, :, :b] (delta_rule_map's docstring says how; chunk_of: the chunk's maths, chunked_map's);
    zeroed: into's arrays are 0 already, so the forgotten keys' zeros are not written. With a decay per key channel
    (g [head, N, dk]) one entry of a column can fall under TINY while the others do not: the earlier keys' state
    entries under TINY are set to 0 after each transition (_bury sets whole columns only)."""
    heads, n, dk = q.shape
    per_channel = g.dim() == 3
    # [head, dk, key], two buffers: each chunk's products write in place (torch.bmm's out), the state to the other
    state, spare = (torch.zeros(heads, dk, n, dtype=q.dtype, device=q.device) for _ in range(2))
    # [head, N]: the log of a bound on the decay from the first token, the largest channel's (_bury)
    total = (g.amax(-1) if per_channel else g).double().cumsum(-1)
    dead = [0] * heads  # per head, the earlier keys whose state columns are 0 for good
    for a, b, q_hat, own, transition, entering in _local(q, k, g, beta, chunk_of, chunk):
        rows = into(a, b)[:, :, :b]
        rows[:, :, a:b] = own
        live = min(dead)
        if not zeroed:
            rows[:, :, :live] = 0
        if a > live:
            torch.bmm(q_hat, state[:, :, live:a], out=rows[:, :, live:a])
            torch.bmm(transition, state[:, :, live:a], out=spare[:, :, live:a])
            state, spare = spare, state
            if per_channel:
                earlier = state[:, :, live:a]
                earlier.masked_fill_(earlier.abs() <= TINY, 0)
        state[:, :, a:b] = entering
        if l2norm:
            _bury(state, spare, total[:, :b], dead)
        yield a, b, rows


def _local(q, k, g, beta, chunk_of, chunk: int):
    """(a, b, Q_hat, own block, F, entering columns) of each chunk, in order (chunk_of's), computed for
    LOCAL_BATCH // heads chunks at once (one batched product each instead of one per chunk); the text padded to a
    whole number of chunks with zero keys and queries, g = beta = 0, which no real row reads."""
    heads, n, dk = q.shape
    per = max(1, LOCAL_BATCH // heads) * chunk
    for start in range(0, n, per):
        stop = min(n, start + per)
        m, pad = -(-(stop - start) // chunk), -(stop - start) % chunk
        parts = [torch.nn.functional.pad(x[:, start:stop], (0, 0, 0, pad) if x.dim() == 3 else (0, pad))
                 for x in (q, k, g, beta)]
        q_hat, own, transition, entering = (x.view(heads, m, *x.shape[1:]) for x in chunk_of(
            *(x.reshape(heads * m, chunk, *x.shape[2:]) for x in parts)))
        for i in range(m):
            a = start + i * chunk
            size = min(chunk, n - a)
            yield (a, a + size, q_hat[:, i, :size], own[:, i, :size, :size], transition[:, i],
                   entering[:, i, :, :size])


def _bury(state, spare, total, dead: list[int]) -> None:
    """Sets to 0 the state columns of keys whose decay since has fallen under TINY. With unit keys and beta in
    (0, 1), I - beta_r k_r k_r^T is a contraction, so P_r's norm is at most its largest channel's decay (alpha_r for
    a scalar decay), and column s is at most e^(total_now - total_s) in norm: these columns hold nothing a float32
    sum can see, and as subnormal numbers they would slow every later product many times over. total: [head, b],
    the running sum of the log of that bound up to the state's position b - 1."""
    gone = ((total[:, -1:] - total) < math.log(TINY)).sum(-1).tolist()  # a prefix: total only falls
    for head, (before, now) in enumerate(zip(dead, gone)):
        if now > before:
            state[head, :, before:now] = spare[head, :, before:now] = 0
            dead[head] = now


def _chunk(q, k, g, beta):
    """Chunks' Q_hat [batch, C, dk], own blocks of w [batch, C, C], transitions F [batch, dk, dk] and the state
    columns of their own keys at their ends [batch, dk, C]; q, k [batch, C, dk], g, beta [batch, C] (a batch of
    (head, chunk) pairs). Products are written over in place where nothing else reads them."""
    size, dk = q.shape[-2:]
    cum = g.cumsum(-1)  # [batch, C]: G_t, the log decay from the chunk's start to t
    # Gamma: e^(G_t - G_s) on and below the diagonal (tril_ writes 0 over the upper triangle's overflow)
    decay = flushed((cum[:, :, None] - cum[:, None, :]).exp_()).tril_()
    kt = k.transpose(-1, -2)
    strict = torch.bmm(k, kt).mul_(decay).mul_(beta[:, :, None])  # A: Gamma is 0 above the diagonal
    strict.diagonal(dim1=-2, dim2=-1).zero_()
    inverse = unit_lower_inverse(flushed(strict))  # T
    mixed = flushed(torch.bmm(torch.bmm(q, kt).mul_(decay), inverse))  # M T
    grow = exp_flushed_(cum.clone())  # e^G
    k_in = k * (beta * grow)[:, :, None]  # beta e^G K: what the earlier state subtracts
    q_hat = torch.baddbmm(grow[:, :, None] * q, mixed, k_in, alpha=-1)
    # (K e^(G_last - G))^T T
    k_out = torch.bmm((k * exp_flushed_(cum[:, -1:] - cum)[:, :, None]).transpose(-1, -2), inverse)
    eye = torch.eye(dk, dtype=q.dtype, device=q.device)
    transition = torch.baddbmm(exp_flushed_(cum[:, -1, None, None].clone()) * eye, k_out, k_in, alpha=-1)
    return (flushed(q_hat), mixed.mul_(beta[:, None, :]), flushed(transition),
            flushed(k_out.mul_(beta[:, None, :])))


def unit_lower_inverse(a: torch.Tensor) -> torch.Tensor:
    """(I + a)^-1 for a strictly lower triangular a [..., C, C], by batched products only (LAPACK's batched
    triangular solve, and MKL's batched float64 products, are slow and erratic on a CPU at these sizes): halves by
    blocks, [[X11, 0], [-X22 a21 X11, X22]], and below 16 the finite Neumann series (I - a)(I + a^2)(I + a^4)
    (I + a^8) (a^16 = 0). Every product is flushed under TINY, so that no subnormal number enters the next."""
    size = a.shape[-1]
    eye = torch.eye(size, dtype=a.dtype, device=a.device)
    if size <= 16:
        inverse, power = eye - a, flushed(a @ a)
        for _ in range(max(size - 1, 1).bit_length() - 1):
            inverse, power = flushed(inverse @ (eye + power)), flushed(power @ power)
        return inverse
    h = size // 2  # the blocks made contiguous: batched products of strided views take a slow path
    top, bottom = unit_lower_inverse(a[..., :h, :h].contiguous()), unit_lower_inverse(a[..., h:, h:].contiguous())
    inverse = torch.zeros_like(a)
    inverse[..., :h, :h], inverse[..., h:, h:] = top, bottom
    inverse[..., h:, :h] = -flushed(flushed(bottom @ a[..., h:, :h].contiguous()) @ top)
    return inverse


def exp_flushed_(x: torch.Tensor) -> torch.Tensor:
    """exp(x), 0 where it would be under TINY; in place, x returned."""
    return x.masked_fill_(x < math.log(TINY), float("-inf")).exp_()


def flushed(x: torch.Tensor) -> torch.Tensor:
    """x with its entries of magnitude TINY or less set to 0 (one pass: torch's hardshrink)."""
    return torch.nn.functional.hardshrink(x, TINY)


def delta_rule_map_naive(query, key, g, beta, *, l2norm: bool = True) -> torch.Tensor:
    """The same w in float64, straight from the definition: for each query t, u = q_t, and for s = t, t-1, ..., 0
    w_ts = beta_s k_s.u, then u <- P_s u. O(N^2 dk) in Python loops: for tests on a few dozen tokens."""
    q, k, g, beta = prepared(query, key, g, beta, l2norm=l2norm, dtype=torch.float64)
    heads, n, _ = q.shape
    w = torch.zeros(heads, n, n, dtype=torch.float64)
    for h in range(heads):
        for t in range(n):
            u = q[h, t].clone()
            for s in range(t, -1, -1):
                w[h, t, s] = beta[h, s] * (k[h, s] @ u)
                u = g[h, s].exp() * (u - beta[h, s] * k[h, s] * (k[h, s] @ u))
    return w


def apply_map(w: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """o [N, head, dv] = sum_s w[head, t, s] v_s; value [N, head, dv]."""
    return torch.einsum("hts,shd->thd", w, value.to(w.dtype))
