"""The toy lab's Qwen3-Next hybrid and its softmax pair (attnviz.lab.hybrid, attnviz.lab.qwen3_next): training on the
induction task, the maps it reports against attnviz.mixers and the layer's own output, the sink metric against a
recomputation from the stored attention, and the gate as the one difference between the pair. Tiny sizes: every
training here is a few dozen steps of a 16-wide model."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from attnviz import lab
from attnviz.lab import hybrid, qwen3_next, training
from attnviz.mixers.delta import apply_map
from attnviz.mixers.gates import record_gates
from attnviz.mixers.maps import implicit_maps
from attnviz.tokenizer import byte_tokenizer

TINY = lab.LabConfig(task="induction", steps=24, eval_every=8, lr=1e-2, batch_size=8, segment_len=4, n_letters=6,
                     n_layers=3, n_heads=2, d_model=16)
TEXT = "abcdabcd"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread, as the lab trains: models this small gain nothing from more, and on a shared machine
    the threads of several processes spin against each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)  # nothing below may depend on it: the models draw from their own generators
    comparison = hybrid.HybridComparison(TINY)
    comparison.run()
    return comparison


def test_the_three_models_are_qwen3_next_as_the_mixers_read_it():
    kinds = {m: tuple(qwen3_next.build_qwen3_next(TINY, m).config.layer_types) for m in qwen3_next.MODELS}
    assert kinds["hybrid"] == ("linear_attention", "linear_attention", "full_attention")
    assert kinds["gated"] == kinds["ungated"] == ("full_attention",) * 3
    model = qwen3_next.build_qwen3_next(TINY, "hybrid")
    assert type(model).__name__ == "Qwen3NextForCausalLM" and model.config.num_experts == 0
    assert hybrid.layer_maps(model, TEXT).kinds == ("gated delta rule", "gated delta rule", "gated softmax")


@pytest.mark.parametrize("a_max", qwen3_next.A_MAXES)
def test_the_decay_rates_are_drawn_below_a_max_from_the_seed(a_max):
    wide = replace(TINY, n_heads=4, d_model=32, n_layers=4)
    models = [qwen3_next.build_qwen3_next(wide, "hybrid", a_max=a_max) for _ in range(2)]
    a = [torch.cat([p.detach().exp() for n, p in m.named_parameters() if n.endswith("A_log")]) for m in models]
    assert a[0].numel() == 3 * 4 and torch.equal(a[0], a[1])
    assert bool(((a[0] > 0.01 * (1 - 1e-6)) & (a[0] <= a_max * (1 + 1e-6))).all())
    with pytest.raises(ValueError, match="a_max"):
        qwen3_next.build_qwen3_next(wide, "hybrid", a_max=100.0)


def test_training_lowers_the_hybrids_loss_on_the_induction_task(trained):
    snap = trained.snapshots()["hybrid"]
    assert snap.status == "done" and snap.step == TINY.steps
    losses = np.asarray(snap.losses)
    # from about log(257) nats (a random model over the byte vocabulary) towards the task's few letters
    assert losses[:3].mean() > math.log(100)
    assert losses[-3:].mean() < losses[:3].mean() - 1.0


def _mixer_outputs(model) -> tuple[dict, list]:
    """{layer: what each Gated DeltaNet layer's kernel returned, [N, head, dv]}, read by a forward pre-hook on the
    gated norm that follows the kernel (its first argument is the kernel's output, flattened)."""
    outputs, handles = {}, []
    for layer, block in enumerate(model.model.layers):
        if hasattr(block, "linear_attn"):
            heads, dv = block.linear_attn.num_v_heads, block.linear_attn.head_v_dim

            def keep(_module, args, layer=layer, heads=heads, dv=dv):
                outputs[layer] = args[0].detach().reshape(-1, heads, dv)  # batch of one: [N, head, dv]
            handles.append(block.linear_attn.norm.register_forward_pre_hook(keep))
    return outputs, handles


def test_the_reported_maps_are_the_mixers_maps_and_rebuild_the_layers_output(trained):
    model = trained.runs["hybrid"].model
    reported = hybrid.layer_maps(model, TEXT)
    ids = torch.tensor([byte_tokenizer()(TEXT)["input_ids"]])
    found = implicit_maps(model, ids)
    assert reported.linear_layers() == sorted(found.maps) == [0, 1]
    outputs, handles = _mixer_outputs(model)
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    for layer, w in found.maps.items():
        np.testing.assert_array_equal(reported.maps[layer], w.double().numpy())
        rebuilt = apply_map(w.double(), found.records[layer].value.double())        # sum_s w_ts v_s
        torch.testing.assert_close(rebuilt, outputs[layer].double(), rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True, use_cache=False).attentions
    np.testing.assert_allclose(reported.maps[2], attentions[0][0].double().numpy(), rtol=0, atol=1e-7)


def test_scores_on_w_are_the_mixers_statistics_by_hand(trained):
    reported = hybrid.layer_maps(trained.runs["hybrid"].model, TEXT)
    w = np.abs(reported.maps[0])
    a = w / w.sum(-1, keepdims=True)
    prev = [np.mean([a[h, t, t - 1] for t in range(1, a.shape[1])]) for h in range(a.shape[0])]
    # "abcdabcd" after <bos>: queries 5..8 (the second a, b, c, d) each have one target, the token after the first
    ind = [np.mean([a[h, t, t - 3] for t in range(6, 9)] + [a[h, 5, 2]]) for h in range(a.shape[0])]
    np.testing.assert_allclose(reported.prev_token[0], prev, rtol=1e-12)
    np.testing.assert_allclose(reported.induction[0], ind, rtol=1e-12)


def _sink_by_hand(attention: np.ndarray) -> tuple[np.ndarray, float, float]:
    """alpha_0 of every (text, layer, head) by loops: the mean over all queries t of A[t, 0] (every query of a causal
    model sees the first token); its mean; the share above 0.3."""
    texts, layers, heads, n, _ = attention.shape
    alpha = np.zeros((texts, layers, heads))
    for i in range(texts):
        for layer in range(layers):
            for h in range(heads):
                alpha[i, layer, h] = sum(float(attention[i, layer, h, t, 0]) for t in range(n)) / n
    return alpha, float(alpha.mean()), float((alpha > 0.3).sum() / alpha.size)


def test_the_sink_metric_over_training_is_the_stored_attentions(trained):
    for name, snap in trained.snapshots().items():
        assert [c.step for c in snap.checkpoints] == [0, 8, 16, 24]
        softmax_layers = 1 if name == "hybrid" else 3
        for checkpoint in snap.checkpoints:
            assert checkpoint.attention.shape == (hybrid.SINK_TEXTS, softmax_layers, 2, 9, 9)
            alpha, mass, rate = _sink_by_hand(checkpoint.attention)
            np.testing.assert_allclose(checkpoint.alpha0, alpha, rtol=1e-12)
            assert checkpoint.first_token_mass == pytest.approx(mass, rel=1e-12)
            assert checkpoint.sink_rate == rate
    model = trained.runs["ungated"].model
    probe = lab.make_probe(TINY.segment_len, n_letters=TINY.n_letters)[:hybrid.SINK_TEXTS]
    with torch.no_grad():
        fresh = torch.stack(model(input_ids=probe, output_attentions=True, use_cache=False).attentions, 1)
    np.testing.assert_allclose(trained.snapshots()["ungated"].checkpoints[-1].attention, fresh.numpy(), atol=1e-6)


def test_the_pair_starts_from_the_same_weights_and_sees_the_same_batches(monkeypatch):
    gated, ungated = (qwen3_next.build_qwen3_next(TINY, m).state_dict() for m in ("gated", "ungated"))
    assert list(gated) == list(ungated)
    assert all(torch.equal(gated[k], ungated[k]) for k in gated)
    seen = {}
    original = training.make_batch

    def logged(*args, **kwargs):
        ids, mask = original(*args, **kwargs)
        seen.setdefault(current, []).append(ids.clone())
        return ids, mask

    monkeypatch.setattr(training, "make_batch", logged)
    for current in ("gated", "ungated"):
        hybrid.HybridRun(replace(TINY, steps=3, eval_every=3), current).run()
    assert len(seen["gated"]) == 3 and all(torch.equal(a, b) for a, b in zip(seen["gated"], seen["ungated"]))


def _attention_by_hand(attn, x, cos, sin, gated: bool) -> torch.Tensor:
    """Qwen3-Next's softmax attention written out from the module's weights: q and gate from q_proj's matrix, RMS
    norms with their 1-centred weights, RoPE on the first rotary dims, causal softmax, times sigmoid(gate) only
    when `gated`, then o_proj. x [1, N, d] -> [1, N, d], float64."""
    heads, hd = attn.config.num_attention_heads, attn.head_dim
    n = x.shape[1]
    x = x.double()
    qg = (x @ attn.q_proj.weight.double().T).view(1, n, heads, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:]
    k = (x @ attn.k_proj.weight.double().T).view(1, n, heads, hd)
    v = (x @ attn.v_proj.weight.double().T).view(1, n, heads, hd)

    def rms(t, w):
        return t / torch.sqrt((t * t).mean(-1, keepdim=True) + attn.q_norm.eps) * (1 + w.double())

    q, k = rms(q, attn.q_norm.weight).transpose(1, 2), rms(k, attn.k_norm.weight).transpose(1, 2)
    r = cos.shape[-1]
    c, s = cos.double()[:, None], sin.double()[:, None]

    def rope(t):
        rot, rest = t[..., :r], t[..., r:]
        half = torch.cat([-rot[..., r // 2:], rot[..., :r // 2]], -1)
        return torch.cat([rot * c + half * s, rest], -1)

    scores = rope(q) @ rope(k).transpose(-1, -2) * hd ** -0.5
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    out = (scores.softmax(-1) @ v.transpose(1, 2)).transpose(1, 2)          # [1, N, head, hd]
    if gated:
        out = out * torch.sigmoid(gate)
    return out.reshape(1, n, heads * hd) @ attn.o_proj.weight.double().T


@pytest.mark.parametrize("name", ["gated", "ungated"])
def test_the_gate_is_what_differs_between_the_pair(name):
    model = qwen3_next.build_qwen3_next(TINY, name).eval()
    attn = model.model.layers[1].self_attn
    seen = {}

    def keep(_module, args, kwargs, out):
        seen.update(x=kwargs["hidden_states"], pos=kwargs["position_embeddings"], out=out[0])

    handle = attn.register_forward_hook(keep, with_kwargs=True)
    ids = torch.tensor([byte_tokenizer()(TEXT)["input_ids"]])
    with record_gates(model) as gates, torch.no_grad():
        model(input_ids=ids, use_cache=False)
    handle.remove()
    cos, sin = seen["pos"]
    for gated in (True, False):
        by_hand = _attention_by_hand(attn, seen["x"], cos, sin, gated)
        if gated == (name == "gated"):
            torch.testing.assert_close(seen["out"].double(), by_hand, rtol=1e-5, atol=1e-7)
        else:
            assert not torch.allclose(seen["out"].double(), by_hand, rtol=1e-3, atol=1e-5)
    assert qwen3_next.has_open_gates(model) == (name == "ungated")
    assert all(bool((g == 1.0).all()) == (name == "ungated") for g in gates.values()) and len(gates) == 3


def test_the_hybrid_needs_two_layers_and_is_not_saved(trained):
    with pytest.raises(lab.LabError, match="at least 2 layers"):
        hybrid.HybridRun(replace(TINY, n_layers=1), "hybrid")
    with pytest.raises(lab.LabStateError, match="not saved"):
        trained.runs["hybrid"].save("anything")


def test_maps_wait_for_training_to_end():
    with pytest.raises(lab.LabStateError, match="still training"):
        hybrid.HybridComparison(replace(TINY, steps=2)).maps(TEXT)


def test_the_maps_figure_draws_w_on_a_diverging_scale_and_patterns_on_the_attention_scale(trained):
    from attnviz.figures import lab_hybrid as figs

    maps = trained.maps(trained.map_text())
    fig = figs.layer_maps_grid(maps, head=1)
    linear = [t for t in fig.data if t.coloraxis == "coloraxis2"]
    softmax = [t for t in fig.data if t.coloraxis == "coloraxis"]
    assert len(linear) == 2 and len(softmax) == 1 + 3 + 3
    peak = max(np.abs(maps["hybrid"].maps[layer][1]).max() for layer in (0, 1))
    assert fig.layout.coloraxis2.cmin == -peak and fig.layout.coloraxis2.cmax == peak
    assert fig.layout.coloraxis2.colorscale != fig.layout.coloraxis.colorscale
    assert (fig.layout.coloraxis.cmin, fig.layout.coloraxis.cmax) == (0.0, 1.0)
    np.testing.assert_array_equal(linear[0].z, maps["hybrid"].maps[0][1])
    titles = {fig.layout[a].title.text for a in fig.layout if a.startswith(("xaxis", "yaxis"))} - {None}
    assert titles == {"key token", "hybrid: query token", "gated: query token", "ungated: query token"}
    scores = figs.layer_scores_grid(maps)
    np.testing.assert_array_equal(scores.data[1].z, maps["hybrid"].induction)
    snaps = trained.snapshots()
    curves = figs.first_token_curves({n: [c.step for c in s.checkpoints] for n, s in snaps.items()},
                                     {n: [c.first_token_mass for c in s.checkpoints] for n, s in snaps.items()},
                                     {n: [c.sink_rate for c in s.checkpoints] for n, s in snaps.items()})
    np.testing.assert_array_equal(curves.data[2].y, [c.first_token_mass for c in snaps["gated"].checkpoints])
    assert curves.layout.xaxis.title.text and curves.layout.yaxis.title.text


def test_the_snippet_trains_the_same_models_and_draws_the_same_maps():
    from dataclasses import asdict

    from attnviz import snippets
    from attnviz.figures import lab_hybrid as figs

    config = replace(TINY, steps=2, eval_every=2, n_layers=2)
    fields = {k: v for k, v in asdict(config).items() if k not in ("attention", "positional")}
    scope: dict = {}
    exec(snippets.lab_hybrid_maps(fields, 1, 1.0, 0), scope)
    again = hybrid.HybridComparison(config, conv_kernel=1, a_max=1.0)
    again.run()
    expected = figs.layer_maps_grid(again.maps(again.map_text()), head=0)
    assert len(scope["fig"].data) == len(expected.data)
    for got, want in zip(scope["fig"].data, expected.data):
        np.testing.assert_allclose(got.z, want.z, rtol=0, atol=1e-6)


def _plotly_values(y):
    """plotly sends arrays as lists or as typed arrays {"dtype", "bdata" (base64), "shape"}."""
    import base64

    if isinstance(y, dict):
        out = np.frombuffer(base64.b64decode(y["bdata"]), dtype=np.dtype(y["dtype"])).astype(float)
        return out.reshape([int(n) for n in str(y["shape"]).split(",")]) if "shape" in y else out
    return np.asarray(y, dtype=float)


def test_the_toy_lab_page_trains_the_hybrid_and_draws_what_the_library_reports(lab_cache):
    import json
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app_pages" / "toy_lab.py"),
                           default_timeout=300)
    for key, value in dict(lab_steps=20, lab_width=32, lab_heads=2, lab_batch=16, lab_segment_len=3,
                           lab_hybrid_layers=2).items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, at.exception
    assert any("No real hybrid checkpoint is on the package index" in m.value for m in at.markdown)
    at.button(key="lab_hybrid_train").click().run()
    assert not at.exception, at.exception
    comparison = at.session_state["lab_hybrid"]
    snaps = comparison.join(timeout=240)
    assert all(s.status == "done" for s in snaps.values()), {n: s.status for n, s in snaps.items()}
    at.run()
    assert not at.exception, at.exception
    figures = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    curves = next(f for f in figures if "first token over training" in f["layout"]["title"]["text"])
    for name, snap in snaps.items():
        trace = next(t for t in curves["data"] if t["name"].startswith(f"{name}: mean"))
        np.testing.assert_allclose(_plotly_values(trace["y"]), [c.first_token_mass for c in snap.checkpoints])
    grid = next(f for f in figures if f["layout"]["title"]["text"].startswith("Head 0 of every layer"))
    expected = comparison.maps(comparison.map_text())
    heatmaps = [t for t in grid["data"] if t["type"] == "heatmap"]
    assert len(heatmaps) == 2 * 3
    np.testing.assert_allclose(_plotly_values(heatmaps[0]["z"]), expected["hybrid"].maps[0][0], rtol=0, atol=1e-6)
    assert any("not probabilities" in c.value for c in at.caption)


def test_the_best_score_of_each_kind_over_training_by_hand(trained):
    from attnviz.figures import lab_hybrid as figs

    snap = trained.snapshots()["hybrid"]
    best = hybrid.best_by_kind(snap.checkpoints, "induction")
    assert list(best) == ["gated delta rule", "gated softmax"]
    np.testing.assert_array_equal(best["gated delta rule"], [max(c.induction[0].max(), c.induction[1].max())
                                                              for c in snap.checkpoints])
    np.testing.assert_array_equal(best["gated softmax"], [c.induction[2].max() for c in snap.checkpoints])
    fig = figs.best_score_curves({"hybrid": [c.step for c in snap.checkpoints]}, {"hybrid": best},
                                 statistic="induction")
    assert [t.name for t in fig.data] == ["hybrid: Gated DeltaNet", "hybrid: gated softmax"]
    assert [t.line.dash for t in fig.data] == ["solid", "dot"]
    np.testing.assert_array_equal(fig.data[0].y, best["gated delta rule"])
    assert fig.layout.xaxis.title.text == "training step" and "0–1" in fig.layout.yaxis.title.text
