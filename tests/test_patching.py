import copy
import dataclasses
import threading
import types

import numpy as np
import pytest
import torch

from attnviz import knockout as ko
from attnviz import patching as P
from attnviz.models import load_model

# byte tokenizer: the same length, answers "M" and "J" (different first bytes)
TOY_PAIR = P.PromptPair("toy", "When Mary and John went, John gave it to", "When Mary and John went, Mary gave it to",
                        "M", "J")
TOYS = ("toy-llama-gqa", "toy-gpt2")


@pytest.fixture(scope="module", params=TOYS)
def toy(request):
    return load_model(request.param)


def _modules(model, kind, layer):
    """(the module the test hooks, whether its input (pre-hook) or output carries the site)."""
    if kind == "heads":
        return ko.output_projection(model, layer), "input"
    block = ko.blocks(model)[layer]
    if kind == "resid":
        return block, "input"
    return (block.self_attn if hasattr(block, "self_attn") else block.attn) if kind == "attn" else block.mlp, "output"


def _hook(model, kind, layer, fn):
    """fn(tensor [1, n, d]) -> tensor, on the site's tensor, by a hook written here."""
    module, where = _modules(model, kind, layer)
    if where == "output":
        def post(m, args, out):
            return (fn(out[0]), *out[1:]) if isinstance(out, tuple) else fn(out)
        return module.register_forward_hook(post)

    def pre(m, args, kwargs):
        if args:
            return (fn(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": fn(kwargs["hidden_states"])}
    return module.register_forward_pre_hook(pre, with_kwargs=True)


def _logits(model, ids):
    ids = torch.tensor([list(ids)])
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[0].double()


def _site_values(model, ids, sites):
    """{site: [n, d]} the activation at each site's (kind, layer), read by hooks written here."""
    seen, handles = {}, []
    for kind, layer in {(s[0], s[1]) for s in sites}:
        def keep(x, key=(kind, layer)):
            seen[key] = x[0].detach().clone()
            return x
        handles.append(_hook(model, kind, layer, keep))
    try:
        _logits(model, ids)
    finally:
        for h in handles:
            h.remove()
    return seen


def _hand_patched_logits(loaded, pair, sites, scale=1.0):
    """Logits of the corrupted prompt in a copy of the model whose sites are set by hand to corrupted + scale *
    (clean - corrupted) (scale 1: the clean activation)."""
    model = copy.deepcopy(loaded.model)
    clean = _site_values(model, pair.clean_ids, sites)
    corrupted = _site_values(model, pair.corrupted_ids, sites)
    d_v = ko.head_width(loaded)
    for kind, layer, index in sites:
        def patch(x, kind=kind, layer=layer, index=index):
            x = x.clone()
            cols = slice(index * d_v, (index + 1) * d_v) if kind == "heads" else slice(None)
            rows = slice(None) if kind == "heads" else index
            step = clean[(kind, layer)][rows, cols] - corrupted[(kind, layer)][rows, cols]
            x[0, rows, cols] = corrupted[(kind, layer)][rows, cols] + scale * step
            return x
        _hook(model, kind, layer, patch)
    return _logits(model, pair.corrupted_ids)


# the prompts differ at position 26 (after <bos>): a position from there on carries the difference
ROWS = [(("heads", 1, 2),), (("resid", 1, 26),), (("attn", 0, 30),), (("mlp", 1, 40),),
        (("heads", 0, 1), ("mlp", 1, 28)), (), (("resid", 0, 26), ("heads", 1, 0))]


@pytest.mark.parametrize("share", [True, False])
def test_patched_logits_equal_a_hand_patched_copy(toy, share):
    pair = P.tokenize_pair(toy, TOY_PAIR)
    out = P.patched_logits(toy, pair, ROWS, share_prefix=share)
    plain = _logits(toy.model, pair.corrupted_ids)
    for b, sites in enumerate(ROWS):
        ref = _hand_patched_logits(toy, pair, sites) if sites else plain
        np.testing.assert_allclose(out[b].double().numpy(), ref.numpy(), atol=2e-5, rtol=0)
        if sites:
            assert (ref - plain).abs().max() > 1e-3, f"row {b} does change the logits"


def test_patching_the_whole_residual_stream_gives_the_clean_run(toy):
    pair = P.tokenize_pair(toy, TOY_PAIR)
    every = [tuple(("resid", layer, p) for p in range(pair.n)) for layer in range(toy.shape.layers)]
    out = P.patched_logits(toy, pair, every)
    clean = _logits(toy.model, pair.clean_ids)
    for row in out:
        np.testing.assert_allclose(row.double().numpy(), clean.numpy(), atol=2e-5, rtol=0)


@pytest.mark.parametrize("kind", P.KINDS)
def test_grid_entries_equal_the_metric_of_a_hand_patched_copy(kind):
    loaded = load_model("toy-llama-gqa")
    pair = P.tokenize_pair(loaded, TOY_PAIR)
    result = P.activation_patching(loaded, pair, kind, batch=5)
    clean, corrupted = _logits(loaded.model, pair.clean_ids), _logits(loaded.model, pair.corrupted_ids)
    ld = lambda z: float(z[-1, pair.answer] - z[-1, pair.wrong])  # noqa: E731
    assert result.clean_value == pytest.approx(ld(clean), abs=1e-5)
    assert result.corrupted_value == pytest.approx(ld(corrupted), abs=1e-5)
    width = loaded.shape.heads if kind == "heads" else pair.n
    assert result.values.shape == (loaded.shape.layers, width) and len(result.columns()) == width
    for layer, index in [(0, 1), (1, 3), (1, width - 1), (0, width - 1)]:
        got = result.values[layer, index]
        assert got == pytest.approx(ld(_hand_patched_logits(loaded, pair, [(kind, layer, index)])), abs=2e-5)
        norm = (got - ld(corrupted)) / (ld(clean) - ld(corrupted))
        assert result.normalised[layer, index] == pytest.approx(norm, abs=1e-4)
    if kind != "heads":  # a position before the first difference carries nothing
        np.testing.assert_allclose(result.normalised[:, :20], 0.0, atol=1e-5)


def test_loss_metric_is_the_clean_answers_cross_entropy():
    loaded = load_model("toy-gpt2")
    pair = P.tokenize_pair(loaded, TOY_PAIR)
    result = P.activation_patching(loaded, pair, "heads", metric="loss")
    logits = _hand_patched_logits(loaded, pair, [("heads", 1, 1)])
    loss = float(torch.nn.functional.cross_entropy(logits[-1:], torch.tensor([pair.answer])))
    assert result.values[1, 1] == pytest.approx(loss, abs=2e-5)
    clean = _logits(loaded.model, pair.clean_ids)
    assert result.clean_value == pytest.approx(float(-clean[-1].log_softmax(-1)[pair.answer]), abs=2e-5)


def test_batches_above_layer_0_share_it_and_still_equal_the_hand_patched_copy(toy):
    pair = P.tokenize_pair(toy, TOY_PAIR)
    rows = [(("heads", 1, 2),), (("resid", 1, 26),), (("mlp", 1, 40),), (("attn", 1, 33),), ()]
    batches = []
    handle = ko.blocks(toy.model)[0].register_forward_pre_hook(
        lambda m, args, kwargs: batches.append((args[0] if args else kwargs["hidden_states"]).shape[0]),
        with_kwargs=True)
    try:
        out = P.patched_logits(toy, pair, rows)
    finally:
        handle.remove()
    assert batches[-1] == 1, "layer 0 ran once for every row"
    for b, sites in enumerate(rows):
        ref = _hand_patched_logits(toy, pair, sites) if sites else _logits(toy.model, pair.corrupted_ids)
        np.testing.assert_allclose(out[b].double().numpy(), ref.numpy(), atol=2e-5, rtol=0)


def _rms_norm_in_float64(self, x):
    return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


def _float64(model):
    """A float64 copy of the model that computes in float64 throughout (Llama's RMSNorm and eager softmax round to
    float32 whatever their input; SDPA does not), so that finite differences are exact to about 1e-10."""
    model = copy.deepcopy(model).double()
    model.set_attn_implementation("sdpa")
    for module in model.modules():
        if type(module).__name__ == "LlamaRMSNorm":
            module.forward = types.MethodType(_rms_norm_in_float64, module)
    return model


@pytest.mark.parametrize("metric", P.METRICS)
def test_attribution_equals_finite_differences_along_clean_minus_corrupted(toy, metric):
    loaded = dataclasses.replace(toy, model=_float64(toy.model))
    pair = P.tokenize_pair(loaded, TOY_PAIR)
    estimate = P.attribution_patching(loaded, pair, metric)
    clean, corrupted = (_logits(loaded.model, ids) for ids in (pair.clean_ids, pair.corrupted_ids))

    def value(z):
        z = z[-1:]
        return float(P.metric_values(z, pair, metric)[0])

    scale = value(clean.float().double()) - value(corrupted.float().double())  # attnviz.lm's logits are float32
    eps = 1e-4
    for site in [("heads", 0, 1), ("heads", 1, 3), ("resid", 1, 26), ("attn", 0, 33), ("mlp", 1, 40), ("mlp", 0, 5)]:
        up, down = (value(_hand_patched_logits(loaded, pair, [site], scale=s)) for s in (eps, -eps))
        slope = (up - down) / (2 * eps) / scale
        assert estimate[site[0]][site[1], site[2]] == pytest.approx(slope, rel=1e-5, abs=1e-8), site
    assert np.abs(estimate["heads"]).max() > 1e-3 and np.isfinite(estimate["mlp"]).all()


def test_comparison_correlates_and_ranks_the_largest_disagreements():
    pair = P.TokenPair("x", (1, 2), (1, 3), 4, 5, ("a", "b"), ("a", "c"))
    real = np.array([[1.0, 0.0, 0.5], [0.2, 0.9, 0.0]])
    patched = P.PatchingResult("heads", "logit_diff", real * 2.0 - 1.0, 1.0, -1.0, pair)  # normalised = real
    estimate = np.array([[0.9, 0.0, -0.5], [0.2, 0.1, 0.05]])
    c = P.compare(patched, estimate, top=2)
    d = real.ravel() - real.ravel().mean(), estimate.ravel() - estimate.ravel().mean()
    assert c.pearson == pytest.approx(float(d[0] @ d[1] / np.sqrt((d[0] @ d[0]) * (d[1] @ d[1]))))
    assert [(r, k) for r, k, _, _ in c.disagreements] == [(0, 2), (1, 1)]
    assert c.disagreements[0][2:] == pytest.approx((0.5, -0.5))


def test_ready_pairs_in_smollm2_have_equal_lengths_and_are_answered_differently(smollm2):
    for name in P.READY_PAIRS:
        pair = P.ready_pair(smollm2, name)
        assert len(pair.clean_ids) == len(pair.corrupted_ids) == pair.n
        assert smollm2.tokenizer.decode([pair.answer]) == P.READY_PAIRS[name].answer
        clean, corrupted, _ = P.base_values(smollm2, pair)
        logits = [_logits(smollm2.model, ids)[-1] for ids in (pair.clean_ids, pair.corrupted_ids)]
        assert clean == pytest.approx(float(logits[0][pair.answer] - logits[0][pair.wrong]), abs=1e-4)
        assert corrupted == pytest.approx(float(logits[1][pair.answer] - logits[1][pair.wrong]), abs=1e-4)
        assert clean > 0 > corrupted, name  # SmolLM2 prefers each prompt's own answer


def test_pairs_of_different_token_lengths_or_answers_are_refused_clearly():
    loaded = load_model("toy-gpt2")  # bytes: "Eiffel Tower" is longer than "Colosseum"
    with pytest.raises(ValueError, match="clean prompt is 35 tokens and the corrupted one 32"):
        P.ready_pair(loaded, "factual")
    with pytest.raises(ValueError, match="do not start with different tokens"):
        P.ready_pair(loaded, "ioi")  # " Mary" and " John" both start with the byte " "
    with pytest.raises(P.PatchingError, match="no difference to patch"):
        P.activation_patching(loaded, P.tokenize_pair(loaded, P.PromptPair("same", "ab", "ab", "c", "d")))


def test_hooks_are_removed_and_other_threads_run_the_plain_model():
    loaded = load_model("toy-llama-gqa")
    pair = P.tokenize_pair(loaded, TOY_PAIR)
    plain = _logits(loaded.model, pair.corrupted_ids)
    errors, done = [], threading.Event()

    def patch():
        try:
            for _ in range(3):
                P.activation_patching(loaded, pair, "resid", batch=8)
                P.attribution_patching(loaded, pair)
        except Exception as exc:
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=patch)
    thread.start()
    checks = 0
    while not done.is_set():  # the model runs unpatched here while the other thread patches it
        assert torch.equal(_logits(loaded.model, pair.corrupted_ids), plain)
        checks += 1
    thread.join()
    assert checks > 0
    assert not errors, errors
    assert P._HOOKS.installed(loaded.model) == 0 and ko._HOOKS.installed(loaded.model) == 0
    assert not any(p.requires_grad for p in loaded.model.parameters())
    assert torch.equal(_logits(loaded.model, pair.corrupted_ids), plain)


def test_an_encoder_is_refused_with_a_reason(minilm):
    with pytest.raises(P.PatchingError, match="encoder"):
        P.tokenize_pair(minilm, TOY_PAIR)
