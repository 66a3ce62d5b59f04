"""attnviz.capture against transformers' own output_attentions, float64 references and the model config."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import torch

from attnviz.capture import CaptureError, attention_modules, capture_attention
from attnviz.models import load_model

TEXT = "The cat sat on the mat. The cat sat on the mat."
TOYS = ("toy-gpt2", "toy-llama-gqa", "toy-bloom-alibi")


@pytest.fixture(scope="module")
def toys():
    return {name: load_model(name) for name in TOYS}


def reference_attentions(loaded, text: str) -> np.ndarray:
    """transformers' own output_attentions: [layer, head, query, key]."""
    enc = loaded.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        out = loaded.model(**enc, output_attentions=True)
    return np.stack([a[0].numpy() for a in out.attentions])


def check_against_transformers(loaded, text: str = TEXT):
    cap = capture_attention(loaded, text)
    ref = reference_attentions(loaded, text)
    assert cap.pattern.dtype == np.float32
    assert cap.pattern.shape == ref.shape
    assert np.array_equal(cap.pattern, ref)  # bit for bit
    assert np.allclose(cap.pattern.astype(np.float64).sum(-1), 1.0, atol=1e-5)
    return cap


@pytest.mark.parametrize("name", TOYS)
def test_toy_patterns_equal_output_attentions(toys, name):
    cap = check_against_transformers(toys[name])
    n = len(cap.tokens)
    assert cap.causal
    above = np.triu(np.ones((n, n), dtype=bool), k=1)
    assert np.all(cap.pattern[..., above] == 0.0)
    assert cap.tokens[0] == "<bos>" and cap.tokens[4] == "␣"  # " cat" -> ␣ visible
    assert cap.token_ids == toys[name].tokenizer(TEXT).input_ids


@pytest.mark.parametrize("name", TOYS)
def test_a_capture_with_logits_is_one_pass_giving_the_models_own_logits(toys, name):
    """with_logits: the same weights as transformers' output_attentions, and the logits of its own forward pass."""
    loaded = toys[name]
    cap = capture_attention(loaded, TEXT, with_logits=True)
    assert np.array_equal(cap.pattern, reference_attentions(loaded, TEXT))
    with torch.no_grad():
        logits = loaded.model(**loaded.tokenizer(TEXT, return_tensors="pt")).logits[0]
    assert cap.logits.shape == logits.shape
    torch.testing.assert_close(cap.logits, logits.float(), atol=1e-5, rtol=1e-5)
    assert capture_attention(loaded, TEXT).logits is None


def test_an_encoder_has_no_logits_to_capture(minilm):
    with pytest.raises(CaptureError, match="not a causal language model"):
        capture_attention(minilm, TEXT, with_logits=True)


def test_minilm_pattern_equals_output_attentions(minilm):
    cap = check_against_transformers(minilm)
    assert not cap.causal
    assert cap.pattern.shape[:2] == (6, 12)
    n = len(cap.tokens)
    assert (cap.pattern[..., np.triu(np.ones((n, n), dtype=bool), k=1)] > 0).all()  # a bidirectional encoder
    assert cap.tokens[0] == "[CLS]" and cap.tokens[-1] == "[SEP]"


def test_smollm2_pattern_equals_output_attentions(smollm2):
    cap = check_against_transformers(smollm2)
    n = len(cap.tokens)
    assert cap.pattern.shape == (30, 9, n, n)
    assert np.all(cap.pattern[..., np.triu(np.ones((n, n), dtype=bool), k=1)] == 0.0)
    assert "".join(cap.tokens).replace("␣", " ") == TEXT


def test_gqa_mapping_matches_config_and_behaviour(toys):
    """Perturbing KV head j's key weights changes exactly the query heads that kv_head_of maps to j."""
    loaded = load_model("toy-llama-gqa")  # a private copy: its weights are changed below
    config = loaded.model.config
    cap = capture_attention(loaded, TEXT, layers=[0])
    assert len(cap.kv_head_of) == config.num_attention_heads == 4
    assert sorted(set(cap.kv_head_of)) == list(range(config.num_key_value_heads))
    k_proj = attention_modules(loaded.model)[0].k_proj
    head_dim = config.hidden_size // config.num_attention_heads
    for j in range(config.num_key_value_heads):
        with torch.no_grad():
            saved = k_proj.weight.clone()
            k_proj.weight[j * head_dim:(j + 1) * head_dim] *= 3.0
        changed = capture_attention(loaded, TEXT, layers=[0]).pattern
        with torch.no_grad():
            k_proj.weight.copy_(saved)
        moved = [h for h in range(4) if not np.allclose(changed[0, h], cap.pattern[0, h])]
        assert moved == [h for h in range(4) if cap.kv_head_of[h] == j]


def test_smollm2_gqa_mapping(smollm2):
    cap = capture_attention(smollm2, "Hi", layers=[0])
    assert cap.kv_head_of == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # 9 query heads in 3 groups of 3 (config: 9 / 3)


def test_layer_subset_and_float16(toys):
    loaded = toys["toy-llama-gqa"]
    full = capture_attention(loaded, TEXT)
    last = capture_attention(loaded, TEXT, layers=[-1])
    assert last.layers == [1]
    assert np.array_equal(last.pattern[0], full.pattern[1])
    half = capture_attention(loaded, TEXT, dtype=np.float16)
    assert half.pattern.dtype == np.float16
    assert np.allclose(half.pattern, full.pattern, atol=1e-3)


def _gpt2_scores_float64(loaded, text: str, layer: int) -> np.ndarray:
    """q.k / sqrt(d) + causal -inf, recomputed in float64 from the layer's input hidden state."""
    enc = loaded.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        hidden = loaded.model(**enc, output_hidden_states=True).hidden_states[layer][0].double()
    block = loaded.model.transformer.h[layer]
    x = torch.nn.functional.layer_norm(hidden, (hidden.shape[-1],), block.ln_1.weight.double(),
                                       block.ln_1.bias.double(), block.ln_1.eps)
    qkv = x @ block.attn.c_attn.weight.double() + block.attn.c_attn.bias.double()  # Conv1D: x W + b
    d_model = hidden.shape[-1]
    n_heads = loaded.model.config.n_head
    d = d_model // n_heads
    q = qkv[:, :d_model].reshape(-1, n_heads, d).transpose(0, 1)
    k = qkv[:, d_model:2 * d_model].reshape(-1, n_heads, d).transpose(0, 1)
    scores = q @ k.transpose(1, 2) / math.sqrt(d)
    n = scores.shape[-1]
    return scores.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf")).numpy()


def test_gpt2_scores_match_float64_reference(toys):
    loaded = toys["toy-gpt2"]
    cap = capture_attention(loaded, TEXT, with_scores=True)
    ref = _gpt2_scores_float64(loaded, TEXT, layer=1)
    assert cap.scaling == pytest.approx(1 / math.sqrt(16)) and cap.head_dim == 16
    finite = np.isfinite(ref)
    assert np.array_equal(np.isfinite(cap.scores[1]), finite)
    assert np.allclose(cap.scores[1][finite], ref[finite], atol=1e-4)


@pytest.mark.parametrize("name", TOYS)
def test_softmax_of_scores_is_pattern(toys, name):
    cap = capture_attention(toys[name], TEXT, with_scores=True)
    probs = torch.softmax(torch.tensor(cap.scores, dtype=torch.float64), dim=-1).numpy()  # a copy: scores are read-only
    assert np.allclose(probs, cap.pattern, atol=1e-6)
    n = len(cap.tokens)
    assert np.all(np.isneginf(cap.scores[..., np.triu(np.ones((n, n), dtype=bool), 1)]))


def test_smollm2_scores(smollm2):
    cap = capture_attention(smollm2, TEXT, layers=[3, 20], with_scores=True)
    assert cap.scaling == pytest.approx(1 / 8) and cap.head_dim == 64  # head_dim 576 / 9 = 64
    probs = torch.softmax(torch.tensor(cap.scores, dtype=torch.float64), dim=-1).numpy()
    assert np.allclose(probs, cap.pattern, atol=1e-6)


def test_smollm2_later_layers_sink_on_first_token(smollm2):
    """Measured: in layers 10-29 the queries after the 4th put ~0.8 of their attention on token 0 (layer means
    0.6-0.95); we assert the mean over those layers is above 0.5 and far above a uniform share."""
    text = ("Attention sinks appear when a model has nowhere useful to look, so it parks the attention on the "
            "first token of the sequence, which every later token can see.")
    cap = capture_attention(smollm2, text, layers=range(10, 30))
    n = len(cap.tokens)
    sink = cap.pattern[:, :, 4:, 0].mean()
    uniform = np.mean(1.0 / np.arange(5, n + 1))
    assert sink > 0.5
    assert sink > 5 * uniform


def _hook_counts(model) -> list[tuple[int, int]]:
    """Hooks on each attention module (transformers' output_attentions leaves its own, so compare counts)."""
    return [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in attention_modules(model)]


def test_threads_share_one_model_without_mixing(smollm2):
    texts = ["One two three four.", "A completely different sentence here, longer than the others are.",
             "Short.", "Numbers 1 2 3 4 5 6 7 8 9 and letters a b c."]
    expected = {t: capture_attention(smollm2, t, layers=[0, 4, 8]) for t in texts}
    hooks_before = _hook_counts(smollm2.model)
    results: dict[int, object] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(texts) * 2)

    def work(i: int):
        try:
            barrier.wait()
            results[i] = capture_attention(smollm2, texts[i % len(texts)], layers=[0, 4, 8])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(texts) * 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, cap in results.items():
        want = expected[texts[i % len(texts)]]
        assert cap.tokens == want.tokens
        assert np.array_equal(cap.pattern, want.pattern)
    assert _hook_counts(smollm2.model) == hooks_before


def test_hooks_are_removed_after_errors(toys):
    loaded = toys["toy-gpt2"]
    before = _hook_counts(loaded.model)
    with pytest.raises(CaptureError):
        capture_attention(loaded, TEXT, layers=[7])
    capture_attention(loaded, TEXT)

    def fail(*_args, **_kwargs):
        raise RuntimeError("boom")

    with pytest.raises(CaptureError, match="RuntimeError: boom"):  # a message for the page, the cause chained
        # layer 0: the forward pass stops inside the last wanted layer's attention, before its module's hooks
        handle = attention_modules(loaded.model)[0].register_forward_hook(fail)
        try:
            capture_attention(loaded, TEXT)
        finally:
            handle.remove()
    assert _hook_counts(loaded.model) == before


@pytest.mark.parametrize("text, kwargs, message", [
    ("", {}, "empty"),
    ("   \n ", {}, "empty"),
    ("x" * 50, {"max_tokens": 20}, "51 tokens"),
    (TEXT, {"layers": [5]}, "Layer 5 does not exist"),
    (TEXT, {"layers": []}, "No layers"),
    (TEXT, {"dtype": np.float64}, "float32 or float16"),
])
def test_bad_input_messages(toys, text, kwargs, message):
    with pytest.raises(CaptureError, match=message):
        capture_attention(toys["toy-gpt2"], text, **kwargs)


def test_memory_limit_message(toys, monkeypatch):
    monkeypatch.setattr("attnviz.capture.run.MAX_CAPTURE_BYTES", 1000)
    with pytest.raises(CaptureError, match="GiB"):
        capture_attention(toys["toy-gpt2"], TEXT)


def test_model_without_attention_weights_is_a_clear_error():
    # BLOOM is read by hooks from its module's output (the families of the attention interface are read inside
    # the registered attention function, where a module hook cannot drop the weights)
    loaded = load_model("toy-bloom-alibi")  # private copy: a hook below drops its weights
    handle = attention_modules(loaded.model)[0].register_forward_hook(lambda m, a, out: (out[0], None))
    try:
        with pytest.raises(CaptureError, match="returned no attention weights"):
            capture_attention(loaded, TEXT)
    finally:
        handle.remove()
    with pytest.raises(CaptureError, match="No attention modules"):
        attention_modules(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_readable_tokens_show_whitespace_and_split_characters(toys):
    from attnviz.tokenizer import readable_tokens

    tok = toys["toy-gpt2"].tokenizer
    tokens = readable_tokens(tok, tok("a b\nï\t").input_ids)
    expected_bytes = [f"<0x{b:02X}>" for b in "ï".encode("utf-8")]
    assert tokens == ["<bos>", "a", "␣", "b", "↵", *expected_bytes, "⇥"]
    # other control characters by their code: a label holding one stopped plotly's figure export
    assert readable_tokens(tok, tok("\x10\x7f").input_ids)[1:] == ["<0x10>", "<0x7F>"]


def test_a_model_that_fails_on_the_text_gives_a_capture_error(monkeypatch):
    loaded = load_model("toy-gpt2")
    runner = loaded.model.base_model

    def broken(*args, **kwargs):
        raise RuntimeError("cannot reshape tensor of 0 elements")

    monkeypatch.setattr(runner, "forward", broken)
    with pytest.raises(CaptureError, match="failed on this text: RuntimeError"):
        capture_attention(loaded, "hello")


def test_encoder_decoder_models_are_refused_with_a_message():
    from transformers import T5Config, T5Model

    from attnviz.models import LoadedModel, ModelSpec
    from attnviz.tokenizer import byte_tokenizer

    config = T5Config(vocab_size=257, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2)
    loaded = LoadedModel(T5Model(config).eval(), byte_tokenizer(), ModelSpec("t5", "t5", "local", True, None, ""))
    with pytest.raises(CaptureError, match="encoder-decoder"):
        capture_attention(loaded, "hello")


def test_values_are_kept_on_request_follow_select_and_are_refused_where_not_recorded():
    from attnviz.capture import CaptureError, capture_attention
    from attnviz.models import load_model

    loaded = load_model("toy-llama-gqa")
    capture = capture_attention(loaded, "one two three", with_values=True)
    assert capture_attention(loaded, "one two three").values is None
    n = capture.n_tokens
    assert capture.values[1].shape == (loaded.shape.kv_heads, n, loaded.shape.head_dim)
    assert capture.select([1]).values[1] is capture.values[1]
    with pytest.raises(CaptureError, match="value vectors"):
        capture_attention(load_model("toy-bloom-alibi"), "one two", with_values=True)


def test_recording_forward_runs_the_whole_model_and_records_every_layer():
    import torch

    from attnviz.capture import recording_forward
    from attnviz.models import load_model

    loaded = load_model("toy-gpt2")
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        plain = loaded.model(input_ids=ids, output_attentions=True)
        with recording_forward(loaded.model) as rec:
            logits = loaded.model(input_ids=ids).logits
    assert torch.equal(logits, plain.logits)  # not stopped after the last layer
    for layer, weights in enumerate(plain.attentions):
        np.testing.assert_array_equal(rec.pattern[layer], weights[0].numpy())


def test_token_ids_instead_of_a_text_equal_the_texts_own_tokens(toys):
    """Capturing the ids a text tokenizes into equals capturing the text; ids no text gives are captured too."""
    loaded = toys["toy-llama-gqa"]
    ids = loaded.tokenizer(TEXT).input_ids
    by_text = capture_attention(loaded, TEXT)
    by_ids = capture_attention(loaded, "", token_ids=ids)
    np.testing.assert_array_equal(by_ids.pattern, by_text.pattern)
    assert by_ids.tokens == by_text.tokens and by_ids.token_ids == by_text.token_ids
    odd = capture_attention(loaded, "", token_ids=[256, 255, 0, 255])
    assert odd.token_ids == [256, 255, 0, 255] and odd.pattern.shape[-1] == 4


@pytest.mark.parametrize("store", ["pattern", "qk"])
def test_each_mask_is_read_once_per_capture(monkeypatch, store):
    """Every layer gets the same mask object from transformers: its rule is read once, not once per layer, and each
    layer's captured rule is that one."""
    import importlib

    recording = importlib.import_module("attnviz.capture.recording")  # attnviz.capture.recording is also a function
    reads = []
    real = recording._mask_rule
    monkeypatch.setattr(recording, "_mask_rule", lambda *args: reads.append(args[0]) or real(*args))
    capture = capture_attention(load_model("toy-llama-gqa"), "a mask read once", store=store)
    assert len(capture.layers) == 2 and len(reads) == 1
    assert capture.inputs[0].mask is capture.inputs[1].mask


def test_store_auto_picks_by_size_and_reads_the_model_once(toys, monkeypatch):
    """store="auto": the pattern while [layers asked for, head, n, n] float32 fits MAX_CAPTURE_BYTES, else q and k
    (the limit worked out here from the sizes); the model's attention modules and its linear plan are read once for
    both the choice and the capture."""
    import attnviz.capture.loading as loading
    import attnviz.capture.run as run

    loaded = toys["toy-llama-gqa"]
    reads = []

    def counted(name, read):
        return lambda model: reads.append(name) or read(model)

    for module in (run, loading):
        monkeypatch.setattr(module, "numbered_attention", counted("attention", module.numbered_attention))
    monkeypatch.setattr(run, "linear_plan", counted("plan", run.linear_plan))
    cap = capture_attention(loaded, TEXT, layers=[0], store="auto")
    assert cap.store == "pattern" and sorted(reads) == ["attention", "plan"]
    assert np.array_equal(cap.pattern, capture_attention(loaded, TEXT, layers=[0]).pattern)
    one_layer = loaded.shape.heads * cap.n_tokens ** 2 * 4
    monkeypatch.setattr(run, "MAX_CAPTURE_BYTES", one_layer)  # one layer's pattern fits exactly, two do not
    assert capture_attention(loaded, TEXT, layers=[0], store="auto").store == "pattern"
    two = capture_attention(loaded, TEXT, layers=[0, 1], store="auto")
    assert two.store == "qk" and two.pattern is None
    monkeypatch.setattr(run, "MAX_CAPTURE_BYTES", one_layer - 1)
    assert capture_attention(loaded, TEXT, layers=[0], store="auto").store == "qk"
