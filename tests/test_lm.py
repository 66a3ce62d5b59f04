"""attnviz.lm: next-token loss and top-k against transformers' own loss and a per-position loop."""

import math

import numpy as np
import pytest
import torch

from attnviz.lm import NotALanguageModel, next_token_logits, token_losses, top_k
from attnviz.models import load_model


def test_token_losses_mean_is_transformers_own_loss():
    loaded = load_model("toy-llama-gqa")
    ids = loaded.tokenizer("The cat sat on the mat. The cat sat.", return_tensors="pt").input_ids
    logits = next_token_logits(loaded.model, ids[0])
    losses = token_losses(logits[0], ids[0])
    with torch.no_grad():
        reference = loaded.model(input_ids=ids, labels=ids).loss.item()  # transformers shifts and averages
    assert losses.shape == (ids.shape[1] - 1,)
    assert losses.mean() == pytest.approx(reference, rel=1e-5)


def test_top_k_and_the_actual_token_by_a_loop():
    rng = np.random.default_rng(0)
    logits = torch.tensor(rng.normal(size=(6, 11)) * 3)
    ids = torch.tensor([3, 1, 4, 1, 5, 9])
    out = top_k(logits, ids, k=3)
    for t in range(6):
        z = logits[t].numpy()
        p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        order = sorted(range(11), key=lambda i: -p[i])
        assert list(out.ids[t]) == order[:3]
        np.testing.assert_allclose(out.probs[t], p[order[:3]], rtol=1e-12)
        if t < 5:
            assert out.actual_prob[t] == pytest.approx(p[ids[t + 1]], rel=1e-12)
            assert out.actual_rank[t] == order.index(int(ids[t + 1]))
            assert token_losses(logits, ids)[t] == pytest.approx(-math.log(p[ids[t + 1]]), rel=1e-12)


def test_an_encoder_predicts_no_next_token():
    loaded = load_model("toy-gpt2")
    assert next_token_logits(loaded.model, [1, 2, 3]).shape[:2] == (1, 3)
    from transformers import BertConfig, BertModel

    bert = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                vocab_size=50)).eval()
    with pytest.raises(NotALanguageModel):
        next_token_logits(bert, [1, 2, 3])


# -- predictions at any length: fused attention, the head a block of positions at a time --------------------------

LONG_TEXT = "The cat sat on the mat because it was warm, and the dog sat by the door all day long. " * 7


def _own_reference(model, ids):
    """transformers' own logits of every position (eager attention, the whole [n, vocab] at once), float64."""
    with torch.no_grad():
        return model(input_ids=ids[None], attention_mask=torch.ones_like(ids)[None]).logits[0].double()


@pytest.mark.parametrize("name", ["toy-gpt2", "toy-llama-gqa"])
def test_predictions_are_transformers_own_cross_entropy_and_top_k(name):
    from attnviz.lm import predictions

    loaded = load_model(name)
    ids = torch.tensor(loaded.tokenizer(LONG_TEXT).input_ids)
    n = len(ids)
    assert n > 600
    got = predictions(loaded.model, ids, k=5, block=64)  # 10 blocks, the last one short
    logits = _own_reference(loaded.model, ids)
    reference = torch.nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="none").numpy()
    np.testing.assert_allclose(got.losses, reference, atol=2e-5)
    probs = torch.softmax(logits, dim=-1)
    top = torch.topk(probs, 5, dim=-1)
    assert (got.top.ids == top.indices.numpy()).mean() > 0.999  # near-ties may swap between two float32 paths
    np.testing.assert_allclose(np.sort(got.top.probs, axis=1), np.sort(top.values.numpy(), axis=1), atol=2e-5)
    actual = probs[torch.arange(n - 1), ids[1:]]
    np.testing.assert_allclose(got.top.actual_prob, actual.numpy(), atol=2e-5)
    ranks = (probs[:-1] > actual[:, None]).sum(-1).numpy()
    assert (got.top.actual_rank == ranks).mean() > 0.99
    assert got.losses.shape == (n - 1,) and got.top.ids.shape == (n, 5)


def test_the_blocked_head_equals_the_whole_one_and_never_holds_more_than_a_block():
    from attnviz.lm import predictions

    loaded = load_model("toy-llama-gqa")
    ids = torch.tensor(loaded.tokenizer(LONG_TEXT).input_ids)
    head = loaded.model.get_output_embeddings()
    rows = []
    handle = head.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[-2]))
    try:
        blocked = predictions(loaded.model, ids, block=50)
    finally:
        handle.remove()
    whole = predictions(loaded.model, ids, block=len(ids))
    # float32 matmuls of a block and of the whole may round apart in the last bit
    np.testing.assert_allclose(blocked.losses, whole.losses, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(blocked.top.ids, whole.top.ids)
    np.testing.assert_allclose(blocked.top.probs, whole.top.probs, rtol=1e-5)
    np.testing.assert_array_equal(blocked.top.actual_rank, whole.top.actual_rank)
    # the model's own pass computes its last position only (logits_to_keep=1); every other call is one block
    assert rows[0] == 1 and max(rows[1:]) == 50 and sum(rows[1:]) == len(ids)


def test_predictions_never_run_dense_attention(monkeypatch):
    """The forward pass goes through SDPA: the family's eager attention (which builds [head, n, n]) is never
    called, while a plain forward of the same model does call it."""
    import transformers.models.llama.modeling_llama as llama

    from attnviz.lm import predictions

    loaded = load_model("toy-llama-gqa")
    ids = torch.tensor(loaded.tokenizer(LONG_TEXT).input_ids)
    calls = []
    eager = llama.eager_attention_forward
    monkeypatch.setattr(llama, "eager_attention_forward", lambda *a, **k: calls.append(1) or eager(*a, **k))
    predictions(loaded.model, ids)
    assert not calls
    next_token_logits(loaded.model, ids[:20])
    assert calls


def test_predictions_of_every_causal_family_match_its_own_logits(tmp_path_factory):
    """Every family of tests/families.py, saved and loaded as a user's folder: the blocked head with the family's
    transform of its logits (Gemma 2's soft-cap, Granite's and Cohere's scales) gives the model's own losses."""
    from attnviz.lm import predictions
    from tests.families import ENCODERS, FAMILIES, build_family

    root = tmp_path_factory.mktemp("families")
    for name in (f for f in FAMILIES if f not in ENCODERS):
        loaded = load_model(str(build_family(name, root)))
        ids = torch.tensor(loaded.tokenizer("The cat sat on the mat. The cat sat on the mat.").input_ids)
        got = predictions(loaded.model, ids, block=7)
        logits = _own_reference(loaded.model, ids)
        reference = torch.nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="none").numpy()
        np.testing.assert_allclose(got.losses, reference, atol=2e-5, err_msg=name)


def test_a_logit_transform_attnviz_does_not_reproduce_is_refused(monkeypatch, tmp_path):
    """Gemma 2 soft-caps its logits; without that step the last row disagrees with the model's own, and the
    predictions are refused rather than shown wrong."""
    from attnviz import lm
    from tests.families import build_family

    loaded = load_model(str(build_family("gemma2", tmp_path)))
    ids = torch.tensor(loaded.tokenizer("The cat sat on the mat.").input_ids)
    monkeypatch.setattr(lm, "_transformed", lambda config, logits: logits)
    with pytest.raises(lm.PredictionError, match="transforms its logits"):
        lm.predictions(loaded.model, ids)


@pytest.mark.parametrize("name", ["toy-gpt2", "toy-llama-gqa"])
def test_the_memory_estimate_covers_what_predictions_allocate(name):
    """prediction_bytes against the peak of torch's CPU allocator during predictions(), measured at 4,000 tokens
    (the toys take 4,096) with a small and a large block."""
    from attnviz.kernels.timing import peak_cpu_bytes
    from attnviz.lm import prediction_bytes, predictions

    loaded = load_model(name)
    ids = torch.randint(0, 256, (4000,), generator=torch.Generator().manual_seed(0))
    for block in (64, 1024):
        peak = peak_cpu_bytes(lambda: predictions(loaded.model, ids, block=block))
        estimate = prediction_bytes(loaded.model.config, 4000, block=block)
        assert peak is not None and peak <= estimate, (block, peak, estimate)


@pytest.mark.slow
def test_smollm2_predictions_are_its_own_cross_entropy(smollm2):
    from attnviz.lm import predictions

    ids = torch.tensor(smollm2.tokenizer("The capital of France is Paris. The capital of Italy is Rome. "
                                         "The capital of Spain is Madrid.").input_ids)
    got = predictions(smollm2.model, ids, block=8)
    logits = _own_reference(smollm2.model, ids)
    reference = torch.nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="none").numpy()
    np.testing.assert_allclose(got.losses, reference, atol=1e-4)
    np.testing.assert_array_equal(got.top.ids[:, 0], logits.argmax(-1).numpy())
    assert got.losses[-1] < 1.0  # "Madrid" after two examples of the pattern
