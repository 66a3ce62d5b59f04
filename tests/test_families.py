"""attnviz.capture on a tiny random model of every supported family, loaded from a folder as a user's model is,
against transformers' own eager output_attentions of an independently loaded copy of the same folder."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
import torch

from attnviz import attention as core
from attnviz.capture import CaptureError, capture_attention, inputs_bytes
from attnviz.models import load_model
from tests.families import CHECKED, ENCODERS, KV_HEADS, LAYOUTS, build_family

# attnviz loads a model onto the GPU when there is one, while the reference runs on the CPU: a GPU's float32
# rounding differs from the CPU's by about 1e-6 (1.3e-6 seen on an H100), so the comparisons with it allow 1e-5 there
REF_ATOL = 1e-5 if torch.cuda.is_available() else 1e-6
TEXT = "The cat sat on the mat and the dog too."  # 40 tokens with <bos>: longer than the sliding window (8)
SINKS = ("gpt_oss",)
# family -> the layers with a sliding window (layer_types, or every layer for Mistral)
SLIDING = {"mistral": [0, 1], "gemma2": [0], "gemma3_text": [0], "gpt_oss": [0]}


@pytest.fixture(scope="session")
def families_root(tmp_path_factory):
    return tmp_path_factory.mktemp("families")


class Family:
    """One family's folder, attnviz's model and captures, and transformers' reference, each made once."""

    def __init__(self, name: str, root):
        self.name = name
        self.folder = build_family(name, root)
        self.loaded = load_model(str(self.folder))
        self._captures: dict[str, object] = {}
        self._reference = None

    def capture(self, store: str = "pattern"):
        if store not in self._captures:
            self._captures[store] = capture_attention(self.loaded, TEXT, store=store)
        return self._captures[store]

    @property
    def reference(self) -> np.ndarray:
        """output_attentions [layer, head, query, key] of the folder loaded by transformers alone, eager."""
        if self._reference is None:
            from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

            auto = AutoModel if self.name in ENCODERS else AutoModelForCausalLM
            model = auto.from_pretrained(str(self.folder), attn_implementation="eager", dtype=torch.float32)
            model.eval()
            assert model.config._attn_implementation == "eager"
            tokenizer = AutoTokenizer.from_pretrained(str(self.folder))
            enc = tokenizer(TEXT, return_tensors="pt")
            with torch.no_grad():
                out = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, output_attentions=True,
                            use_cache=False)
            self._reference = np.stack([a[0].float().numpy() for a in out.attentions])
        return self._reference


@pytest.fixture(scope="session")
def family_of(families_root):
    @lru_cache(maxsize=None)
    def get(name: str) -> Family:
        return Family(name, families_root)

    return get


def _softmax64(scores: np.ndarray, sink: np.ndarray | None = None) -> np.ndarray:
    """float64 softmax over keys of [..., query, key] logits (-inf masked), with an optional extra logit column
    sink [...] broadcast over queries, which takes part in the normalisation and is dropped from the result."""
    s = scores.astype(np.float64)
    if sink is not None:
        column = np.broadcast_to(sink.astype(np.float64)[..., None, None], s.shape[:-1] + (1,))
        s = np.concatenate([s, column], axis=-1)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    p = e / e.sum(-1, keepdims=True)
    return p[..., :scores.shape[-1]]


@pytest.mark.parametrize("name", CHECKED, ids=CHECKED)
def test_pattern_store_equals_output_attentions(family_of, name):
    fam = family_of(name)
    cap = fam.capture("pattern")
    ref = fam.reference
    assert cap.pattern.shape == ref.shape
    assert cap.pattern.shape[0] == 2 and cap.n_tokens == len(TEXT.encode()) + 1
    np.testing.assert_allclose(cap.pattern, ref, rtol=0, atol=REF_ATOL)
    assert cap.causal == (name not in ENCODERS)
    assert cap.inputs is not None


@pytest.mark.parametrize("name", CHECKED, ids=CHECKED)
def test_qk_store_equals_output_attentions(family_of, name):
    fam = family_of(name)
    cap = fam.capture("qk")
    assert cap.pattern is None and cap.store == "qk"
    ref = fam.reference
    for i, layer in enumerate(cap.layers):
        # 1e-5, not 1e-6: the qk store's forward pass runs torch's SDPA (or attnviz's block-wise core for soft-cap
        # and sink families) instead of the eager matmul-softmax-matmul, so the hidden states that reach layer 1
        # differ from eager's by float32 rounding; the core itself is exact (next test).
        np.testing.assert_allclose(cap.layer_rows(layer), ref[i], rtol=0, atol=1e-5)
        np.testing.assert_allclose(cap.head_pattern(layer, 1, rows=(3, 9)), ref[i, 1, 3:9], rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", CHECKED, ids=CHECKED)
def test_core_on_recorded_inputs_equals_eager(family_of, name):
    """attnviz.attention's pattern from the pattern store's inputs (what eager itself saw) equals eager's."""
    fam = family_of(name)
    cap = fam.capture("pattern")
    ref = fam.reference
    n = cap.n_tokens
    for i, layer in enumerate(cap.layers):
        x = cap.inputs[layer]
        assert x.q.shape[:2] == (cap.n_heads, n) and x.k.shape[1] == n
        assert list(x.kv_head_of) == cap.kv_head_of  # the config's GQA/MQA mapping is the one attention used
        weights, sink = core.layer_pattern(x, key_end=n)
        np.testing.assert_allclose(weights.numpy(), ref[i], rtol=0, atol=REF_ATOL)
        assert (sink is None) == (name not in SINKS)


@pytest.mark.parametrize("name", CHECKED, ids=CHECKED)
@pytest.mark.parametrize("store", ["pattern", "qk"])
def test_scores_reproduce_the_pattern(family_of, name, store):
    fam = family_of(name)
    cap = fam.capture(store)
    scores = cap.scores
    assert scores.shape == (cap.n_layers, cap.n_heads, cap.n_tokens, cap.n_tokens)
    assert np.isfinite(np.diagonal(scores, axis1=2, axis2=3)).all()  # every query sees itself
    for i, layer in enumerate(cap.layers):
        sink = cap.inputs[layer].sink
        expected = _softmax64(scores[i], None if sink is None else sink.numpy())
        np.testing.assert_allclose(expected, cap.layer_rows(layer), rtol=0, atol=1e-6)
        np.testing.assert_array_equal(cap.head_scores(layer, 2), scores[i, 2])


@pytest.mark.parametrize("name", CHECKED, ids=CHECKED)
def test_rows_and_learned_sink_sum_to_one(family_of, name):
    fam = family_of(name)
    cap = fam.capture("pattern")
    sink = cap.learned_sink
    total = cap.pattern.astype(np.float64).sum(-1)
    if name in SINKS:
        assert sink is not None and sink.shape == total.shape
        assert sink.max() > 0.1 and sink.mean() > 0.01  # the sinks take a visible share
        total = total + sink
        np.testing.assert_allclose(fam.capture("qk").learned_sink, sink, rtol=0, atol=1e-5)
    else:
        assert sink is None
    np.testing.assert_allclose(total, 1.0, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", list(SLIDING), ids=list(SLIDING))
@pytest.mark.parametrize("store", ["pattern", "qk"])
def test_sliding_window_layers_are_named_by_their_rule(family_of, name, store):
    """A sliding layer's mask is the window rule (no bits), in the pattern store read from the mask transformers
    built and in the qk store named from its mask function without building one; its visibility is the window's
    definition, and no weight falls outside it."""
    fam = family_of(name)
    cap = fam.capture(store)
    window = fam.loaded.model.config.sliding_window
    n = cap.n_tokens
    assert window < n
    for layer in cap.layers:
        mask = cap.inputs[layer].mask
        if layer in SLIDING[name]:
            assert (mask.kind, mask.window, mask.bits) == ("sliding", window, None)
            visible = mask.rows(0, n)
            q, k = np.indices((n, n))
            assert np.array_equal(visible, (k <= q) & (k > q - window))
            assert (cap.layer_rows(layer)[:, ~visible] == 0).all()
        else:
            assert mask.kind == "causal"


SCALED_Q = ("opt",)  # families that scale q in its projection and call attention with scaling 1


@pytest.mark.parametrize("name", CHECKED, ids=CHECKED)
def test_layer_facts_are_what_each_layer_saw(family_of, name):
    """loaded.shape.layer_facts, read from the config, against the mask transformers built for each layer (the
    visible keys of every row, recorded by the capture), the scaling each layer's attention was called with, and
    the RoPE base of the rotary table each layer type uses (Gemma 3: one table per layer type)."""
    fam = family_of(name)
    facts = fam.loaded.shape.layer_facts
    cap = fam.capture("qk")
    assert len(facts) == fam.loaded.shape.layers
    n = cap.n_tokens
    q, k = np.indices((n, n))
    expected = {"full": np.ones((n, n), dtype=bool), "causal": k <= q}
    for layer, x in cap.inputs.items():
        fact = facts[layer]
        assert (fact.mask == "sliding") == (layer in SLIDING.get(name, []))
        rule = {**expected, "sliding": (k <= q) & (k > q - (fact.window or 0))}[fact.mask]
        assert np.array_equal(x.mask.rows(0, n), rule)
        if name in SCALED_Q:  # q arrives already multiplied by 1/sqrt(d): the attention call's own factor is 1
            assert x.scaling == 1.0 and fact.scaling == pytest.approx(x.head_dim ** -0.5, rel=1e-6)
        else:
            assert fact.scaling == pytest.approx(x.scaling, rel=1e-6)
        assert fact.kind == ("local" if fact.mask == "sliding" else "global")
    rotary = [m for m in fam.loaded.model.modules() if hasattr(m, "layer_types") and hasattr(m, "rope_type")]
    for table in rotary:  # per-layer-type tables: inv_freq[1] = base^(-2 / width)
        for layer, kind in enumerate(fam.loaded.model.config.layer_types):
            inv = getattr(table, f"{kind}_inv_freq").double()
            assert facts[layer].rope_base == pytest.approx(float(inv[1]) ** (-inv.numel()), rel=1e-4)
    if name in ROPE:
        assert all(f.rope_base is not None for f in facts)
    else:
        assert all(f.rope_base is None and f.rope_type is None for f in facts)


@pytest.mark.parametrize("name", CHECKED, ids=CHECKED)
def test_kv_heads_and_store_size(family_of, name):
    """kv_head_of is the model's real sharing (GQA, MQA, Falcon's num_kv_heads), in both stores; inputs_bytes
    predicts the qk store's q and k exactly (head_dim overrides, MLA's wider q.k, one KV head for MQA)."""
    fam = family_of(name)
    n_kv = KV_HEADS[name]
    expected = [h * n_kv // 4 for h in range(4)]
    for store in ("pattern", "qk"):
        cap = fam.capture(store)
        assert cap.kv_head_of == expected
    assert all(x.k.shape[0] == n_kv for x in cap.inputs.values())
    qk_bytes = sum(x.q.numel() * 4 + x.k.numel() * 4 for x in cap.inputs.values())
    assert inputs_bytes(fam.loaded.model.config, cap.n_layers, cap.n_tokens) == qk_bytes


def test_gemma2_soft_cap_bites(family_of):
    cap = family_of("gemma2").capture("pattern")
    for layer in cap.layers:
        x = cap.inputs[layer]
        assert x.softcap == 3.0
        raw = torch.matmul(x.q, x.k[list(x.kv_head_of)].transpose(-1, -2)) * x.scaling
        assert raw.abs().max() > x.softcap  # the cap changes the pattern, so the test above is not vacuous


def test_mqa_and_mla_shapes(family_of):
    bigcode = family_of("gpt_bigcode").capture("qk")
    assert bigcode.kv_head_of == [0, 0, 0, 0] and bigcode.inputs[0].k.shape[0] == 1
    deepseek = family_of("deepseek_v3")
    x = deepseek.capture("qk").inputs[0]
    config = deepseek.loaded.model.config
    assert x.head_dim == config.qk_nope_head_dim + config.qk_rope_head_dim
    assert x.scaling != pytest.approx(x.head_dim ** -0.5)  # YaRN's mscale


REBUILT = ("falcon", "falcon_mqa", "falcon_alibi", "gptj")  # no attention interface: q and k rebuilt by hooks


def _attention_inputs(model, modules) -> list[np.ndarray]:
    """The hidden states [n, hidden] (float64) each of `modules` of transformers' own `model` is called with, on
    TEXT."""
    from transformers import AutoTokenizer

    seen = []
    hooks = [m.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]),
        with_kwargs=True) for m in modules]
    try:
        ids = AutoTokenizer.from_pretrained(model.name_or_path)(TEXT, return_tensors="pt").input_ids
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return [h[0].double().numpy() for h in seen]


def _rope_halves(x: np.ndarray, base: float) -> np.ndarray:
    """RoPE as Llama and Falcon lay it out: dims i and i + d/2 of position p turn together by the
    angle p * base^(-2i/d). x [head, n, d]."""
    n, d = x.shape[-2], x.shape[-1]
    angle = np.arange(n)[:, None] * base ** (-np.arange(0, d, 2) / d)
    z = (x[..., :d // 2] + 1j * x[..., d // 2:]) * np.exp(1j * angle)
    return np.concatenate([z.real, z.imag], axis=-1)


def _rope_pairs(x: np.ndarray, base: float, width: int) -> np.ndarray:
    """RoPE as GPT-J and the RoFormer paper lay it out: dims 2i and 2i + 1 of the first `width` turn together by
    p * base^(-2i/width); the other dims pass unchanged. x [head, n, d]."""
    n = x.shape[-2]
    angle = np.arange(n)[:, None] * base ** (-np.arange(0, width, 2) / width)
    z = (x[..., 0:width:2] + 1j * x[..., 1:width:2]) * np.exp(1j * angle)
    out = x.copy()
    out[..., 0:width:2], out[..., 1:width:2] = z.real, z.imag
    return out


def _falcon_by_hand(attention, config, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q [head, n, d], k [kv_head, n, d] and scores [head, n, n] of one Falcon layer in float64, from its fused
    weight as the three layouts pack it: per KV group [its g queries, k, v] (new decoder architecture), [every
    query, one k, one v] (multi_query) or per head [q, k, v]."""
    n, heads = hidden.shape[0], config.num_attention_heads
    d = config.hidden_size // heads
    fused = hidden @ attention.query_key_value.weight.detach().double().numpy().T
    if attention.query_key_value.bias is not None:
        fused = fused + attention.query_key_value.bias.detach().double().numpy()
    if config.new_decoder_architecture:
        x = fused.reshape(n, config.num_kv_heads, -1, d)
        q, k = x[:, :, :-2].reshape(n, heads, d), x[:, :, -2]
    elif config.multi_query:
        x = fused.reshape(n, heads + 2, d)
        q, k = x[:, :heads], x[:, heads:heads + 1]
    else:
        x = fused.reshape(n, heads, 3, d)
        q, k = x[:, :, 0], x[:, :, 1]
    q, k = q.transpose(1, 0, 2), k.transpose(1, 0, 2)
    if not config.alibi:
        base = config.rope_parameters["rope_theta"]
        q, k = _rope_halves(q, base), _rope_halves(k, base)
    scores = np.matmul(q, np.repeat(k, heads // k.shape[0], axis=0).transpose(0, 2, 1)) / np.sqrt(d)
    if config.alibi:
        # ALiBi (Press et al. 2022): slope 2^(-8 (h + 1) / heads) times the key's position. transformers' eager
        # Falcon adds it twice: in the attention, (q.k + alibi) / sqrt(d), and again in the mask it builds,
        # alibi / sqrt(d); its output_attentions (the tests above) agree
        slopes = 2.0 ** (-8.0 * np.arange(1, heads + 1) / heads)
        scores = scores + 2 * slopes[:, None, None] * np.arange(n)[None, None, :] / np.sqrt(d)
    return q, k, scores


def _gptj_by_hand(attention, config, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k [head, n, d] and scores [head, n, n] of one GPT-J layer in float64: its q_proj and k_proj, the first
    rotary_dim dims of each head turned in pairs (base 10,000), scores = q.k / sqrt(d)."""
    n, heads = hidden.shape[0], config.n_head
    d = config.n_embd // heads
    q, k = ((hidden @ proj.weight.detach().double().numpy().T).reshape(n, heads, d).transpose(1, 0, 2)
            for proj in (attention.q_proj, attention.k_proj))
    q, k = _rope_pairs(q, 10000.0, config.rotary_dim), _rope_pairs(k, 10000.0, config.rotary_dim)
    return q, k, np.matmul(q, k.transpose(0, 2, 1)) / np.sqrt(d)


@pytest.mark.parametrize("name", REBUILT, ids=REBUILT)
def test_rebuilt_q_k_and_scores_equal_a_float64_copy(family_of, name):
    """The q, k and scores that hooks rebuild for the families outside the attention interface, against the same
    layer computed by hand in float64 from transformers' own model: its weights and the hidden states entering its
    attention modules, with RoPE, ALiBi and each layout's packing of q, k and v written out here."""
    from transformers import AutoModelForCausalLM

    fam = family_of(name)
    model = AutoModelForCausalLM.from_pretrained(str(fam.folder), attn_implementation="eager", dtype=torch.float32)
    model.eval()
    config = model.config
    attentions = [getattr(block, "self_attention", None) or block.attn for block in model.transformer.h]
    by_hand = _gptj_by_hand if name == "gptj" else _falcon_by_hand
    cap = fam.capture("pattern")
    scores = cap.scores
    n = cap.n_tokens
    causal = np.tril(np.ones((n, n), dtype=bool))
    for i, hidden in enumerate(_attention_inputs(model, attentions)):
        q, k, expected = by_hand(attentions[i], config, hidden)
        x = cap.inputs[cap.layers[i]]
        np.testing.assert_allclose(x.q.numpy(), q, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(x.k.numpy(), k, rtol=1e-5, atol=1e-5)
        assert np.array_equal(np.isfinite(scores[i]), np.broadcast_to(causal, scores[i].shape))
        np.testing.assert_allclose(scores[i][:, causal], expected[:, causal], rtol=1e-5, atol=1e-5)
    assert np.abs(expected).max() > 1  # scores large enough that the comparison is not all noise


def test_a_mask_bias_that_changes_with_the_query_is_refused(family_of):
    """Falcon-RW's mask carries ALiBi, one value per key; a mask bias that depends on the query as well cannot be
    one key_bias, so the capture stops with a message instead of showing wrong scores."""
    fam = family_of("falcon_alibi")
    attentions = [block.self_attention for block in fam.loaded.model.transformer.h]

    def tilt(module, args, kwargs):  # + 0.01 x the query's index wherever the mask lets a query see a key
        mask = kwargs["attention_mask"]
        rows = torch.arange(mask.shape[-2], dtype=mask.dtype, device=mask.device)[:, None]
        kwargs["attention_mask"] = torch.where(mask > torch.finfo(mask.dtype).min / 2, mask + 0.01 * rows, mask)
        return args, kwargs

    hooks = [m.register_forward_pre_hook(tilt, with_kwargs=True) for m in attentions]
    try:
        for store in ("pattern", "qk"):
            with pytest.raises(CaptureError, match="changes from query to query"):
                capture_attention(fam.loaded, TEXT, store=store)
    finally:
        for hook in hooks:
            hook.remove()
    np.testing.assert_allclose(capture_attention(fam.loaded, TEXT).pattern, fam.reference, rtol=0, atol=REF_ATOL)


@pytest.mark.parametrize("name", REBUILT, ids=REBUILT)
def test_rebuilt_families_record_no_inputs_beside_a_kv_cache(family_of, name):
    """With a KV cache (generation) a layer's earlier keys are in the cache, out of a hook's sight: the rebuild
    records nothing there rather than a q and k of the new token alone, and the pattern row is still recorded."""
    from transformers import DynamicCache

    from attnviz.capture import recording_forward

    fam = family_of(name)
    model = fam.loaded.model
    ids = torch.tensor([fam.capture().token_ids], device=model.get_input_embeddings().weight.device)
    with torch.inference_mode():
        cache = model(input_ids=ids[:, :-1], use_cache=True, past_key_values=DynamicCache(config=model.config))
        with recording_forward(model) as rec:
            model(input_ids=ids[:, -1:], past_key_values=cache.past_key_values, use_cache=True)
    assert rec.inputs == {} and sorted(rec.pattern) == [0, 1]
    np.testing.assert_allclose(np.stack([rec.pattern[i][:, -1] for i in (0, 1)]), fam.reference[:, :, -1],
                               rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["gpt_oss", "llama"])
def test_statistics_report_the_learned_sink_share_in_both_stores(family_of, name):
    from attnviz.stats import head_stats, streaming_attend

    fam = family_of(name)
    dense = fam.capture("pattern")
    qk = fam.capture("qk")
    fused = capture_attention(fam.loaded, TEXT, store="qk", during=streaming_attend(dense.token_ids, pool=8))
    frames = [head_stats(dense), head_stats(qk), head_stats(fused)]
    if name == "llama":
        assert all("learned_sink" not in f.columns for f in frames)
        return
    expected = dense.learned_sink.astype(np.float64).mean(-1).ravel()  # [layer x head], rows' sink weight
    # independently: 1 - the row sums of the model's own eager pattern
    np.testing.assert_allclose(expected, (1 - fam.reference.astype(np.float64).sum(-1)).mean(-1).ravel(),
                               atol=REF_ATOL)
    assert expected.max() > 0.01
    for frame in frames:
        np.testing.assert_allclose(frame["learned_sink"], expected, atol=2e-6)


ROPE = {"falcon", "falcon_mqa", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "gpt_neox",
        "gpt_oss", "olmo2", "stablelm", "granite", "cohere", "gptj", "deepseek_v3"}


@pytest.mark.parametrize("name", CHECKED, ids=CHECKED)
def test_model_shape_is_what_the_layers_saw(family_of, name):
    """loaded.shape, read once from the config, against what the model itself did: one output_attentions map per
    layer, the q and k widths and head counts each layer was called with, causality from the reference maps
    (a decoder's maps are zero above the diagonal), and RoPE exactly where the family rotates q and k."""
    fam = family_of(name)
    shape = fam.loaded.shape
    reference = fam.reference
    assert shape.family == LAYOUTS.get(name, name)
    assert shape.layers == reference.shape[0]
    assert shape.heads == reference.shape[1] == 4
    assert shape.kv_heads == KV_HEADS[name]
    assert shape.kv_head_of == [h * KV_HEADS[name] // 4 for h in range(4)]
    upper = np.triu(reference[:, :, :, :], k=1)
    assert shape.causal == (name not in ENCODERS) == bool(np.all(upper == 0))
    assert (shape.position == "rope") == (name in ROPE)
    assert (shape.rope_base is not None) == (name in ROPE)
    if name in ROPE:  # the base the model's own rotary embedding was built with
        rotary = [m for m in fam.loaded.model.modules() if hasattr(m, "inv_freq")
                  and getattr(m, "rope_type", "default") == "default"]  # YaRN (gpt-oss) rescales inv_freq
        if rotary:  # inv_freq[1] = base^(-2 / rotary width): the base is inv_freq[1]^(-rotary width / 2)
            inv = rotary[-1].inv_freq.double()
            width = 2 * inv.numel()
            assert shape.rope_base == pytest.approx(float(inv[1]) ** (-width / 2), rel=1e-4)
    if name == "bloom":
        assert shape.position == "alibi" and shape.max_positions is None
    if name == "falcon_alibi":
        assert shape.position == "alibi"
    cap = fam.capture("qk")
    x = next(iter(cap.inputs.values()))
    assert (x.q.shape[0], x.k.shape[0], x.q.shape[-1]) == (shape.heads, shape.kv_heads, shape.head_dim)


CAUSAL = tuple(name for name in CHECKED if name not in ENCODERS)
# the causal families whose induction test runs in one pass: a sliding window (its cache drops keys) or attention
# recorded by hooks (attnviz.capture.rebuilt) rather than through transformers' attention interface
ONE_PASS = {"mistral", "gemma2", "gemma3_text", "gpt_oss", "falcon", "falcon_mqa", "falcon_alibi", "gptj", "bloom"}


@pytest.mark.parametrize("name", CAUSAL, ids=CAUSAL)
def test_the_induction_test_from_a_first_copy_equals_one_pass(family_of, name):
    """Every family that reuses a first copy (attnviz.diagnostics.reuses_first_copies): a test of L below the
    copies kept, run on their keys and values, has the weights, scores and losses of one pass over the whole
    sequence. The others run that one pass, and say so."""
    from attnviz.diagnostics import SCORES, first_copies, induction_test, reuse_test, reuses_first_copies

    loaded = family_of(name).loaded
    assert reuses_first_copies(loaded) == (name not in ONE_PASS)
    one = induction_test(loaded, 9, seed=2, one_pass=True)
    test = reuse_test(loaded, 9, seed=2, first=first_copies(loaded, 14, seed=2))[0] if name not in ONE_PASS else \
        induction_test(loaded, 9, seed=2)
    assert test.capture.token_ids == one.capture.token_ids
    np.testing.assert_allclose(test.capture.pattern, one.capture.pattern, atol=1e-5)
    np.testing.assert_allclose(test.scores[list(SCORES)], one.scores[list(SCORES)], atol=1e-5)
    assert (test.loss_first, test.loss_second) == pytest.approx((one.loss_first, one.loss_second), abs=1e-5)
