"""Every head's statistics (attnviz.stats) from the FlashAttention-2 forward pass itself: the host side of the Triton
kernels in triton_stats_jit (whose docstring gives the identities they carry), what stats.streamed_stats hands a
layer to on CUDA: the inputs prepared on the kernel's device, the launches, the rows averaged as streamed_stats
averages them, and the refusals (Unsupported) that send a layer to the torch path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import triton

from attnviz.errors import AttnvizError
from attnviz.pooling import MIN_REMAINING, pool_edges

from .triton_attention import INTERPRETED, KERNEL_DEVICE, LAUNCH_LOCK, UNAVAILABLE
from .triton_stats_jit import pool_fwd, stats_fwd

MAX_HEAD_DIM = 256
# stats_on_device uses the kernel only while this is True: on by default (it runs only on CUDA), off with
# ATTNVIZ_STATS_KERNEL=0 at start. The GPU tests (pytest -m gpu tests/test_triton_stats.py) switch it on and off to
# compare the two paths.
USE_KERNEL = os.environ.get("ATTNVIZ_STATS_KERNEL", "1") != "0"
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# per-row outputs of stats_fwd, in this order
ROW_FIELDS = ("entropy", "distance", "p0", "self", "prev", "induction", "mass", "lse2", "kept")


class Unsupported(AttnvizError, ValueError):
    """The kernel cannot compute these inputs' statistics (an explicit mask, a head dim over MAX_HEAD_DIM, no
    usable Triton backend): the caller uses attnviz.stats.streamed_stats instead."""


def _refusal(inputs, dtype) -> str | None:
    """Why the kernel cannot compute these inputs' statistics, or None."""
    if UNAVAILABLE:
        return UNAVAILABLE
    if inputs.mask.kind == "explicit":
        return "an explicit-bit mask (padding, or a mask no rule names) is computed by the torch path"
    if inputs.mask.chunk and not inputs.mask.causal or inputs.mask.window and not inputs.mask.causal:
        return "a window or chunk without the causal rule is computed by the torch path"
    if inputs.head_dim > MAX_HEAD_DIM:
        return f"head dim {inputs.head_dim} is over {MAX_HEAD_DIM}"
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"dtype {dtype} is not supported: use float16, bfloat16 or float32"
    if dtype == torch.bfloat16 and INTERPRETED:
        return "bfloat16 is refused under the Triton interpreter, which computes bfloat16 tl.dot wrongly"
    return None


def _token_arrays(token_ids, n_query: int, n_key: int):
    """(ids of the queries int32 [n_query], the token before each key int32 [n_key] (-1 for key 0), which queries
    have an induction target bool [n_query]), or None when there is no induction statistic (no token ids, or keys
    that are not the queries' own tokens)."""
    if token_ids is None or n_key != n_query:
        return None
    ids = np.asarray(token_ids, dtype=np.int64)
    before = np.concatenate([[-1], ids[:-1]])
    _, first = np.unique(ids, return_index=True)
    first_seen = first[np.searchsorted(np.unique(ids), ids)]  # where each query's token first occurred
    with_targets = first_seen + 1 < np.arange(len(ids))  # an earlier copy at j with j + 1 < q
    return ids.astype(np.int32), before.astype(np.int32), with_targets


def kernel_stats(inputs, token_ids=None, *, block_m: int = 64, block_n: int = 64, pool: int | None = None,
                 values: torch.Tensor | None = None, dtype: torch.dtype | None = None, trace: bool = False,
                 num_warps: int | None = None, num_stages: int | None = None, overview: int | None = None) -> dict:
    """stats.streamed_stats(inputs, token_ids, pool=pool, values=values, overview=overview) by the Triton kernel:
    the same per-head columns (numpy [head], float64: entropy, sink_mass, mean_distance, prev_token, self,
    induction, and learned_sink for a model with sink logits), "_pooled" / "_pooled_nosink" with pool,
    "_overview" / "_overview_nosink" (float16) and "_kept" with overview (each a pooled pass of its own, pool_fwd),
    "_output" [head, n, d_v] float32 (on the kernel's device) with values.

    inputs: an attnviz.attention.LayerInputs, on any device (moved to the kernel's). dtype: what q, k and v are
    cast to for the kernel (default: q's own; float32 runs with exact float32 products, 16-bit types on tensor
    cores). block_m, block_n: powers of two, 16 to 256. num_warps, num_stages: GPU launch settings (the
    interpreter ignores them). trace: also return "_visits" [head, query block], the key tiles each program
    visited (counted by the kernel). Raises Unsupported for what the kernel cannot do."""
    launch = prepare_stats(inputs, token_ids, block_m=block_m, block_n=block_n, values=values, dtype=dtype,
                           num_warps=num_warps, num_stages=num_stages)
    launch.run()
    return launch.result(pool=pool, trace=trace, overview=overview)


@dataclass
class StatsLaunch:
    """One layer's statistics pass, its tensors prepared on the kernel's device: run() launches stats_fwd alone
    (what benchmarks/gpu_stats.py times against the plain kernel), result() averages its rows (and runs the pooled
    pass)."""

    inputs: object
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor | None
    bias: torch.Tensor | None
    sink: torch.Tensor | None
    kv_of: torch.Tensor
    tokens: tuple | None
    token_tensors: tuple
    rows: torch.Tensor
    visits: torch.Tensor
    out: torch.Tensor
    common: dict
    shape_args: tuple

    def run(self):
        """Launches the first pass: rows, visits and (with values) out are written."""
        v, bias, sink, dummy = self.v, self.bias, self.sink, self.rows  # dummy: a pointer never read
        d_v = v.shape[-1] if v is not None else 1
        grid = (self.visits.shape[1], self.q.shape[0])
        with LAUNCH_LOCK:
            stats_fwd[grid](
                self.q, self.k, v if v is not None else dummy, self.out, bias if bias is not None else dummy,
                sink if sink is not None else dummy, self.kv_of, *self.token_tensors, self.rows, self.visits,
                float(self.inputs.scaling), float(self.inputs.softcap or 1.0),
                *self.q.stride(), *self.k.stride(), *(v.stride() if v is not None else (0, 0, 0)),
                *(self.out.stride() if v is not None else (0, 0, 0)), bias.stride(0) if bias is not None else 0,
                *self.shape_args, V_DIM=d_v, DV_PAD=max(16, triton.next_power_of_2(d_v)), HAS_SINK=sink is not None,
                HAS_V=v is not None, INDUCTION=self.tokens is not None,
                ALIGNED=bool(self.inputs.mask.causal) and self.shape_args[2] == 0, **self.common)

    def result(self, *, pool: int | None = None, trace: bool = False, overview: int | None = None) -> dict:
        """kernel_stats' dictionary from the rows run() wrote."""
        result = _row_means(self.rows, self.tokens, self.sink is not None)
        scalars = (float(self.inputs.scaling), float(self.inputs.softcap or 1.0))
        for name, size in (("_pooled", pool), ("_overview", overview)):
            if size:
                plain, off = _pooled(self.q, self.k, self.bias, self.kv_of, self.rows, scalars, self.shape_args,
                                     size, self.common)
                kind = np.float16 if name == "_overview" else np.float32  # as streamed_stats stores them
                result[name], result[name + "_nosink"] = plain.astype(kind), off.astype(kind)
        if overview:  # each row's weight off token 0 (views.mass_off_sink)
            result["_kept"] = self.rows[:, ROW_FIELDS.index("kept")].cpu().numpy()
        if self.v is not None:
            result["_output"] = self.out
        if trace:
            result["_visits"] = self.visits.cpu().numpy()
        return result


def prepare_stats(inputs, token_ids=None, *, block_m: int = 64, block_n: int = 64,
                  values: torch.Tensor | None = None, dtype: torch.dtype | None = None,
                  num_warps: int | None = None, num_stages: int | None = None) -> StatsLaunch:
    """A StatsLaunch for kernel_stats' arguments (which see), after its checks."""
    dtype = inputs.q.dtype if dtype is None else dtype
    reason = _refusal(inputs, dtype)
    if reason:
        raise Unsupported(reason)
    for name, b in (("block_m", block_m), ("block_n", block_n)):
        if not (isinstance(b, int) and 16 <= b <= 256 and b & (b - 1) == 0):
            raise ValueError(f"{name} must be a power of two from 16 to 256 (got {b!r})")
    device = KERNEL_DEVICE
    n, n_key, n_heads, d = inputs.n_query, inputs.n_key, inputs.n_heads, inputs.head_dim
    v = None if values is None else values.to(device=device, dtype=dtype).contiguous()
    bias = None if inputs.key_bias is None else (inputs.key_bias.to(device, torch.float32) * LOG2E).contiguous()
    tokens = _token_arrays(token_ids, n, n_key)
    rows = torch.empty(n_heads, len(ROW_FIELDS), n, dtype=torch.float32, device=device)
    mask = inputs.mask
    common = dict(HEAD_DIM=d, D_PAD=max(16, triton.next_power_of_2(d)), BLOCK_M=block_m, BLOCK_N=block_n,
                  CAUSAL=bool(mask.causal), HAS_WINDOW=bool(mask.window), HAS_CHUNK=bool(mask.chunk),
                  HAS_SOFTCAP=bool(inputs.softcap), HAS_BIAS=bias is not None,
                  PRECISION="ieee" if dtype == torch.float32 else "tf32",
                  **({} if INTERPRETED else {"num_warps": num_warps or (4 if d <= 64 else 8),
                                             "num_stages": num_stages or (3 if d <= 128 else 2)}))
    return StatsLaunch(
        inputs=inputs, q=inputs.q.to(device=device, dtype=dtype).contiguous(),
        k=inputs.k.to(device=device, dtype=dtype).contiguous(), v=v, bias=bias,
        sink=None if inputs.sink is None else inputs.sink.to(device, torch.float32).contiguous(),
        kv_of=torch.tensor(list(inputs.kv_head_of), dtype=torch.int32, device=device), tokens=tokens,
        token_tensors=(tuple(torch.from_numpy(x).to(device) for x in tokens[:2]) if tokens is not None
                       else (torch.zeros(1, dtype=torch.int32, device=device),) * 2),
        rows=rows, visits=torch.zeros(n_heads, triton.cdiv(n, block_m), dtype=torch.int32, device=device),
        out=torch.empty(n_heads, n, v.shape[-1], dtype=torch.float32, device=device) if v is not None else rows,
        common=common, shape_args=(n, n_key, n_key - n, int(mask.window or 0), int(mask.chunk or 1)))


def _row_means(rows: torch.Tensor, tokens, with_sink: bool) -> dict:
    """The per-head statistics from the kernel's per-row numbers [head, field, n], averaged over the rows each
    definition names (attnviz.stats's module docstring), in float64."""
    r = rows.double()
    n_heads, n = r.shape[0], r.shape[-1]
    field = {name: r[:, i] for i, name in enumerate(ROW_FIELDS)}
    nan = torch.full((n_heads,), float("nan"), dtype=torch.float64, device=r.device)
    out = {
        "entropy": field["entropy"].mean(-1),
        "sink_mass": field["p0"][:, 1:].mean(-1) if n > 1 else nan,
        "mean_distance": field["distance"].mean(-1),
        "prev_token": field["prev"][:, 1:].mean(-1) if n > 1 else nan,
        "self": field["self"].mean(-1),
        "induction": nan,
    }
    if tokens is not None and tokens[2].any():
        with_targets = torch.from_numpy(tokens[2]).to(r.device)
        out["induction"] = field["induction"][:, with_targets].mean(-1)
    if with_sink:
        out["learned_sink"] = (1.0 - field["mass"]).mean(-1)
    return {name: x.cpu().numpy() for name, x in out.items()}


def _pooled(q, k, bias, kv_of, rows, scalars, shape_args, pool: int, common: dict):
    """(_pooled, _pooled_nosink) as streamed_stats gives them, by the second pass pool_fwd from the first pass's
    per-row log2 normalisers: a weight is 2^(t - lse), with the sink hidden 2^(t - lse) / kept where kept = the
    row's weight on keys other than key 0; rows keeping under MIN_REMAINING are blank (NaN where a pooling row
    block has no other row)."""
    n, n_key = shape_args[:2]
    device, n_heads = q.device, q.shape[0]
    row_edges, key_edges = pool_edges(n, pool), pool_edges(n_key, pool)
    n_r, n_c = len(row_edges) - 1, len(key_edges) - 1
    row_bin = torch.from_numpy(np.searchsorted(row_edges, np.arange(n), side="right") - 1).to(device, torch.int32)
    key_bin = torch.from_numpy(np.searchsorted(key_edges, np.arange(n_key), side="right") - 1).to(device,
                                                                                                    torch.int32)
    lse = rows[:, ROW_FIELDS.index("lse2")].contiguous()
    kept = rows[:, ROW_FIELDS.index("kept")]  # the weight on keys other than key 0, summed apart
    blank = kept < MIN_REMAINING
    lse_off = torch.where(blank, torch.full_like(lse, float("inf")), lse + torch.log2(kept.clamp_min(1e-38)))
    pooled = torch.full((n_heads, n_r, n_c), float("-inf"), dtype=torch.float32, device=device)
    pooled_off = torch.full_like(pooled, float("-inf"))
    with LAUNCH_LOCK:
        pool_fwd[(triton.cdiv(n, common["BLOCK_M"]), n_heads)](
            q, k, bias if bias is not None else lse, kv_of, lse, lse_off.contiguous(), row_bin, key_bin, pooled,
            pooled_off, *scalars, *q.stride(), *k.stride(), bias.stride(0) if bias is not None else 0,
            *shape_args, n_r, n_c, **common)
    # a pooling row block whose every row is blank (sink hidden) is NaN, as pooled_heads(hide_sink=True) gives
    all_blank = torch.stack([blank[:, int(a):int(b)].all(-1) for a, b in zip(row_edges[:-1], row_edges[1:])], -1)
    pooled_off = torch.where(all_blank[..., None], torch.full_like(pooled_off, float("nan")),
                             torch.exp2(pooled_off))
    return torch.exp2(pooled).cpu().numpy(), pooled_off.cpu().numpy()


def kernel_runs() -> bool:
    """Whether stats_on_device computes (USE_KERNEL on, a CUDA GPU, Triton compiling for it) rather than leaving
    the statistics to the torch path."""
    return USE_KERNEL and not INTERPRETED and torch.cuda.is_available()


def stats_on_device(inputs, token_ids=None, *, pool: int | None = None, values: torch.Tensor | None = None,
                    dtype: torch.dtype | None = None, overview: int | None = None) -> dict | None:
    """streamed_stats' result computed by the Triton kernel on a CUDA GPU, or None where the torch path must run:
    no CUDA (the interpreter is for tests, not for speed), USE_KERNEL off, or inputs the kernel refuses (kernel_stats'
    Unsupported). stats.streamed_stats calls it first when CUDA is available. The "_output" it returns stays on
    the GPU, where the model's forward pass wants it."""
    if not kernel_runs():
        return None
    if _refusal(inputs, inputs.q.dtype if dtype is None else dtype):
        return None
    block_m, block_n = (64, 64) if inputs.head_dim <= 64 else (64, 32)
    return kernel_stats(inputs, token_ids, pool=pool, values=values, dtype=dtype, block_m=block_m, block_n=block_n,
                        overview=overview)
