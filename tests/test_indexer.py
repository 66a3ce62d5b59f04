"""tests.indexer_oracle, the second reading the capture's indexed view is checked against
(tests/test_hybrid_capture.py): DeepSeek-V3.2's top-k selection on a tiny random model (index_topk 4, 20 tokens, so
the indexer drops keys), checked against the layer's own output, transformers' own attention weights with and
without the selection, and a float64 recomputation of the indexer's scores from its weights written here."""

from __future__ import annotations

import pytest
import torch

from tests.indexer_oracle import IndexerError, Selection, indexed_selection
from tests import mixer_models

N = 20
REL32 = 2e-5  # float32 rounding of sums over a few dozen terms, as tests/test_mixers.py


def _close(got, want, rel=REL32):
    err = (got.double() - want.double()).abs().max().item()
    scale = want.double().abs().max().item()
    assert err <= rel * scale, (err, scale)


@pytest.fixture(scope="module")
def model():
    return mixer_models.build("deepseek_v32")


@pytest.fixture(scope="module")
def ids():
    return mixer_models.text_ids(N)


@pytest.fixture(scope="module")
def selections(model, ids):
    return indexed_selection(model, ids)


def _one_pass(model, ids, hook) -> dict:
    """{layer index: what hook(layer, keep) made its hook keep} over a plain pass of the model as it is: hook
    registers a hook on the layer that calls keep(value) and returns its handle."""
    seen = {}
    handles = [hook(layer, lambda value, i=i: seen.__setitem__(i, value))
               for i, layer in enumerate(model.model.layers)]
    try:
        with torch.no_grad():
            model(ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _layer_outputs(model, ids) -> dict:
    """What each attention layer computed before its output projection, in a plain pass of the model as it is."""
    return _one_pass(model, ids, lambda layer, keep: layer.self_attn.o_proj.register_forward_pre_hook(
        lambda _m, args: keep(args[0][0].detach())))


def test_pattern_times_values_is_the_layer_output(model, ids, selections):
    assert sorted(selections) == [0, 1] and all(isinstance(s, Selection) for s in selections.values())
    outputs = _layer_outputs(model, ids)  # the model's own implementation (SDPA), not the recorder's eager pass
    for layer, selection in selections.items():
        heads = selection.pattern.shape[0]
        _close(selection.output().reshape(N, -1), outputs[layer])
        dense = torch.einsum("hts,hsd->thd", selection.dense, selection.value).reshape(N, -1)
        assert (dense - outputs[layer]).abs().max() > 0.05 * outputs[layer].abs().max()  # the selection matters
        assert selection.pattern.shape == selection.dense.shape == (heads, N, N)


def test_patterns_are_transformers_own_with_and_without_selection(model, ids, selections, monkeypatch):
    implementation = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            sparse = model(ids, use_cache=False, output_attentions=True).attentions
            for layer in model.model.layers:
                monkeypatch.setattr(layer.self_attn.indexer, "index_topk", N)  # every key kept: dense attention
            dense = model(ids, use_cache=False, output_attentions=True).attentions
    finally:
        model.set_attn_implementation(implementation)
    for layer, selection in selections.items():
        _close(selection.pattern, sparse[layer][0], rel=1e-6)
    # layer 0 sees the same input either way; later layers see what the sparse layers below made
    _close(selections[0].dense, dense[0][0], rel=1e-6)
    want_outside = (dense[0][0].double() * ~selections[0].kept).sum(-1)
    _close(selections[0].outside, want_outside, rel=1e-6)


def _rms(x, weight, eps):
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * weight


def _index_scores(attention, hidden, cos, sin) -> torch.Tensor:
    """The indexer's scores [query, key] in float64 from its weights: index heads q (from the attention's
    normalised query latent) and one shared key (LayerNorm), RoPE on their first qk_rope_head_dim channels (the
    half-split form), ReLU(q.k / sqrt(d)) weighted per query and head (weights_proj / sqrt(heads)), causal."""
    ix = attention.indexer
    h = hidden.double()
    latent = _rms(h @ attention.q_a_proj.weight.double().T, attention.q_a_layernorm.weight.double(),
                  attention.q_a_layernorm.variance_epsilon)
    heads, dim, rope = ix.n_heads, ix.head_dim, ix.qk_rope_head_dim
    q = (latent @ ix.wq_b.weight.double().T).view(-1, heads, dim)  # [N, index head, d]
    k = torch.nn.functional.layer_norm(h @ ix.wk.weight.double().T, (dim,), ix.k_norm.weight.double(),
                                       ix.k_norm.bias.double(), ix.k_norm.eps)  # [N, d]
    cos, sin = cos.double(), sin.double()

    def rotated(x, c, s):
        half = rope // 2
        turned = torch.cat([-x[..., half:rope], x[..., :half]], dim=-1)
        return torch.cat([x[..., :rope] * c + turned * s, x[..., rope:]], dim=-1)

    q, k = rotated(q, cos[:, None, :], sin[:, None, :]), rotated(k, cos, sin)
    scores = torch.relu(torch.einsum("thd,sd->ths", q, k) * dim ** -0.5)
    weights = (h @ ix.weights_proj.weight.double().T) * heads ** -0.5  # [N, index head]
    index = torch.einsum("th,ths->ts", weights, scores)
    return index.masked_fill(torch.ones_like(index, dtype=torch.bool).triu(1), float("-inf"))


def test_float64_indexer_scores_pick_the_same_keys(model, ids, selections):
    seen = _one_pass(model, ids, lambda layer, keep: layer.self_attn.register_forward_pre_hook(
        lambda _m, _a, kwargs: keep((kwargs["hidden_states"][0], *(x[0] for x in kwargs["position_embeddings"]))),
        with_kwargs=True))
    topk = model.config.index_topk
    strict = 0
    for layer, selection in selections.items():
        with torch.no_grad():
            index = _index_scores(model.model.layers[layer].self_attn, *seen[layer])
        for t in range(N):
            kept = selection.kept[t]
            assert kept.sum() == min(topk, t + 1)
            dropped = selection.allowed[t] & ~kept
            if dropped.any():  # a top-k: every kept key scores at least as high as every dropped one
                low, high = index[t][kept].min().item(), index[t][dropped].max().item()
                assert low >= high - 1e-5 * max(abs(low), abs(high), 1e-6)
                if low - high > 1e-5 * abs(low):  # no near-tie at the border: the sets are the same keys
                    assert torch.equal(kept, index[t] >= low)
                    strict += 1
    assert strict >= N  # most queries' borders are clear, so the sets are compared, not only their scores


def test_kept_and_outside_add_to_one(selections):
    for selection in selections.values():
        kept_mass = (selection.dense * selection.kept).sum(-1)
        _close(kept_mass + selection.outside, torch.ones_like(kept_mass), rel=1e-6)
        assert selection.outside.max() > 0.1  # at 20 tokens the selection drops real mass
        assert torch.equal(selection.kept, selection.kept & selection.allowed)
        assert torch.equal(selection.allowed, torch.ones(N, N, dtype=torch.bool).tril())
        _close(selection.pattern.sum(-1), torch.ones_like(kept_mass), rel=1e-6)
        assert torch.all(selection.pattern[:, ~selection.kept] == 0)


def test_early_queries_keep_all_their_keys(model, selections):
    # the top-k is taken after the causal mask: query t < topk keeps its t + 1 keys, and the rest of its top-k
    # names later keys, which the causal mask hides
    topk = model.config.index_topk
    selection = selections[0]
    assert selection.picked.shape == (N, topk)
    assert (selection.picked[0] > 0).sum() == topk - 1
    for t in range(topk):
        assert torch.equal(selection.kept[t], torch.arange(N) <= t)


@pytest.mark.parametrize("n", [1, 3, 4])
def test_short_texts_keep_every_key(model, n):
    # N <= index_topk: the indexer keeps everything, so the layer is dense and nothing is outside
    for selection in indexed_selection(model, mixer_models.text_ids(n)).values():
        assert torch.equal(selection.kept, torch.ones(n, n, dtype=torch.bool).tril())
        assert torch.all(selection.outside == 0)
        assert torch.equal(selection.pattern, selection.dense)


def test_the_model_is_left_as_it_was(model, ids):
    import transformers.models.deepseek_v32.modeling_deepseek_v32 as source

    eager = source.eager_attention_forward
    with torch.no_grad():
        before = model(ids, use_cache=False).logits
    indexed_selection(model, ids)
    with torch.no_grad():
        after = model(ids, use_cache=False).logits
    assert model.config._attn_implementation == "sdpa"
    assert source.eager_attention_forward is eager
    assert torch.equal(before, after)


def test_bad_input_is_refused(model):
    with pytest.raises(IndexerError, match="one text at a time"):
        indexed_selection(model, torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(IndexerError, match="no indexed"):
        indexed_selection(mixer_models.build("qwen3_5_text"), mixer_models.text_ids(5))
