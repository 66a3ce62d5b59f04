import copy
import threading

import numpy as np
import pytest
import torch

from attnviz import knockout as ko
from attnviz.models import load_model

TEXT = "The cat sat on the mat. The cat sat on the mat."
TOYS = ("toy-gpt2", "toy-llama-gqa", "toy-bloom-alibi")


@pytest.fixture(scope="module", params=TOYS)
def toy(request):
    return load_model(request.param)


def _ids(loaded, text=TEXT):
    return loaded.tokenizer(text).input_ids


def _plain_logits(model, ids):
    """The model's own logits, float64, without attnviz in the way."""
    ids = torch.tensor([ids])
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[0].double()


def _edited_copy(loaded, heads, means=None):
    """A copy of the model with the heads' input columns of the output projection zeroed by hand (and, for a mean
    knock-out, their mean output folded into the projection's bias)."""
    model = copy.deepcopy(loaded.model)
    d_v = model_width(loaded) // loaded.shape.heads
    for layer, head in heads:
        proj = ko.output_projection(model, layer)
        cols = slice(head * d_v, (head + 1) * d_v)
        w = proj.weight.T if type(proj).__name__ == "Conv1D" else proj.weight  # [out, in]
        with torch.no_grad():
            if means is not None:
                extra = w[:, cols] @ means[layer][cols]
                if proj.bias is None:
                    proj.bias = torch.nn.Parameter(extra.clone(), requires_grad=False)
                else:
                    proj.bias += extra
            w[:, cols] = 0
    return model


def model_width(loaded):
    proj = ko.output_projection(loaded.model, 0)
    return proj.weight.shape[0] if type(proj).__name__ == "Conv1D" else proj.in_features


def _means_by_hook(loaded, ids):
    """Each layer's projection input averaged over positions, read by a hook written here."""
    seen = {}
    handles = [ko.output_projection(loaded.model, layer).register_forward_pre_hook(
        lambda m, args, layer=layer: seen.__setitem__(layer, args[0][0].double().mean(0).float()))
        for layer in range(loaded.shape.layers)]
    try:
        _plain_logits(loaded.model, ids)
    finally:
        for h in handles:
            h.remove()
    return seen


ROWS = [((1, 2),), ((0, 1), (1, 3)), ((0, 0),), ((1, 0), (1, 1))]


@pytest.mark.parametrize("share", [True, False])
def test_zero_knockout_equals_projection_columns_zeroed_by_hand(toy, share):
    ids = _ids(toy)
    out = ko.knocked_logits(toy, ids, ROWS, share_prefix=share)
    for b, heads in enumerate(ROWS):
        ref = _plain_logits(_edited_copy(toy, heads), ids)
        np.testing.assert_allclose(out[b].double().numpy(), ref.numpy(), atol=1e-5, rtol=0)
    assert (out[0] - torch.tensor(_plain_logits(toy.model, ids).numpy()).float()).abs().max() > 1e-3  # it does act


def test_batch_sharing_the_first_layers_equals_separate_runs(toy):
    ids = _ids(toy)
    rows = [((1, h),) for h in range(toy.shape.heads)]  # all in layer 1: layer 0 can run once for every row
    together = ko.knocked_logits(toy, ids, rows, mode="mean")
    for b, heads in enumerate(rows):
        alone = ko.knocked_logits(toy, ids, [heads], mode="mean")[0]
        np.testing.assert_allclose(together[b].numpy(), alone.numpy(), atol=1e-5, rtol=0)


def test_mean_knockout_equals_mean_folded_into_the_bias_by_hand(toy):
    ids = _ids(toy)
    means = _means_by_hook(toy, ids)
    out = ko.knocked_logits(toy, ids, ROWS, mode="mean")
    for b, heads in enumerate(ROWS):
        ref = _plain_logits(_edited_copy(toy, heads, means=means), ids)
        np.testing.assert_allclose(out[b].double().numpy(), ref.numpy(), atol=1e-5, rtol=0)


def test_knocking_out_nothing_changes_nothing(toy):
    ids = _ids(toy)
    out = ko.knocked_logits(toy, ids, [(), ()])
    ref = _plain_logits(toy.model, ids)
    np.testing.assert_allclose(out[1].double().numpy(), ref.numpy(), atol=1e-6, rtol=0)
    result = ko.knockout_effects(toy, ids, [()], target=(3, 5))
    assert result.delta_loss[0] == pytest.approx(0.0, abs=1e-6)
    assert result.delta_target[0] == pytest.approx(0.0, abs=1e-6)


def test_effects_equal_loss_and_target_log_probability_of_the_edited_copy(toy):
    ids = _ids(toy)
    position, token = 5, int(ids[6])
    rows = ko.every_head(toy)[:5] + [((0, 0), (1, 1))]
    result = ko.knockout_effects(toy, ids, rows, target=(position, token), batch=3)
    t = torch.tensor(ids)
    base = _plain_logits(toy.model, ids)
    assert result.base_loss == pytest.approx(float(torch.nn.functional.cross_entropy(base[:-1], t[1:])), abs=1e-6)
    for i, heads in enumerate(rows):
        logits = _plain_logits(_edited_copy(toy, heads), ids)
        loss = float(torch.nn.functional.cross_entropy(logits[:-1], t[1:]))
        logp = float(logits[position].log_softmax(-1)[token])
        assert result.loss[i] == pytest.approx(loss, abs=1e-5)
        assert result.target_logprob[i] == pytest.approx(logp, abs=1e-5)
    grid = result.grid(result.delta_loss, toy.shape.layers, toy.shape.heads)
    assert grid[0, 0] == pytest.approx(result.delta_loss[0]) and np.isnan(grid).sum() == grid.size - 5


def test_concurrent_knockouts_on_one_model_stay_independent():
    loaded = load_model("toy-llama-gqa")
    ids = _ids(loaded)
    expected = {h: ko.knocked_logits(loaded, ids, [((1, h),)])[0] for h in range(4)}
    got, errors = {}, []

    def run(h):
        try:
            for _ in range(5):
                got[h] = ko.knocked_logits(loaded, ids, [((1, h),)])[0]
                assert torch.equal(got[h], expected[h])
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(h,)) for h in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert ko._HOOKS.installed(loaded.model) == 0, "the hooks are removed when the last user is done"


@pytest.mark.parametrize("heads, message", [([(2, 0)], "Layer 2 does not exist"), ([(0, 4)], "Head 4 does not exist"),
                                            ([(-1, 0)], "Layer -1")])
def test_a_head_that_does_not_exist_gets_a_message(heads, message):
    loaded = load_model("toy-gpt2")
    with pytest.raises(ko.KnockoutError, match=message):
        ko.knockout_effects(loaded, _ids(loaded), [heads])


def test_bad_input_gets_a_message():
    loaded = load_model("toy-gpt2")
    ids = _ids(loaded)
    with pytest.raises(ko.KnockoutError, match="two tokens"):
        ko.knockout_effects(loaded, ids[:1], [((0, 0),)])
    with pytest.raises(ko.KnockoutError, match="outside the text"):
        ko.knockout_effects(loaded, ids, [((0, 0),)], target=(len(ids), 1))
    with pytest.raises(ko.KnockoutError, match="outside the vocabulary"):
        ko.knockout_effects(loaded, ids, [((0, 0),)], target=(1, 10**7))
    with pytest.raises(ko.KnockoutError, match="Unknown knock-out mode"):
        ko.knocked_logits(loaded, ids, [((0, 0),)], mode="half")
    with pytest.raises(ko.KnockoutError, match="No heads"):
        ko.knockout_effects(loaded, ids, [])


def test_an_encoder_is_refused_with_a_message(minilm):
    with pytest.raises(ko.KnockoutError, match="encoder"):
        ko.knockout_effects(minilm, _ids(minilm), [((0, 0),)])
    assert type(ko.output_projection(minilm.model, 0)).__name__ == "Linear"  # BERT's lives beside the attention


def test_smollm2_knockout_with_shared_first_layers_equals_the_edited_copy(smollm2):
    ids = _ids(smollm2, "The cat sat on the mat. The cat")
    rows = [((20, 3),), ((20, 8), (25, 1))]
    out = ko.knocked_logits(smollm2, ids, rows)
    assert ko._PREFIX_OK[smollm2.model]  # Llama's blocks broadcast one row's first layers to every row
    for b, heads in enumerate(rows):
        ref = _plain_logits(_edited_copy(smollm2, heads), ids)
        # float32 matmuls of a batch and of one row round differently: 3e-5 seen on logits of size ~20 (1.5e-6
        # relative to the largest); the toys above hold 1e-5 absolutely
        scale = float(ref.abs().max())
        np.testing.assert_allclose(out[b].double().numpy(), ref.numpy(), atol=1e-5 * scale, rtol=0)
