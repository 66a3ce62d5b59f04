"""attnviz.kernels.triton_stats: every head's statistics from the Triton kernel, against a float64 dense reference
computed here from q and k (the masked softmax, then the definitions of attnviz.stats's module docstring) and
against stats.streamed_stats on the same inputs, for each mask rule, the learned sink, soft-cap, ALiBi bias and GQA;
the key tiles the kernel visits against what the rule allows; its refusals; the ahead-of-time compile for CUDA
targets; and the GPU-only checks (marked gpu, skipped without CUDA)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from attnviz.attention import LayerInputs, MaskRule
from attnviz.kernels import triton_stats
from attnviz.kernels.triton_stats import Unsupported, kernel_stats, stats_on_device
from attnviz.pooling import MIN_REMAINING, pool_edges
from attnviz.stats import streamed_stats
from tests.kernel_cases import needs_gpu

COLUMNS = ("entropy", "sink_mass", "mean_distance", "prev_token", "self", "induction")
# float32 kernel against float64: per-row sums in float32 over at most a few hundred keys
TOLERANCE = 2e-5


def make_inputs(n, *, d=16, heads=4, kv=2, mask=None, softcap=None, bias=False, sink=False, n_key=None, seed=0,
                scale=1.0, vocab=6):
    """Seeded q, k, v (GQA: heads query heads on kv KV heads), a token text with repeats (small vocabulary)."""
    g = torch.Generator().manual_seed(seed)
    n_key = n if n_key is None else n_key
    q = torch.randn(heads, n, d, generator=g) * scale
    k = torch.randn(kv, n_key, d, generator=g) * scale
    v = torch.randn(kv, n_key, d, generator=g)
    ids = torch.randint(0, vocab, (n,), generator=g).tolist()
    key_bias = None
    if bias:  # ALiBi: slope_h * key position, as BLOOM's
        slopes = torch.tensor([2.0 ** (-(h + 1)) for h in range(heads)])
        key_bias = slopes[:, None] * torch.arange(n_key, dtype=torch.float32)[None, :]
    inputs = LayerInputs(q=q, k=k, kv_head_of=tuple(h * kv // heads for h in range(heads)), scaling=d ** -0.5,
                         mask=mask or MaskRule(n, n_key, causal=True), softcap=softcap, key_bias=key_bias,
                         sink=torch.linspace(-1.0, 2.0, heads) if sink else None)
    return inputs, v, ids


def visible_matrix(rule: MaskRule) -> np.ndarray:
    """[n_query, n_key] bool from the rule's definition (queries aligned to the last keys)."""
    pos = np.arange(rule.n_query)[:, None] + rule.n_key - rule.n_query
    keys = np.arange(rule.n_key)[None, :]
    visible = np.ones((rule.n_query, rule.n_key), dtype=bool)
    if rule.causal:
        visible &= keys <= pos
    if rule.window:
        visible &= keys > pos - rule.window
    if rule.chunk:
        visible &= keys // rule.chunk == pos // rule.chunk
    return visible


def dense_reference(inputs: LayerInputs, values, ids, pool=None) -> dict:
    """The statistics from the full float64 pattern, by their definitions."""
    q, k = inputs.q.double().numpy(), inputs.k.double().numpy()[list(inputs.kv_head_of)]
    s = np.einsum("hqd,hkd->hqk", q, k) * inputs.scaling
    if inputs.softcap:
        s = inputs.softcap * np.tanh(s / inputs.softcap)
    if inputs.key_bias is not None:
        s = s + inputs.key_bias.double().numpy()[:, None, :]
    s = np.where(visible_matrix(inputs.mask), s, -np.inf)
    m = s.max(-1)
    if inputs.sink is not None:
        m = np.maximum(m, inputs.sink.double().numpy()[:, None])
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m[..., None])
    total = e.sum(-1) + (np.exp(inputs.sink.double().numpy()[:, None] - m) if inputs.sink is not None else 0.0)
    p = e / np.where(total > 0, total, 1.0)[..., None]  # [head, query, key]
    n, n_key = p.shape[1:]
    rows = np.arange(n)
    logs = np.log(p, out=np.zeros_like(p), where=p > 0)
    padded = np.concatenate([p, np.zeros((*p.shape[:2], n + 1))], -1)  # key q of a query past the last key: 0
    out = {
        "entropy": -(p * logs).sum(-1).mean(-1),
        "sink_mass": p[:, 1:, 0].mean(-1),
        "mean_distance": (p * np.abs(rows[:, None] - np.arange(n_key)[None, :])).sum(-1).mean(-1),
        "prev_token": padded[:, rows[1:], rows[1:] - 1].mean(-1),
        "self": padded[:, rows, rows].mean(-1),
    }
    targets = [{j + 1 for j in range(q_) if ids[j] == ids[q_] and j + 1 < q_} for q_ in range(n)]
    with_targets = [q_ for q_ in range(n) if targets[q_]] if n == n_key else []
    out["induction"] = (np.mean([[p[h, q_, sorted(targets[q_])].sum() for q_ in with_targets]
                                 for h in range(p.shape[0])], -1) if with_targets else np.full(p.shape[0], np.nan))
    if inputs.sink is not None:
        out["learned_sink"] = (1.0 - p.sum(-1)).mean(-1)
    if values is not None:
        out["_output"] = p @ values.double().numpy()[list(inputs.kv_head_of)]
    if pool:
        out["_pooled"] = max_pool(p, pool)
        kept = p.sum(-1) - p[..., 0]
        hidden = p.copy()
        hidden[..., 0] = 0.0
        with np.errstate(invalid="ignore", divide="ignore"):
            hidden = np.where((kept >= MIN_REMAINING)[..., None], hidden / kept[..., None], np.nan)
        out["_pooled_nosink"] = max_pool(hidden, pool)
    return out


def max_pool(p: np.ndarray, size: int) -> np.ndarray:
    """[head, m, m]: the largest weight of each pooling block (NaN rows ignored; NaN when all its rows are)."""
    r, c = pool_edges(p.shape[1], size), pool_edges(p.shape[2], size)
    out = np.full((p.shape[0], len(r) - 1, len(c) - 1), np.nan)
    for i in range(len(r) - 1):
        for j in range(len(c) - 1):
            cell = p[:, r[i]:r[i + 1], c[j]:c[j + 1]].reshape(p.shape[0], -1)
            keep = ~np.isnan(cell).all(-1)
            out[keep, i, j] = np.nanmax(cell[keep], -1)
    return out


def assert_close(got: dict, want: dict, tolerance: float, names=None):
    for name in names or want:
        a, b = np.asarray(got[name], dtype=np.float64), np.asarray(want[name], dtype=np.float64)
        assert a.shape == b.shape, name
        assert np.array_equal(np.isnan(a), np.isnan(b)), name
        if np.isnan(b).all():
            continue
        scale = max(1.0, float(np.nanmax(np.abs(b)))) if name == "mean_distance" else 1.0  # in tokens: relative
        assert np.nanmax(np.abs(a - b)) <= tolerance * scale, (name, np.nanmax(np.abs(a - b)))


def expected_visits(rule: MaskRule, block_m: int, block_n: int) -> np.ndarray:
    """Key tiles each query block must visit: every tile holding a key some row of the block may see, from the
    rule's definition (visible_matrix), and no other."""
    visible = visible_matrix(rule)
    out = []
    for a in range(0, rule.n_query, block_m):
        seen = np.nonzero(visible[a:a + block_m].any(0))[0]
        out.append(0 if not len(seen) else seen[-1] // block_n - seen[0] // block_n + 1)
    return np.array(out)


CASES = {
    "causal": dict(n=80),
    "sliding": dict(n=80, mask=MaskRule(80, 80, causal=True, window=20)),
    "chunked": dict(n=72, mask=MaskRule(72, 72, causal=True, chunk=24)),
    "full": dict(n=50, mask=MaskRule(50, 50, causal=False)),
    "sink": dict(n=64, sink=True),
    "softcap-window": dict(n=70, softcap=2.0, scale=2.0, mask=MaskRule(70, 70, causal=True, window=33)),
    "alibi": dict(n=60, bias=True),
    "mha-softcap-sink": dict(n=45, heads=2, kv=2, softcap=5.0, sink=True),
    "mqa-more-keys": dict(n=40, n_key=70, heads=3, kv=1, mask=MaskRule(40, 70, causal=True)),
    # the first 20 queries see no key at all
    "fewer-keys-window": dict(n=60, n_key=40, heads=2, kv=1, mask=MaskRule(60, 40, causal=True, window=9)),
}


@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel_matches_float64_and_the_streamed_pass(case):
    inputs, values, ids = make_inputs(**CASES[case], seed=len(case))
    pool = 8
    got = kernel_stats(inputs, ids, block_m=16, block_n=16, pool=pool, values=values, trace=True)
    want = dense_reference(inputs, values, ids, pool=pool)
    names = [*COLUMNS, "_pooled", "_pooled_nosink"] + (["learned_sink"] if inputs.sink is not None else [])
    assert set(got) == {*names, "_output", "_visits"}
    if inputs.n_key == inputs.n_query:
        assert not np.isnan(want["induction"]).any(), "no query with an induction target: vacuous"
    assert_close(got, want, TOLERANCE, names)
    assert np.abs(got["_output"].double().cpu().numpy() - want["_output"]).max() < 1e-5
    streamed = streamed_stats(inputs, ids, pool=pool, values=values)
    # with keys that are not the queries' own tokens (n_key != n_query) the kernel leaves induction undefined (NaN)
    # where streamed_stats reports 0
    skip = {"_output"} | ({"induction"} if inputs.n_key != inputs.n_query else set())
    assert_close(got, streamed, TOLERANCE, [n for n in streamed if n not in skip])
    assert (got["_visits"] == expected_visits(inputs.mask, 16, 16)[None, :]).all()


def test_sliding_window_skips_the_tiles_left_of_every_window():
    # n = 96, window 20, tiles 16 x 16: the last query block sees keys 61 .. 95, tiles 3 .. 5 of 6
    inputs, _, ids = make_inputs(96, heads=2, kv=1, mask=MaskRule(96, 96, causal=True, window=20))
    got = kernel_stats(inputs, ids, block_m=16, block_n=16, trace=True)
    visits = got["_visits"]
    assert visits[0].tolist() == [1, 2, 3, 3, 3, 3] == expected_visits(inputs.mask, 16, 16).tolist()
    causal_tiles = np.arange(1, 7)  # what the causal rule alone would read
    assert visits.sum() < len(visits) * causal_tiles.sum()
    assert_close(got, dense_reference(inputs, None, ids), TOLERANCE, COLUMNS)


@pytest.mark.parametrize("block_m,block_n,pool", [(16, 32, 6), (32, 16, 2), (16, 16, 3)])
def test_other_block_shapes_and_pooling_blocks_wider_than_a_tile(block_m, block_n, pool):
    # pool 2 and 3: pooling blocks of 25 and 37 keys, wider than every tile, so pool_fwd's 2 x 2 path runs
    inputs, _, ids = make_inputs(75, heads=2, kv=1, mask=MaskRule(75, 75, causal=True, window=40), sink=True)
    got = kernel_stats(inputs, ids, block_m=block_m, block_n=block_n, pool=pool, trace=True)
    assert_close(got, dense_reference(inputs, None, ids, pool=pool), TOLERANCE,
                 [*COLUMNS, "learned_sink", "_pooled", "_pooled_nosink"])
    assert (got["_visits"] == expected_visits(inputs.mask, block_m, block_n)[None, :]).all()


@pytest.mark.parametrize("case", ["sink-window", "softcap-sink"])
def test_the_overview_equals_the_streamed_pass(case):
    """overview= (the Heads page's One head overview, pooled in the same pass from 16,384 tokens): two pooled
    passes, 8 pixels (blocks wider than a tile) and 40 (narrower), "_kept" each row's weight off token 0."""
    shape = {"sink-window": dict(mask=MaskRule(75, 75, causal=True, window=30), sink=True),
             "softcap-sink": dict(softcap=5.0, sink=True, heads=2, kv=2)}[case]
    inputs, values, ids = make_inputs(75, **shape)
    for overview in (8, 40):
        got = kernel_stats(inputs, ids, block_m=16, block_n=16, pool=3, values=values, overview=overview)
        want = streamed_stats(inputs, ids, pool=3, values=values, overview=overview)
        assert set(got) == set(want)
        assert got["_overview"].dtype == want["_overview"].dtype == np.float16
        # float16 storage: the two float32 weights round to neighbouring halves at most
        assert_close(got, want, 1e-3, ["_overview", "_overview_nosink"])
        assert_close(got, want, TOLERANCE, [*COLUMNS, "learned_sink", "_pooled", "_pooled_nosink", "_kept"])


@pytest.mark.parametrize("sink", [False, True])
def test_the_weight_a_row_keeps_off_key_0_has_its_own_digits(sink):
    """"_kept", the weight a row keeps off key 0 (what hiding the sink divides by), is summed apart from key 0's:
    against float64, every row to a relative 1e-5, even one that keeps 1e-13 or less (as mass - p0 in float32 it
    read 1e-7s there). A strong sink on key 0; blocks of 16 keys, so key 0's tile holds others."""
    from attnviz.attention import layer_pattern

    inputs, values, ids = make_inputs(48, d=8, heads=4, kv=2, sink=sink, scale=3.0, seed=7)
    inputs.q[:, :, 0] += 4
    inputs.k[:, 0, 0] = 6
    got = kernel_stats(inputs, ids, block_m=16, block_n=16, overview=8)["_kept"]
    want = layer_pattern(inputs, dtype=torch.float64)[0].numpy()[..., 1:].sum(-1)
    assert 0 < want[want > 0].min() < 1e-12
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=0)


def test_float16_inputs_match_float64_of_the_same_rounded_values():
    inputs, values, ids = make_inputs(48, heads=2, kv=1, sink=True)
    rounded = LayerInputs(q=inputs.q.half().float(), k=inputs.k.half().float(), kv_head_of=inputs.kv_head_of,
                          scaling=inputs.scaling, mask=inputs.mask, sink=inputs.sink)
    got = kernel_stats(inputs, ids, block_m=16, block_n=16, dtype=torch.float16, values=values)
    # the statistics come from float32 scores of exactly multiplied float16 inputs; the output from float16 weights
    assert_close(got, dense_reference(rounded, None, ids), TOLERANCE, [*COLUMNS, "learned_sink"])
    reference = dense_reference(rounded, values.half().float(), ids)["_output"]
    assert np.abs(got["_output"].double().cpu().numpy() - reference).max() < 1e-2


def test_one_token_no_repeats_and_no_token_ids():
    inputs, _, _ = make_inputs(1, heads=2, kv=1)
    one = kernel_stats(inputs, [5], block_m=16, block_n=16)
    assert one["entropy"] == pytest.approx([0.0, 0.0]) and one["self"] == pytest.approx([1.0, 1.0])
    assert np.isnan(one["sink_mass"]).all() and np.isnan(one["prev_token"]).all()
    inputs, _, _ = make_inputs(20, heads=2, kv=1)
    distinct = kernel_stats(inputs, list(range(20)), block_m=16, block_n=16)
    assert np.isnan(distinct["induction"]).all()
    none = kernel_stats(inputs, None, block_m=16, block_n=16)
    assert np.isnan(none["induction"]).all()
    assert_close(none, dense_reference(inputs, None, list(range(20))), TOLERANCE, COLUMNS[:-1])


def test_what_the_kernel_cannot_do_is_refused_and_left_to_the_torch_path():
    inputs, _, ids = make_inputs(20, heads=2, kv=1)
    bits = MaskRule.from_bool(np.tri(20, dtype=bool) & (np.arange(20)[None, :] != 3))
    assert bits.kind == "explicit"
    explicit = LayerInputs(q=inputs.q, k=inputs.k, kv_head_of=inputs.kv_head_of, scaling=1.0, mask=bits)
    with pytest.raises(Unsupported, match="explicit"):
        kernel_stats(explicit, ids)
    wide = LayerInputs(q=torch.zeros(1, 4, 320), k=torch.zeros(1, 4, 320), kv_head_of=(0,), scaling=1.0,
                       mask=MaskRule(4, 4, causal=True))
    with pytest.raises(Unsupported, match="head dim"):
        kernel_stats(wide, None)
    with pytest.raises(ValueError, match="power of two"):
        kernel_stats(inputs, ids, block_m=24)
    if not torch.cuda.is_available():  # no GPU: the torch path runs, never the interpreter
        assert stats_on_device(inputs, ids) is None
    assert stats_on_device(explicit, ids) is None


COMPILE_FOR_GPU = """
import os
os.environ["TRITON_INTERPRET"] = "0"
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attnviz.kernels import triton_stats as ts
POINTERS = {"Q", "K", "V", "Out", "Bias", "Sink", "KvOf", "Tok", "KeyPrev", "Rows", "Visits", "Lse", "LseOff",
            "RowBin", "KeyBin", "Pool", "PoolOff"}
INTS = {"KvOf": "*i32", "Tok": "*i32", "KeyPrev": "*i32", "Visits": "*i32", "RowBin": "*i32", "KeyBin": "*i32"}
def build(fn, dtype, values, arch, warps, stages):
    signature = {p: ("*" + dtype if p in ("Q", "K", "V") else INTS.get(p, "*fp32")) if p in POINTERS
                 else "fp32" if p in ("qk_scale", "softcap") else "constexpr" if p in values else "i32"
                 for p in fn.arg_names}
    source = ASTSource(fn=fn, signature=signature,
                       constexprs={(fn.arg_names.index(k),): v for k, v in values.items()})
    return triton.compile(source, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": warps, "num_stages": stages})
# (dtype, d, BLOCK_M, BLOCK_N, flags): SmolLM2-like, a sliding soft-capped layer with bias and sink, Gemma 3's d = 256
# with a window, a chunked float32 layer
for dtype, d, bm, bn, flags in [("fp16", 64, 64, 64, (1, 0, 0, 0, 0, 0, 1, 1)),
                                ("bf16", 128, 64, 32, (1, 1, 0, 1, 1, 1, 1, 1)),
                                ("bf16", 256, 64, 32, (1, 1, 0, 1, 0, 0, 1, 1)),
                                ("fp32", 64, 64, 32, (1, 0, 1, 0, 1, 1, 0, 1))]:
    names = ("CAUSAL", "HAS_WINDOW", "HAS_CHUNK", "HAS_SOFTCAP", "HAS_BIAS", "HAS_SINK", "HAS_V", "INDUCTION")
    values = dict(zip(names, map(bool, flags)))
    values["ALIGNED"] = values["CAUSAL"]
    common = dict(HEAD_DIM=d, D_PAD=triton.next_power_of_2(d), BLOCK_M=bm, BLOCK_N=bn,
                  PRECISION="ieee" if dtype == "fp32" else "tf32")
    for arch in (80, 90) if dtype == "fp16" else (90,):
        kernel = build(ts.stats_fwd, dtype, {**values, **common, "V_DIM": d, "DV_PAD": triton.next_power_of_2(d)},
                       arch, 8 if d > 64 else 4, 2 if d > 128 else 3)
        if dtype != "fp32":
            assert ("wgmma" if arch == 90 else "mma.sync") in kernel.asm["ptx"], (dtype, d, arch)
        pool_values = {k: v for k, v in values.items() if k not in ("HAS_SINK", "HAS_V", "INDUCTION", "ALIGNED")}
        build(ts.pool_fwd, dtype, {**pool_values, **common}, arch, 4, 2)
print("compiled")
"""


def test_the_statistics_kernels_compile_for_cuda_gpus_with_tensor_cores():
    # Triton compiles ahead of time for a named target (sm_80, sm_90) with its bundled ptxas: no GPU needed
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", COMPILE_FOR_GPU], capture_output=True, text=True, timeout=600,
                            cwd=root, env={**os.environ, "PYTHONPATH": root})
    assert result.stdout.strip().endswith("compiled"), result.stderr[-3000:]


# ---------------------------------------------------------------------------------------------------------------------
# On a CUDA GPU only (python -m pytest -m gpu tests/test_triton_stats.py)
# ---------------------------------------------------------------------------------------------------------------------

GPU_DTYPES = [torch.float16, torch.bfloat16, torch.float32]
# The statistics come from float32 scores of q and k (16-bit products are exact in float32, summed in float32) and
# float32 sums over at most a few thousand keys: against float64 of the same rounded inputs they agree to 1e-4
# (weights and entropy absolute, mean distance relative) in every dtype. The output p.v takes p in the input dtype.
GPU_STATS_TOLERANCE = 1e-4
GPU_OUTPUT_TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def float32_output_tolerance(inputs: LayerInputs, values) -> float:
    """The float32 output's bound against float64: 1e-5, plus what rounding the logits costs. A logit t (log2
    units, as the kernel holds it) is stored to within 2^-24 |t|, which moves its weight 2^(t - m) by ln 2 times
    that, relatively, and the output, a weighted mean of the values, by at most twice the weights' relative error
    times max |v|. Under ALiBi the biases reach hundreds of nats (alibi-d80: |t| up to 376), and the error grows to
    2e-5 on a GPU and under the interpreter alike (test_float32_output_error_grows_with_the_logits)."""
    q, k = inputs.q.double(), inputs.k.double()[list(inputs.kv_head_of)]
    s = torch.einsum("hqd,hkd->hqk", q, k) * inputs.scaling
    if inputs.softcap:
        s = inputs.softcap * torch.tanh(s / inputs.softcap)
    if inputs.key_bias is not None:
        s = s + inputs.key_bias.double()[:, None, :]
    largest = float(s.abs().max()) * 1.4426950408889634
    return 1e-5 + 2 * 0.6931471805599453 * 2.0 ** -24 * largest * float(values.abs().max())

GPU_CASES = {
    "causal-d64": dict(n=1000, d=64, heads=6, kv=2),
    "sliding-softcap-d128": dict(n=1031, d=128, heads=4, kv=2, softcap=30.0, scale=2.0,
                                 mask=MaskRule(1031, 1031, causal=True, window=300)),
    "sink-window-d64": dict(n=777, d=64, heads=4, kv=1, sink=True, mask=MaskRule(777, 777, causal=True, window=128)),
    "alibi-d80": dict(n=517, d=80, heads=4, kv=4, bias=True),
    "chunked-d64": dict(n=600, d=64, heads=2, kv=1, mask=MaskRule(600, 600, causal=True, chunk=256)),
    "gemma-like-d256": dict(n=1500, d=256, heads=4, kv=1, mask=MaskRule(1500, 1500, causal=True, window=512)),
}


def test_float32_output_error_grows_with_the_logits():
    """The GPU case alibi-d80 in float32 under the interpreter: ALiBi's biases put logits near 376 (log2 units),
    whose float32 spacing is 3e-5, and the output's error against float64 passes 1e-5 (2.3e-5 on an H200, 1.9e-5
    here): the rounding of the logits themselves, within float32_output_tolerance."""
    inputs, values, ids = make_inputs(**GPU_CASES["alibi-d80"], vocab=50)
    want = dense_reference(inputs, values, ids)["_output"]
    error = np.abs(kernel_stats(inputs, ids, block_m=64, block_n=32, values=values)["_output"].double().numpy()
                   - want).max()
    assert 1e-5 < error < float32_output_tolerance(inputs, values)


def rounded(inputs: LayerInputs, dtype) -> LayerInputs:
    """The same inputs with q and k rounded to dtype (the values a 16-bit kernel sees), in float32."""
    return LayerInputs(q=inputs.q.to(dtype).float(), k=inputs.k.to(dtype).float(), kv_head_of=inputs.kv_head_of,
                       scaling=inputs.scaling, mask=inputs.mask, softcap=inputs.softcap, key_bias=inputs.key_bias,
                       sink=inputs.sink)


# The launches the statistics kernel alone ran fastest with in an H200 sweep at N = 16,384 (benchmarks/gpu_stats.py):
# {(head_dim, 16-bit): (block_m, block_n, num_warps, num_stages)}. Checked here against float64 before
# stats_on_device takes them (it still launches (64, 64) or (64, 32) with the kernel's default warps and stages).
FASTER_LAUNCHES = {(64, True): (64, 128, 4, 3), (128, True): (64, 64, 4, 3), (256, True): (128, 32, 8, 2),
                   (64, False): (64, 64, 4, 2)}


def gpu_launches(case: str, head_dim: int, dtype) -> list[tuple]:
    """(block_m, block_n, num_warps, num_stages) to check a GPU case with: stats_on_device's blocks at the default
    warps and stages; for the first case the benchmark's other shapes too; and the faster launch for this head
    size and precision, where the sweep found one."""
    launches = [((64, 64) if head_dim <= 64 else (64, 32)) + (None, None)]
    if case == next(iter(GPU_CASES)):
        launches += [(128, 64, None, None), (64, 32, None, None), (128, 32, None, None)]
    faster = FASTER_LAUNCHES.get((head_dim, dtype != torch.float32))
    return launches + ([faster] if faster else [])


def test_gpu_launches_add_the_faster_launch_where_the_sweep_found_one():
    assert gpu_launches("causal-d64", 64, torch.float16)[-1] == (64, 128, 4, 3)
    assert gpu_launches("causal-d64", 64, torch.float32)[-1] == (64, 64, 4, 2)
    assert gpu_launches("alibi-d80", 80, torch.bfloat16) == [(64, 32, None, None)]
    assert gpu_launches("gemma-like-d256", 256, torch.float16) == [(64, 32, None, None), (128, 32, 8, 2)]


@needs_gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_gpu_kernel_matches_float64(case, dtype):
    inputs, values, ids = make_inputs(**GPU_CASES[case], vocab=50)
    want = dense_reference(rounded(inputs, dtype), values.to(dtype).float(), ids, pool=48)
    names = [*COLUMNS, "_pooled", "_pooled_nosink"] + (["learned_sink"] if inputs.sink is not None else [])
    for block_m, block_n, warps, stages in gpu_launches(case, inputs.head_dim, dtype):
        got = kernel_stats(inputs, ids, block_m=block_m, block_n=block_n, pool=48, values=values, dtype=dtype,
                           trace=True, num_warps=warps, num_stages=stages)
        assert_close(got, want, GPU_STATS_TOLERANCE, names)
        error = np.abs(got["_output"].double().cpu().numpy() - want["_output"]).max()
        bound = float32_output_tolerance(inputs, values) if dtype == torch.float32 else GPU_OUTPUT_TOLERANCE[dtype]
        assert error < bound, (block_m, block_n, error, bound)
        assert (got["_visits"] == expected_visits(inputs.mask, block_m, block_n)[None, :]).all()


@needs_gpu
def test_gpu_pooled_fast_path_and_dispatch_match_the_torch_path(monkeypatch):
    """n = 7,000: pooling blocks (146 keys) are wider than a tile, so every tile takes pool_fwd's 2 x 2 path;
    stats_on_device (what streamed_stats calls on CUDA) against the torch path on the same inputs."""
    inputs, values, ids = make_inputs(7000, d=64, heads=2, kv=1, vocab=300, sink=True)
    monkeypatch.setattr(triton_stats, "USE_KERNEL", True)
    # the overview's 512 pooling blocks (13 or 14 rows) are narrower than a tile: every weight takes its own atomic
    got = stats_on_device(inputs, ids, pool=48, values=values, overview=512)
    assert got is not None and got["_output"].is_cuda
    monkeypatch.setattr(triton_stats, "USE_KERNEL", False)
    assert stats_on_device(inputs, ids) is None
    want = streamed_stats(inputs, ids, pool=48, values=values, overview=512)
    assert set(got) == set(want)
    float16 = ["_overview", "_overview_nosink"]
    assert_close(got, want, 1e-3, float16)
    assert_close(got, want, GPU_STATS_TOLERANCE, [n for n in want if n not in ("_output", *float16)])
    assert (got["_output"].cpu() - want["_output"]).abs().max() < 1e-5


def real_model_check(loaded, n_tokens: int, monkeypatch):
    """Every layer of a real model's qk capture of the shipped text: the kernel in float32 against the torch path
    on the same inputs, and in bfloat16 against the torch path on the bfloat16-rounded inputs."""
    from pathlib import Path

    from attnviz.capture import capture_attention

    monkeypatch.setattr(triton_stats, "USE_KERNEL", False)  # the torch path for the reference
    text = (Path(__file__).resolve().parent.parent / "data" / "declaration_and_lincoln.txt").read_text()
    ids = loaded.tokenizer(text).input_ids[:n_tokens]
    capture = capture_attention(loaded, loaded.tokenizer.decode(ids, skip_special_tokens=True), store="qk")
    ids = list(capture.token_ids)
    names = [*COLUMNS, "_pooled", "_pooled_nosink"]
    for layer in capture.layers:
        inputs = capture.inputs[layer]
        got = kernel_stats(inputs, ids, pool=48, block_m=64, block_n=32 if inputs.head_dim > 64 else 64)
        assert_close(got, streamed_stats(inputs, ids, pool=48), GPU_STATS_TOLERANCE, names)
        half = kernel_stats(inputs, ids, pool=48, dtype=torch.bfloat16, block_m=64, block_n=32)
        assert_close(half, streamed_stats(rounded(inputs, torch.bfloat16), ids, pool=48), GPU_STATS_TOLERANCE,
                     names)
    return capture


@needs_gpu
@pytest.mark.slow
def test_gpu_kernel_matches_the_cpu_path_on_smollm2(smollm2, monkeypatch):
    capture = real_model_check(smollm2, 1500, monkeypatch)
    assert capture.n_tokens > 1000


@needs_gpu
@pytest.mark.slow
def test_gpu_kernel_matches_the_cpu_path_on_gemma3(gemma3, monkeypatch):
    # 1,500 tokens: the sliding layers' 512-key window skips tiles, the global layers read every tile left of the
    # diagonal
    capture = real_model_check(gemma3, 1500, monkeypatch)
    assert any(capture.inputs[layer].mask.window for layer in capture.layers)


def toy_stats(loaded, text, *, device_inputs=None):
    """(summary, the device of every layer's q that streamed_stats saw) of the command line's pass on a toy model."""
    from attnviz import stats
    from attnviz.capture import capture_attention
    from attnviz.stats import streaming_attend

    ids = loaded.tokenizer(text).input_ids
    during = streaming_attend(ids, keep_inputs=False)
    if device_inputs is not None:
        during.device_inputs = device_inputs
    seen, original = [], stats.streamed_stats

    def spy(inputs, *args, **kwargs):
        seen.append(inputs.q.device.type)
        return original(inputs, *args, **kwargs)

    stats.streamed_stats = spy
    try:
        capture_attention(loaded, text, store="qk", during=during)
    finally:
        stats.streamed_stats = original
    return during.summary, seen


def test_device_inputs_are_copied_to_the_cpu_where_the_model_is_not_on_a_gpu():
    """DuringForward.device_inputs keeps q, k and v only where a GPU made them: on the CPU the torch path sees the
    same float32 copies, and the statistics are the same to the bit."""
    from attnviz.models import load_model

    loaded = load_model("toy-llama-gqa", device="cpu")
    text = "the cat sat on the mat and the cat sat on the hat " * 3
    want, seen_before = toy_stats(loaded, text, device_inputs=False)
    got, seen = toy_stats(loaded, text, device_inputs=True)
    assert seen == seen_before == ["cpu"] * len(want)
    for layer in want:
        for name in COLUMNS:
            np.testing.assert_array_equal(got[layer][name], want[layer][name])


@needs_gpu
def test_gpu_model_hands_the_kernel_its_own_q_and_k_and_matches_the_cpu_path(monkeypatch):
    """A toy model on the GPU: with the kernel on (the default on CUDA) each layer's q, k and v reach it on the GPU,
    not copied out and back, and the statistics equal the torch path's on the same model on the CPU."""
    from attnviz.models import load_model

    text = "the cat sat on the mat and the cat sat on the hat " * 8
    monkeypatch.setattr(triton_stats, "USE_KERNEL", True)
    got, seen = toy_stats(load_model("toy-llama-gqa", device="cuda"), text)
    assert seen and set(seen) == {"cuda"}
    monkeypatch.setattr(triton_stats, "USE_KERNEL", False)
    want, seen = toy_stats(load_model("toy-llama-gqa", device="cpu"), text)
    assert set(seen) == {"cpu"} and got.keys() == want.keys()
    for layer in want:
        assert_close(got[layer], want[layer], GPU_STATS_TOLERANCE, list(COLUMNS))
