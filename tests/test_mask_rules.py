"""Mask rules, not mask matrices: every rule against the masks transformers itself builds, the streamed statistics
under each rule against the dense definition, key tiles skipped where a rule hides them, and no N x N allocation
at 8,192 tokens."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from transformers import masking_utils as mu

from attnviz import attention as core
from attnviz import stats as S
from attnviz import streamed
from attnviz.attention import LayerInputs, MaskRule
from attnviz.capture import named_rule

N = 300  # longer than the probed rows, so rows past them are checked by the full comparison below


def _transformers_mask(function, n=N):
    """transformers' own bool mask [n, n] (sdpa_mask, True = attend), never skipped to None."""
    mask = mu.sdpa_mask(batch_size=1, q_length=n, kv_length=n, mask_function=function, allow_is_causal_skip=False,
                        allow_is_bidirectional_skip=False)
    return mask[0, 0].numpy()


@pytest.mark.parametrize("function, kind, reach", [
    (mu.causal_mask_function, "causal", None),
    (mu.sliding_window_causal_mask_function(37), "sliding", 37),
    (mu.chunked_causal_mask_function(64, torch.zeros(1, dtype=torch.long)), "chunked", 64),
])
def test_each_rule_is_the_mask_transformers_builds(function, kind, reach):
    want = _transformers_mask(function)
    rule = named_rule(batch_size=1, q_length=N, kv_length=N, mask_function=function)
    assert rule.kind == kind and (rule.window or rule.chunk) == reach and rule.bits is None
    assert np.array_equal(rule.rows(0, N), want)
    assert MaskRule.from_bool(want) == rule  # the same rule read from the built mask (the pattern store)
    assert rule.visible_keys() == int(want.sum())
    for a, b in ((0, 7), (100, 164), (250, 300)):  # the first and last key any of the rows sees
        seen = np.nonzero(want[a:b].any(0))[0]
        assert (rule.key_start(a, b), rule.key_end(a, b)) == (seen[0], seen[-1] + 1)


def test_bidirectional_and_padded_masks():
    """Full attention is the full rule; a padded text is no rule transformers' function names, so its bits are
    kept exactly."""
    full = _transformers_mask(mu.bidirectional_mask_function)
    assert full.all() and MaskRule.from_bool(full).kind == "full"
    padding = torch.ones(1, N, dtype=torch.bool)
    padding[0, :5] = False  # five pad tokens on the left
    padded = mu.and_masks(mu.causal_mask_function, mu.padding_mask_function(padding))
    assert named_rule(batch_size=1, q_length=N, kv_length=N, mask_function=padded, attention_mask=padding) is None
    want = _transformers_mask(padded)
    rule = MaskRule.from_bool(want)
    assert rule.kind == "explicit" and np.array_equal(rule.rows(0, N), want)


def _inputs(rule: MaskRule, seed=0, heads=4, kv=2, d=16) -> LayerInputs:
    g = torch.Generator().manual_seed(seed)
    return LayerInputs(q=torch.randn(heads, rule.n_query, d, generator=g) * 2,
                       k=torch.randn(kv, rule.n_key, d, generator=g) * 2,
                       kv_head_of=tuple(core.kv_head_of(heads, kv)), scaling=d ** -0.5, mask=rule)


@pytest.mark.parametrize("rule", [MaskRule(N, N, causal=True), MaskRule(N, N, causal=True, window=37),
                                  MaskRule(N, N, causal=True, chunk=64), MaskRule(N, N)], ids=lambda r: r.kind)
def test_streamed_statistics_under_each_rule_equal_the_dense_definition(rule):
    """The float64 softmax of q.k under the rule's bool matrix, and pattern_stats of it, against streamed_stats
    (small tiles, so that the window starts mid-tile and many tiles are skipped) and the layer's output."""
    x = _inputs(rule)
    ids = np.random.default_rng(1).integers(0, 20, N)
    logits = torch.einsum("hqd,hkd->hqk", x.q.double(), x.k.double()[list(x.kv_head_of)]) * x.scaling
    visible = torch.from_numpy(rule.rows(0, N))
    dense = torch.softmax(logits.masked_fill(~visible, float("-inf")), -1)
    want = S.pattern_stats(dense.numpy(), S.induction_targets(ids))
    got = S.streamed_stats(x, ids, block=32, key_block=48)
    for column in S.COLUMNS:
        np.testing.assert_allclose(got[column], want[column], rtol=1e-5, atol=1e-6, err_msg=column)
    weights, _ = core.layer_pattern(x, 100, 164)
    np.testing.assert_allclose(weights.numpy(), dense[:, 100:164, :weights.shape[-1]].numpy(), atol=1e-6)
    v = torch.randn(2, N, 8, dtype=torch.float32)
    out = core.layer_output(x, v, block=50)
    np.testing.assert_allclose(out.numpy(), (dense @ v.double()[list(x.kv_head_of)]).numpy(), atol=1e-5)


@pytest.mark.parametrize("slope, mid_row", [(0.5, True), (-0.5, False)], ids=["rising", "falling"])
def test_the_running_shift_moves_only_when_weights_would_outgrow_it(monkeypatch, slope, mid_row):
    """Scores that rise by 0.5 per key (24 nats over a 48-key tile, past the 2^8 a weight may reach) move the shift
    of every row block at later tiles, rescaling its sums there; falling ones never move it after the first tile.
    Either way the statistics and the output equal the float64 definition."""
    rule = MaskRule(N, N, causal=True)
    x = _inputs(rule)
    x = LayerInputs(q=x.q, k=x.k, kv_head_of=x.kv_head_of, scaling=x.scaling, mask=rule,
                    key_bias=slope * torch.arange(N, dtype=torch.float32).expand(4, N))
    moves, blocks = [], -(-N // 32)
    shift_for = streamed._Running.shift_for
    monkeypatch.setattr(streamed._Running, "shift_for", lambda run, m: moves.append(shift_for(run, m)) or moves[-1])
    ids = np.random.default_rng(1).integers(0, 20, N)
    v = torch.randn(2, N, 8, generator=torch.Generator().manual_seed(2))
    got = S.streamed_stats(x, ids, block=32, key_block=48, values=v)
    logits = torch.einsum("hqd,hkd->hqk", x.q.double(), x.k.double()[list(x.kv_head_of)]) * x.scaling
    logits = (logits + x.key_bias.double()[:, None, :]).masked_fill(~torch.from_numpy(rule.rows(0, N)), -math.inf)
    dense = torch.softmax(logits, -1)
    want = S.pattern_stats(dense.numpy(), S.induction_targets(ids))
    assert (sum(moves) > blocks) == mid_row and sum(moves) >= blocks  # each block moves at its first tile
    for column in S.COLUMNS:
        np.testing.assert_allclose(got[column], want[column], rtol=1e-5, atol=1e-6, err_msg=column)
    # the rising logits reach 150, where float32's spacing (1.5e-5) moves a weight by about that much relative
    np.testing.assert_allclose(got["_output"].numpy(), (dense @ v.double()[list(x.kv_head_of)]).numpy(), atol=1e-4)


def test_the_key_tiles_computed_are_the_ones_the_window_allows(monkeypatch):
    """Every (row block, key tile) the streamed pass scores, counted: with a window of 37 and 32-row blocks each
    block needs at most 68 keys, so 2 tiles of 48; a regression to every tile left of the window (N / 48 per
    block) fails."""
    rule = MaskRule(N, N, causal=True, window=37)
    seen = []
    real = core.layer_scores
    monkeypatch.setattr(core, "layer_scores", lambda inputs, a, b, **kw: seen.append(
        (a, b, kw["key_start"], kw["key_end"])) or real(inputs, a, b, **kw))
    S.streamed_stats(_inputs(rule), block=32, key_block=48)
    allowed = 0
    for a in range(0, N, 32):
        b = min(N, a + 32)
        lo, hi = rule.key_start(a, b), max(rule.key_end(a, b), b)
        allowed += -(-(hi - lo) // 48)
        assert all(k0 >= lo for a2, _, k0, _ in seen if a2 == a)
    assert len(seen) == allowed
    assert sum((b - a) * (k1 - k0) for a, b, k0, k1 in seen) < 3 * N * (32 + 37)  # O(N w), not O(N²)


@pytest.mark.slow
def test_no_n_squared_allocation_at_8192_tokens(tmp_path):
    """A tiny Gemma 3 (a sliding and a full layer) captured in the qk store with every head's statistics at 8,192
    tokens, in a fresh process: the peak resident memory grows by under 60 MB (46 MB measured), where one N x N
    bool mask is 64 MB, one float32 head map 256 MB, and the capture with transformers' explicit masks grows by
    211 MB."""
    from tests.families import build_family

    folder = build_family("gemma3_text", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8192}))
    script = textwrap.dedent(f"""
        import resource, torch
        from attnviz.capture import capture_attention
        from attnviz.models import load_model
        from attnviz.stats import streaming_attend
        torch.manual_seed(0)
        loaded = load_model({str(folder)!r})
        ids = torch.randint(3, 250, (8192,)).tolist()
        capture_attention(loaded, "", token_ids=ids[:600], store="qk", during=streaming_attend(ids[:600]))  # warm up
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        cap = capture_attention(loaded, "", token_ids=ids, store="qk", during=streaming_attend(ids))
        assert len(cap.summary) == 2
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(cap.inputs[0].mask.kind, cap.inputs[1].mask.kind, grown // 1024)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=True)
    sliding, full, grown_mb = out.stdout.split()
    assert (sliding, full) == ("sliding", "causal")
    assert int(grown_mb) < 60, out.stdout
