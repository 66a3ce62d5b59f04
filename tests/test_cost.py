"""attnviz.cost against hand derivations, tensors actually allocated, torch's FLOP counter, models built by
transformers from the same configs (on the meta device: no memory), and published parameter counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import (AutoConfig, AutoModelForCausalLM, BertModel, BloomConfig, GPT2Config, LlamaConfig,
                          LlamaForCausalLM)

from attnviz.attention import kv_head_of
from attnviz.cost import (PRESETS, arch_from_config, attention_flops, crossover_seq_len, kv_cache_bytes,
                          param_counts, preset_arch, preset_config)

# Published parameter counts, with where each is published.
PUBLISHED = {
    # Devlin et al. 2019, BERT, §3: "BERT_BASE (L=12, H=768, A=12, Total Parameters=110M)".
    "BERT-base": 110e6,
    # Devlin et al. 2019, BERT, §3: "BERT_LARGE (L=24, H=1024, A=16, Total Parameters=340M)".
    "BERT-large": 340e6,
    # Hugging Face model card of openai-community/gpt2 ("the smallest version of GPT-2, with 124M parameters"),
    # and OpenAI's gpt-2 repository, which names the checkpoint "124M". (The GPT-2 paper's Table 2 says 117M,
    # a miscount OpenAI later corrected; 117M is 6% below what the released weights hold.)
    "GPT-2 small": 124e6,
    # Brown et al. 2020, Language Models are Few-Shot Learners, Table 2.1: n_params 175.0B.
    "GPT-3 175B": 175.0e9,
    # Touvron et al. 2023a, LLaMA, Table 2: the d=4096, 32-head, 32-layer model has 6.7B parameters; Llama 2
    # (Touvron et al. 2023b, §2.2) keeps that architecture for its 7B model.
    "Llama-2-7B": 6.7e9,
    # Touvron et al. 2023b, Llama 2, Table 1: 70B.
    "Llama-2-70B": 70e9,
    # Mistral AI, "Mistral 7B" announcement (September 2023): "a 7.3B parameter model".
    "Mistral-7B": 7.3e9,
    # Allal et al. 2025, SmolLM2, and the HuggingFaceTB/SmolLM2-135M model card: 135M.
    "SmolLM2-135M": 135e6,
}


def _meta_model(config):
    """The transformers model of a config, built on the meta device: shapes only, no memory."""
    with torch.device("meta"):
        if config.model_type == "bert":
            return BertModel(config)  # the encoder with its pooler, as BERT's published count has it
        return AutoModelForCausalLM.from_config(config)


def _n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights are one parameter, counted once


def test_every_preset_has_a_published_count():
    assert set(PUBLISHED) == set(PRESETS)


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_parameter_count_equals_the_transformers_model_built_from_its_config(name):
    assert param_counts(preset_arch(name))["total"] == _n_params(_meta_model(preset_config(name)))


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_parameter_count_is_within_2_percent_of_the_published_count(name):
    total = param_counts(preset_arch(name))["total"]
    assert abs(total - PUBLISHED[name]) / PUBLISHED[name] < 0.02, f"{name}: {total:,} vs {PUBLISHED[name]:,.0f}"


def test_llama_2_70b_uses_grouped_query_attention_with_8_kv_heads():
    arch = preset_arch("Llama-2-70B")
    assert (arch.heads, arch.kv_heads, arch.head_dim, arch.variant) == (64, 8, 128, "GQA")
    # K and V projections are 8/64 of Q's size: 8192 * (8 * 128) each.
    counts = param_counts(arch)
    assert counts["attention"] == 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024)


@pytest.mark.parametrize("config", [
    LlamaConfig(hidden_size=48, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
                intermediate_size=80, vocab_size=97, tie_word_embeddings=False, attention_bias=True, mlp_bias=True),
    LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                intermediate_size=64, vocab_size=50, tie_word_embeddings=True),
    GPT2Config(n_embd=40, n_layer=2, n_head=5, n_inner=72, vocab_size=61, n_positions=33),
    BloomConfig(hidden_size=32, n_layer=2, n_head=4, vocab_size=70),
    AutoConfig.for_model("bert", hidden_size=36, num_hidden_layers=2, num_attention_heads=3, intermediate_size=50,
                         vocab_size=40, max_position_embeddings=20, type_vocab_size=3),
    AutoConfig.for_model("mistral", hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=4, intermediate_size=96, vocab_size=100),
    AutoConfig.for_model("qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=2, intermediate_size=96, vocab_size=100),
], ids=["llama-gqa-biases-untied", "llama-mqa-head_dim-tied", "gpt2", "bloom", "bert", "mistral", "qwen2"])
def test_counts_of_any_loaded_config_equal_the_model_transformers_builds(config):
    assert param_counts(arch_from_config(config))["total"] == _n_params(_meta_model(config))


def test_unknown_model_type_is_refused():
    with pytest.raises(ValueError):
        arch_from_config(AutoConfig.for_model("t5"))


def test_kv_cache_bytes_equals_the_bytes_of_the_cache_tensors_themselves():
    layers, kv_heads, head_dim, seq_len, batch = 3, 2, 8, 5, 4
    cache = [torch.zeros(batch, kv_heads, seq_len, head_dim, dtype=torch.float16) for _ in range(2 * layers)]
    assert kv_cache_bytes(layers=layers, kv_heads=kv_heads, head_dim=head_dim, seq_len=seq_len,
                          batch=batch) == sum(t.nbytes for t in cache)


def test_kv_cache_bytes_equals_what_a_transformers_gqa_model_caches():
    config = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=50)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        cache = model(torch.zeros(3, 7, dtype=torch.long), use_cache=True).past_key_values
    cached = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    assert kv_cache_bytes(layers=2, kv_heads=2, head_dim=8, seq_len=7, batch=3, bytes_per_value=4) == cached


def test_kv_cache_bytes_llama_2_70b_at_4096_tokens():
    # By hand: per token and layer, K and V of 8 heads x 128 numbers x 2 bytes = 4096 B; x 80 layers = 320 KiB;
    # x 4096 tokens = 1280 MiB = 1.25 GiB = 1,342,177,280 B.
    per_token = 80 * 4096
    assert per_token == 320 * 1024
    assert kv_cache_bytes(layers=80, kv_heads=8, head_dim=128, seq_len=4096) == per_token * 4096 == 1.25 * 2**30


def test_kv_cache_bytes_rejects_impossible_sizes():
    with pytest.raises(ValueError):
        kv_cache_bytes(layers=-1, kv_heads=8, head_dim=128, seq_len=10)
    with pytest.raises(ValueError):
        kv_cache_bytes(layers=2, kv_heads=8, head_dim=128, seq_len=10, bytes_per_value=0)


def _counted_flops(n, d, n_heads, kv_dim=None):
    """(projection FLOPs, attention FLOPs) as torch's FlopCounterMode counts explicit multi-head attention."""
    kv_dim = d if kv_dim is None else kv_dim
    x = torch.randn(n, d)
    w_q, w_o = torch.randn(d, d), torch.randn(d, d)
    w_k, w_v = torch.randn(d, kv_dim), torch.randn(d, kv_dim)
    with FlopCounterMode(display=False) as counter:
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        x @ w_o
    projections = counter.get_total_flops()
    q, k, v = (torch.randn(n, d).view(n, n_heads, d // n_heads).transpose(0, 1) for _ in range(3))  # [head, n, hd]
    with FlopCounterMode(display=False) as counter:
        pattern = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // n_heads), dim=-1)  # [head, n, n]
        pattern @ v
    return projections, counter.get_total_flops()


@pytest.mark.parametrize("n,d,n_heads", [(7, 12, 3), (16, 8, 2), (5, 32, 4)])
def test_attention_flops_match_torch_flop_counter(n, d, n_heads):
    projections, attention = _counted_flops(n, d, n_heads)
    flops = attention_flops(seq_len=n, d_model=d)
    assert flops["projections"] == projections == 8 * n * d * d
    assert flops["attention"] == attention == 4 * n * n * d
    assert flops["total"] == projections + attention


def test_attention_flops_with_fewer_kv_heads_count_the_smaller_k_and_v_projections():
    n, d, kv_dim = 9, 16, 4
    projections, _ = _counted_flops(n, d, 4, kv_dim=kv_dim)
    assert attention_flops(seq_len=n, d_model=d, kv_dim=kv_dim)["projections"] == projections


def test_causal_attention_flops_are_half_and_close_to_the_pairs_a_causal_mask_keeps():
    n, d = 4096, 128
    full, causal = attention_flops(seq_len=n, d_model=d), attention_flops(seq_len=n, d_model=d, causal=True)
    assert causal["attention"] * 2 == full["attention"]
    assert causal["projections"] == full["projections"]
    kept_pairs = n * (n + 1) // 2  # query i sees keys 0..i
    assert causal["attention"] == pytest.approx(4 * kept_pairs * d, rel=1 / n)


@pytest.mark.parametrize("d", [64, 768, 4096])
@pytest.mark.parametrize("causal", [False, True])
def test_crossover_is_where_attention_overtakes_projections(d, causal):
    n_star = crossover_seq_len(d_model=d, causal=causal)
    assert n_star == (4 * d if causal else 2 * d)
    at = attention_flops(seq_len=int(n_star), d_model=d, causal=causal)
    before = attention_flops(seq_len=int(n_star) - 1, d_model=d, causal=causal)
    after = attention_flops(seq_len=int(n_star) + 1, d_model=d, causal=causal)
    assert at["attention"] == at["projections"]
    assert before["attention"] < before["projections"] and after["attention"] > after["projections"]


def test_crossover_with_gqa_comes_earlier():
    d, kv_dim = 4096, 1024
    n_star = crossover_seq_len(d_model=d, kv_dim=kv_dim)
    flops = attention_flops(seq_len=int(n_star), d_model=d, kv_dim=kv_dim)
    assert flops["attention"] == flops["projections"] and n_star < 2 * d


def test_kv_head_of_matches_transformers_repeat_kv():
    from transformers.models.llama.modeling_llama import repeat_kv

    n_heads, n_kv = 12, 4
    kv = torch.arange(n_kv, dtype=torch.float32).view(1, n_kv, 1, 1)
    repeated = repeat_kv(kv, n_heads // n_kv).flatten().tolist()
    assert kv_head_of(n_heads, n_kv) == [int(h) for h in repeated]
    assert kv_head_of(6, 6) == list(range(6))
    assert kv_head_of(6, 1) == [0] * 6
    with pytest.raises(ValueError):
        kv_head_of(6, 4)


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_values_and_their_transformers_config_give_the_same_architecture(name):
    assert arch_from_config(preset_config(name), name=name) == preset_arch(name)


@pytest.mark.parametrize("n,text", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"), (10 * 2**20, "10.00 MiB"),
    (1.25 * 2**30, "1.25 GiB"),  # Llama-2-70B's KV cache at 4096 tokens (test above)
    (3 * 2**40, "3.00 TiB"), (2**60, "1024.00 PiB"),  # past the largest unit it stays in PiB
    (-2048, "-2.00 KiB"),
])
def test_format_bytes_uses_binary_units(n, text):
    from attnviz.cost import format_bytes

    assert format_bytes(n) == text


def test_kv_cache_curve_is_the_cache_at_each_length_for_llama_2_70b():
    from attnviz.cost import kv_cache_curve

    arch = preset_arch("Llama-2-70B")
    # Touvron et al. 2023b: 80 layers, 8 KV heads (GQA) of 128 dims
    assert (arch.layers, arch.kv_heads, arch.head_dim) == (80, 8, 128)
    # by hand: K and V x 80 layers x 8 heads x 128 numbers = 163,840 numbers per token and sequence
    curve = kv_cache_curve(arch, [0, 1, 4096], batch=2, bytes_per_value=1)
    assert curve.dtype == np.float64 and curve.shape == (3,)
    assert curve.tolist() == [0.0, 2 * 163_840, 2 * 163_840 * 4096]
    # fp16 default, batch 1: 4096 tokens are 1.25 GiB
    assert kv_cache_curve(arch, [4096])[0] == 1.25 * 2**30


# The head-sharing figure of the variants page ------------------------------------------------------------------

PANEL_PX = 220  # one of three panels in the wide page on a 1280 px screen (the chart is ~820 px wide there)
CHAR_PX = 0.6 * 11  # a label's width per character: about 0.6 em at the 11 px font


def _rows(fig):
    """The labelled rows of every panel: (label positions, labels, marker size, spacing in query-head units)."""
    rows = []
    for trace in fig.data:
        if trace.mode == "markers+text":
            xs = list(trace.x)
            rows.append((xs, list(trace.text), trace.marker.size, xs[1] - xs[0] if len(xs) > 1 else 1.0))
    return rows


@pytest.mark.parametrize("n_heads", [*range(1, 17), 24, 32, 40, 48, 64, 96, 100, 127, 128])
def test_head_sharing_labels_fit_side_by_side_at_every_head_count(n_heads):
    from attnviz.figures.cost import head_sharing_figure

    divisors = [g for g in range(1, n_heads + 1) if n_heads % g == 0]
    kv_counts = sorted({n_heads, divisors[len(divisors) // 2], 1}, reverse=True)  # MHA, a GQA, MQA
    fig = head_sharing_figure(n_heads, {f"{k} KV": kv_head_of(n_heads, k) for k in kv_counts})
    rows = _rows(fig)
    assert len(rows) == 2 * len(kv_counts)  # a query row and a KV row per panel
    for xs, texts, size, spacing in rows:
        count = len(xs)
        prefix = "KV" if texts[0].startswith("KV") else "Q"
        labelled = [i for i, t in enumerate(texts) if t]
        assert all(texts[i] == f"{prefix}{i}" for i in labelled)  # each label names the head under it
        step = labelled[1] - labelled[0] if len(labelled) > 1 else count
        assert labelled == list(range(0, count, step))  # 0, k, 2k, ...: every head is near a label
        assert len(labelled) >= min(count, 4)
        if count == 1:
            continue  # one head: nothing to collide with
        gap_px = step * spacing * PANEL_PX / n_heads  # between neighbouring labels' centres
        widest = max(len(texts[i]) for i in labelled) * CHAR_PX
        assert gap_px >= widest, (n_heads, count, step)  # no two labels overlap
        assert size <= max(3.0, spacing * PANEL_PX / n_heads)  # nor two markers


@pytest.mark.parametrize("n_heads,n_kv", [(8, 4), (128, 8), (100, 10), (9, 3)])
def test_head_sharing_panel_titles_fit_their_panels(n_heads, n_kv):
    """Each panel's title, a line at a time, is no wider than the narrowest panel (13 px font, ~0.6 em a
    character): on one line "GQA (4 KV): 8 query, 4 KV heads" ran into the next panel's title."""
    from attnviz.figures.cost import head_sharing_figure

    kv = {"MHA": n_heads, f"GQA ({n_kv} KV)": n_kv, "MQA": 1}
    fig = head_sharing_figure(n_heads, {name: kv_head_of(n_heads, k) for name, k in kv.items()})
    titles = [a.text for a in fig.layout.annotations]
    assert [t.split("<br>")[0] for t in titles] == list(kv)
    assert titles[1].split("<br>")[1] == f"{n_heads} query, {n_kv} KV heads"
    for title in titles:
        assert max(len(line) for line in title.split("<br>")) * 0.6 * 13 <= PANEL_PX, title


@pytest.mark.parametrize("name", ["toy-gpt2", "toy-llama-gqa", "toy-bloom-alibi"])
def test_arch_from_config_agrees_with_the_models_shape(name):
    """The Variants page counts a registry model's parameters from its config (arch_from_config needs the MLP width,
    biases and norms, which ModelShape does not hold); its shape facts are ModelShape's, read once at load."""
    from attnviz.models import load_model

    loaded = load_model(name)
    arch, shape = arch_from_config(loaded.model.config, name=name), loaded.shape
    assert (arch.layers, arch.heads, arch.kv_heads, arch.head_dim, arch.d_model, arch.vocab) == \
        (shape.layers, shape.heads, shape.kv_heads, shape.head_dim, shape.d_model, shape.vocab)


@pytest.mark.parametrize("n_heads,n_kv", [(8, 4), (128, 8), (12, 12), (9, 1)])
def test_head_sharing_draws_one_line_from_each_query_head_to_the_kv_head_it_reads(n_heads, n_kv):
    """The lines of a colour are one trace broken by None: every query head has exactly one segment, ending under
    the centre of its own group, in its group's colour; a panel draws at most one line trace per colour."""
    from attnviz.figures.common import PALETTE
    from attnviz.figures.cost import head_sharing_figure

    kv_of = kv_head_of(n_heads, n_kv)
    fig = head_sharing_figure(n_heads, {"GQA": kv_of})
    lines = [t for t in fig.data if t.mode == "lines"]
    assert len(lines) == min(n_kv, len(PALETTE))
    ends = {}
    for trace in lines:
        xs, ys = list(trace.x), list(trace.y)
        for i in range(0, len(xs), 3):
            assert (ys[i], ys[i + 1], xs[i + 2], ys[i + 2]) == (1, 0, None, None)
            assert xs[i] not in ends
            ends[xs[i]] = (xs[i + 1], trace.line.color)
    assert sorted(ends) == list(range(n_heads))
    group = n_heads // n_kv
    for h, (x_end, colour) in ends.items():
        g = kv_of[h]
        assert x_end == pytest.approx(g * group + (group - 1) / 2)  # the middle of the heads that share it
        assert colour == PALETTE[g % len(PALETTE)]


def test_variant_maps_figure_puts_each_variants_head_in_its_panel_on_one_colour_axis():
    from attnviz.figures.cost import variant_maps_figure

    rng = np.random.default_rng(0)
    patterns = {name: rng.dirichlet(np.ones(6), size=(4, 6)) for name in ("MHA", "GQA", "MQA")}
    kv = {"MHA": [0, 1, 2, 3], "GQA": [0, 0, 1, 1], "MQA": [0, 0, 0, 0]}
    fig = variant_maps_figure(patterns, [1, 3], kv)
    assert len(fig.data) == 6
    titles = [a.text for a in fig.layout.annotations]
    for i, (name, h) in enumerate((n, h) for n in patterns for h in (1, 3)):
        trace = fig.data[i]
        np.testing.assert_array_equal(trace.z, patterns[name][h])
        assert trace.coloraxis == "coloraxis" and trace.xaxis == ("x" if i == 0 else f"x{i + 1}")
        assert titles[i] == f"{name} · head {h} (KV {kv[name][h]})"
    assert (fig.layout.coloraxis.cmin, fig.layout.coloraxis.cmax) == (0, 1)
