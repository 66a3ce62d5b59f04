
import numpy as np
import pytest
import torch

from attnviz import sinks, streaming
from attnviz.pooling import MIN_REMAINING
from attnviz.sinks import sink_head_share, sink_heads, sink_scores, top_sink_keys
from attnviz.views import sink_hidden


def _causal_random_pattern(rng, shape):
    """Random row-stochastic causal pattern [..., n, n] built from exponentials, float64."""
    n = shape[-1]
    raw = rng.exponential(size=shape) * np.tril(np.ones((n, n)))
    return raw / raw.sum(axis=-1, keepdims=True)


def test_hiding_several_sinks_matches_a_loop_renormalisation():
    """views.sink_hidden, the one rule both pages draw with, hiding keys 0 and 2 (as the Sinks page hides the sinks
    it found): each row's other keys divided by their sum, computed here one row at a time; a row left with under
    MIN_REMAINING of its weight (query 0 sees only key 0) is NaN, drawn blank."""
    rng = np.random.default_rng(0)
    pattern = _causal_random_pattern(rng, (2, 3, 6, 6))
    pattern[0, 0, 4] = [0.995, 0.001, 0.002, 0.001, 0.001, 0.0]  # keeps 0.003 off keys 0 and 2: blank
    out = sink_hidden(pattern, keys=(0, 2))
    expected = np.zeros_like(pattern)
    for idx in np.ndindex(pattern.shape[:-1]):
        row = [0.0 if j in (0, 2) else pattern[idx][j] for j in range(6)]
        s = sum(row)
        expected[idx] = [v / s for v in row] if s >= MIN_REMAINING else [np.nan] * 6
    np.testing.assert_allclose(out, expected, atol=1e-12)  # NaN where expected is NaN
    assert np.isnan(out[..., 0, :]).all() and np.isnan(out[0, 0, 4]).all()
    assert np.isfinite(out[..., 1:, :]).sum() == 6 * 5 * 6 - 6  # every other row is drawn
    np.testing.assert_allclose(np.nansum(out[..., 1:, :], -1)[np.isfinite(out[..., 1:, 0])], 1.0, atol=1e-12)


def test_hiding_the_sink_by_hand():
    """Token 0 by default: [[1, 0, 0], [.5, .5, 0], [.6, .1, .3]] -> query 0 kept nothing (blank), query 1 all on
    key 1, query 2 .1 and .3 out of .4; a negative key counts from the end, a key past the end is ignored."""
    p = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.6, 0.1, 0.3]])
    out = sink_hidden(p)
    assert np.isnan(out[0]).all()
    np.testing.assert_allclose(out[1:], [[0.0, 1.0, 0.0], [0.0, 0.25, 0.75]], atol=1e-15)
    np.testing.assert_allclose(sink_hidden(p, keys=(-1, 7))[2], [0.6 / 0.7, 0.1 / 0.7, 0.0], atol=1e-15)
    assert sink_hidden(p.astype(np.float32)).dtype == np.float32


def test_sink_scores_causal_match_loops():
    rng = np.random.default_rng(1)
    pattern = _causal_random_pattern(rng, (2, 3, 7, 7))
    alpha = sink_scores(pattern)
    for idx in np.ndindex(pattern.shape[:-2]):
        for k in range(7):
            seen = [pattern[idx][t, k] for t in range(k, 7)]  # Gu et al.: queries t >= k
            assert alpha[idx][k] == pytest.approx(sum(seen) / len(seen), abs=1e-12)


def test_sink_scores_bidirectional_average_every_query():
    rng = np.random.default_rng(2)
    raw = rng.exponential(size=(2, 5, 5))
    pattern = raw / raw.sum(-1, keepdims=True)
    alpha = sink_scores(pattern, causal=False)
    for h in range(2):
        for k in range(5):
            assert alpha[h, k] == pytest.approx(sum(pattern[h, t, k] for t in range(5)) / 5, abs=1e-12)


def _planted_sink_pattern(n, c):
    """Causal pattern: every query t >= 1 gives c to key 0 and spreads 1 - c evenly over keys 1..t."""
    p = np.zeros((n, n))
    p[0, 0] = 1.0
    for t in range(1, n):
        p[t, 0] = c
        p[t, 1:t + 1] = (1 - c) / t
    return p


def test_sink_heads_threshold_and_share_per_layer():
    n = 10
    # alpha_0 = (1 + (n - 1) c) / n by hand: c = 0.1 -> 0.19 (not a sink head), c = 0.5 -> 0.55 (a sink head).
    weak, strong = _planted_sink_pattern(n, 0.1), _planted_sink_pattern(n, 0.5)
    pattern = np.stack([np.stack([weak, weak, strong]), np.stack([strong, strong, strong])])  # [layer 2, head 3]
    alpha = sink_scores(pattern)
    assert alpha[0, 0, 0] == pytest.approx((1 + (n - 1) * 0.1) / n)
    assert alpha[0, 2, 0] == pytest.approx((1 + (n - 1) * 0.5) / n)
    np.testing.assert_array_equal(sink_heads(alpha), [[False, False, True], [True, True, True]])
    np.testing.assert_allclose(sink_head_share(alpha), [1 / 3, 1.0])


def test_top_sink_keys_find_a_sink_that_is_not_token_zero():
    n = 8
    # Bidirectional (BERT-like): every query gives half its attention to key 3 ("[SEP]"), the rest evenly.
    p = np.full((n, n), 0.5 / (n - 1))
    p[:, 3] = 0.5
    pattern = np.broadcast_to(p, (2, 4, n, n))
    tokens = [f"t{i}" for i in range(n)]
    top = top_sink_keys(sink_scores(pattern, causal=False), tokens, causal=False, top=2)
    assert top[0].position == 3 and top[0].token == "t3"
    assert top[0].mean_score == pytest.approx(0.5)
    assert top[0].sink_heads == 8 and top[0].top_heads == 8
    assert top[1].mean_score == pytest.approx(0.5 / (n - 1))


def test_top_sink_keys_ignore_last_keys_seen_by_few_queries():
    n = 12
    # Causal: every query attends to itself only, so alpha_k = 1/(n - k): the last key scores 1.0 from one query.
    pattern = np.broadcast_to(np.eye(n), (1, 2, n, n))
    alpha = sink_scores(pattern)
    assert alpha[0, 0, n - 1] == pytest.approx(1.0)
    top = top_sink_keys(alpha, [str(i) for i in range(n)], top=3)
    assert all(n - s.position >= n // 4 for s in top)


def _alpha_by_loops(pattern, causal):
    """Gu et al.'s alpha_k written out: the mean of A[t, k] over the queries t that see key k. [..., key]."""
    n = pattern.shape[-1]
    alpha = np.zeros(pattern.shape[:-2] + (n,))
    for idx in np.ndindex(pattern.shape[:-2]):
        for k in range(n):
            rows = range(k, n) if causal else range(n)
            alpha[idx + (k,)] = sum(pattern[idx][t, k] for t in rows) / len(rows)
    return alpha


def _sinks_by_the_stated_rule(alpha, causal):
    """The rule the Sinks page states, written out: key k is a sink when alpha_k > 0.3 in at least 5% (1/20) of
    the heads, and (causal) at least a quarter of the n queries see it, i.e. 4 (n - k) >= n. Returns (sinks,
    keys seen by too few queries)."""
    flat = alpha.reshape(-1, alpha.shape[-1])
    n_heads, n = flat.shape
    few = [k for k in range(n) if causal and 4 * (n - k) < n]
    found = [k for k in range(n) if k not in few and 20 * sum(1 for h in range(n_heads) if flat[h, k] > 0.3)
             >= n_heads]
    return found, few


def test_min_sink_heads_is_the_smallest_count_making_5_percent():
    for n_heads in range(1, 401):
        assert sinks.min_sink_heads(n_heads) == next(c for c in range(1, n_heads + 1) if 20 * c >= n_heads)
    assert sinks.min_sink_heads(60) == 3  # 0.05 * 60 is 3.0000000000000004 in floating point


@pytest.mark.parametrize("causal", [True, False])
def test_sink_keys_follow_the_stated_rule(causal):
    rng = np.random.default_rng(11)
    n, layers, heads = 16, 4, 5  # 20 heads: a sink needs alpha_k > 0.3 in at least 1 of them
    raw = rng.exponential(size=(layers, heads, n, n)) * (np.tril(np.ones((n, n))) if causal else 1.0)
    raw[..., 0] += 3.0 * raw.sum(-1)  # key 0: a sink in every head
    raw[0, 0, :, 6] += 5.0 * raw[0, 0].sum(-1)  # key 6: a sink in one head only (5% of 20), small mean
    raw[..., n - 1, n - 1] += 50.0  # the last key: the last query attends to itself
    pattern = raw / raw.sum(-1, keepdims=True)
    alpha = _alpha_by_loops(pattern, causal)
    expected, few = _sinks_by_the_stated_rule(alpha, causal)
    assert 0 in expected and 6 in expected  # the planted sinks are found ...
    assert (n - 1 in few) == causal  # ... and the self-attending last key is only left out when it is seen once
    np.testing.assert_array_equal(sinks.sink_keys(alpha, causal=causal), expected)
    np.testing.assert_array_equal(np.flatnonzero(~sinks.judged_keys(n, causal=causal)), few)
    # key 6 is a sink for one head but ranks low by mean: the ranking and the sink rule are separate
    ranked = [k.position for k in top_sink_keys(alpha, [str(i) for i in range(n)], causal=causal, top=n)]
    assert sorted(ranked) == [k for k in range(n) if k not in few]


def test_smollm2_has_sink_heads_in_its_later_layers(smollm2):
    from attnviz.capture import capture_attention

    capture = capture_attention(smollm2, streaming.shipped_text()[:400])
    alpha = sink_scores(capture.pattern)  # [layer, head, key]
    share = sink_head_share(alpha)
    assert alpha.shape[:2] == (30, 9)
    assert share[15:].mean() >= 0.75, share
    assert share[15:].mean() - share[:10].mean() >= 0.5, share
    assert top_sink_keys(alpha[15:], capture.tokens, top=1)[0].position == 0


def test_page_colours_and_ranks_keys_by_the_rule_its_captions_state(smollm2):
    """The default Sinks page (SmolLM2, the Gettysburg opening): the orange bars, the grey bars and the table are
    exactly what the captions' rule gives, computed here from the captured pattern by loops."""
    import json
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from attnviz.capture import capture_attention

    page = Path(__file__).resolve().parent.parent / "app_pages" / "sinks.py"
    at = AppTest.from_file(str(page), default_timeout=300)
    at.run()
    assert not at.exception, at.exception
    text = at.session_state["sinks_text"]
    capture = capture_attention(smollm2, text)
    n = capture.n_tokens
    alpha = _alpha_by_loops(np.asarray(capture.pattern, dtype=np.float64), causal=True)
    expected, few = _sinks_by_the_stated_rule(alpha, causal=True)
    assert expected and few

    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    bars = next(s for s in specs if s["layout"]["title"]["text"].startswith("Mean attention each key receives"))
    by_colour = {}
    for trace in bars["data"]:
        colours = trace["marker"]["color"]
        for i, k in enumerate(trace["x"]):
            by_colour.setdefault(colours if isinstance(colours, str) else colours[i], []).append(k)
    orange, grey = sorted(by_colour.pop("#e8590c", [])), sorted(by_colour.pop("#adb5bd", []))
    assert orange == expected
    assert grey == few
    assert sorted(k for xs in by_colour.values() for k in xs) == [k for k in range(n) if k not in expected + few]

    captions = " ".join(c.value for c in at.caption)
    n_heads = alpha.shape[0] * alpha.shape[1]
    assert (f"a key is a sink (orange) when α_k > 0.3 in at least 5% of the heads (here "
            f"{-(-n_heads // 20)} of {n_heads}) and at least a quarter of the queries see it") in captions
    assert f"Grey: the last keys, seen by fewer than a quarter of the {n} queries" in captions
    # the table: the five keys with the largest mean alpha among the keys that are not grey
    mean = alpha.reshape(-1, n).mean(axis=0)
    judged = [k for k in range(n) if k not in few]
    table = at.dataframe[0].value
    assert list(table["position"]) == sorted(judged, key=lambda k: -mean[k])[:5]
    assert "among those at least a quarter of the queries see (grey bars left out)" in captions
    # a key of the table is orange exactly when its sink_heads make at least 5% of the heads
    for pos, heads in zip(table["position"], table["sink_heads"]):
        assert (20 * heads >= n_heads) == (pos in expected)


@pytest.mark.parametrize("model, text, expect", [
    ("minilm-l6", "The cat sat on the mat.", "Bidirectional model"),
    ("toy-gpt2", "x", "With only a few tokens"),
])
def test_page_handles_other_models_and_tiny_texts(model, text, expect):
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app_pages" / "sinks.py"), default_timeout=120)
    at.session_state["sinks_model"] = model
    at.session_state["sinks_text"] = text
    at.run()
    assert not at.exception, at.exception
    shown = " ".join(str(e.value) for e in [*at.caption, *at.warning, *at.info])
    assert expect in shown
    # where alpha_0 is drawn, the page says how it relates to the Heads page's sink_mass (derived in the test above)
    relation = "α₀ = (1 + (n − 1) · sink_mass) / n" if model == "toy-gpt2" else "α₀ = (A₀₀ + (n − 1) · sink_mass) / n"
    assert relation in shown
    if model == "minilm-l6":
        at.toggle(key="sinks_hide").set_value(True).run()
        assert not at.exception, at.exception


def test_every_figure_has_a_title_and_axis_titles_with_units():
    from attnviz.figures import sinks as figs

    rng = np.random.default_rng(3)
    alpha = sink_scores(_causal_random_pattern(rng, (3, 2, 6, 6)))
    tokens = list("abcdef")
    figures = [
        figs.sink_score_grid(alpha[..., 0], [0, 1, 2], threshold=0.3),
        figs.sink_share_bars(sink_head_share(alpha), [0, 1, 2], threshold=0.3),
        figs.key_score_bars(alpha.mean(axis=(0, 1)), tokens, highlight=[0]),
        figs.head_map(_causal_random_pattern(rng, (6, 6)), tokens, title="one head"),
        figs.loss_curves(np.arange(1, 6), {"a": np.ones(5), "b": np.ones(5) * 2}, window=3, smoothing=1),
        figs.sink_rate_bars([0.1, 0.5, 0.9], [0, 1, 2], eps=0.3, whole=0.5, n_texts=4),
        figs.sink_rate_curve([0.1, 0.3, 0.5], [0.9, 0.5, 0.2], eps=0.3),
        figs.massive_values([3.0, 900.0, 1000.0], [1.0, 1.0, 1.2]),
        figs.sink_mass_change([0.1, 0.5, 0.6], [0.1, 0.2, 0.1], label="zeroed"),
    ]
    for fig in figures:
        assert fig.layout.title.text
        assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
        assert "(" in fig.layout.yaxis.title.text  # a unit or a scale in brackets
    np.testing.assert_allclose(figures[1].data[0].y, 100 * sink_head_share(alpha))
    # the key bars: every key once, one bar-width wide whatever the colour group (two far-apart sinks included)
    keys = figs.key_score_bars(alpha.mean(axis=(0, 1)), tokens, highlight=[0, 4], unjudged=[5])
    assert sorted(k for trace in keys.data for k in trace.x) == list(range(6))
    assert all(trace.width is not None and trace.width <= 1 for trace in keys.data)


def test_hiding_the_sink_takes_a_read_only_cached_pattern_silently():
    import warnings

    p = np.full((2, 3, 3), 1 / 3)
    p.flags.writeable = False  # as attnviz.ui shares captures between sessions
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = sink_hidden(p)
    np.testing.assert_allclose(out[..., 0], 0.0)
    np.testing.assert_allclose(out.sum(-1), 1.0)


def test_alpha0_and_the_heads_pages_sink_mass_relation():
    """The relation the Sinks page states: alpha_0 averages all n queries (Gu et al., T - k = n for k = 0) while
    attnviz.stats' sink_mass averages queries 1..n-1; in a causal model query 0 sees only token 0 (weight 1), so
    alpha_0 = (1 + (n - 1) sink_mass) / n; in an encoder query 0's own A[0, 0] takes the place of the 1."""
    from attnviz.capture import capture_attention
    from attnviz.models import load_model
    from attnviz.stats import head_stats, pattern_stats

    rng = np.random.default_rng(7)
    n = 9
    p = _causal_random_pattern(rng, (4, n, n))  # [head, query, key]
    hand = np.array([(1.0 + sum(p[h, t, 0] for t in range(1, n))) / n for h in range(4)])
    np.testing.assert_allclose(sink_scores(p)[:, 0], hand, atol=1e-12)
    mass = pattern_stats(p)["sink_mass"]
    np.testing.assert_allclose(sink_scores(p)[:, 0], (1 + (n - 1) * mass) / n, atol=1e-12)
    raw = rng.exponential(size=(4, n, n))
    b = raw / raw.sum(-1, keepdims=True)  # bidirectional
    np.testing.assert_allclose(sink_scores(b, causal=False)[:, 0],
                               (b[:, 0, 0] + (n - 1) * pattern_stats(b)["sink_mass"]) / n, atol=1e-12)
    # and on a real capture, the two pages' numbers for every head
    cap = capture_attention(load_model("toy-gpt2"), "Attention sinks sit on the first token.")
    frame = head_stats(cap)
    alpha0 = sink_scores(cap.pattern, causal=cap.causal)[..., 0].reshape(-1)
    m = cap.n_tokens
    np.testing.assert_allclose(alpha0, (1 + (m - 1) * frame["sink_mass"].to_numpy()) / m, atol=1e-6)


def test_page_states_a_learned_sinks_share(tmp_path, monkeypatch):
    """A gpt-oss folder: the Sinks page says what its learned sink logits take, computed from the capture."""
    import sys
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from families import build_family

    from attnviz.capture import capture_attention
    from attnviz.models import load_model

    folder = build_family("gpt_oss", tmp_path)
    text = "abcabc abcabc"
    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app_pages" / "sinks.py"), default_timeout=120)
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(tmp_path))  # a server that opens the folders under tmp_path
    from attnviz.ui import CUSTOM_MODEL

    at.session_state["sinks_model"] = CUSTOM_MODEL
    at.session_state["sinks_model_custom"] = str(folder)
    at.session_state["sinks_text"] = text
    at.run()
    assert not at.exception, at.exception
    expected = capture_attention(load_model(str(folder)), text).learned_sink.mean()
    info = " ".join(i.value for i in at.info)
    assert "learned sink" in info and f"{expected:.1%}" in info, info


def _alpha0_by_loops(model, tokenizer, text):
    """alpha_0 [layer, head] from transformers' own attention weights (output_attentions), by loops in float64:
    the mean over the queries t >= 0 that see key 0 (all of them) of A[t, 0]."""
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions
    out = np.zeros((len(attentions), attentions[0].shape[1]))
    for layer, a in enumerate(attentions):
        a = a[0].double().numpy()
        n = a.shape[-1]
        for head in range(a.shape[0]):
            total = 0.0
            for t in range(n):
                total += a[head, t, 0]
            out[layer, head] = total / n  # causal: key 0 is seen by all n queries; bidirectional: likewise
    return out


@pytest.mark.parametrize("name", ["toy-gpt2", "minilm-l6"])
def test_sink_metric_over_texts_matches_loops_on_transformers_patterns(name):
    from attnviz.models import load_model

    loaded = load_model(name)
    texts = sinks.text_windows(streaming.shipped_text(), loaded.tokenizer, n_tokens=24, n_windows=5)
    assert len(texts) == 5 and len(set(texts)) == 5
    for text in texts:  # each window is 24 of the model's tokens, plus the special tokens it adds itself
        plain = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert len(plain) == 24
    alpha = sinks.alpha_over_texts(loaded, texts)  # [text, layer, head]
    want = np.stack([_alpha0_by_loops(loaded.model, loaded.tokenizer, t) for t in texts])
    np.testing.assert_allclose(alpha, want, atol=1e-6)
    for eps in (0.05, 0.3, 0.6):
        triples = [(i, l, h) for i in range(want.shape[0]) for l in range(want.shape[1]) for h in range(want.shape[2])]
        share = sum(want[i, l, h] > eps for i, l, h in triples) / len(triples)
        assert sinks.sink_rate(alpha, eps) == pytest.approx(share)
        for l in range(want.shape[1]):
            pairs = [want[i, l, h] > eps for i in range(want.shape[0]) for h in range(want.shape[2])]
            assert sinks.sink_rate_by_layer(alpha, eps)[l] == pytest.approx(sum(pairs) / len(pairs))
    np.testing.assert_allclose(sinks.sink_rate_curve(alpha, [0.05, 0.3]),
                               [sinks.sink_rate(alpha, 0.05), sinks.sink_rate(alpha, 0.3)])


def test_text_windows_short_and_empty_texts():
    from attnviz.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    assert sinks.text_windows("short", tok, n_tokens=64) == ["short"]
    assert sinks.text_windows("   ", tok, n_tokens=64) == []
    # 26 tokens, windows of 10 evenly spaced from the start to the end: starting at 0, 8 and 16
    assert sinks.text_windows("abcdefghijklmnopqrstuvwxyz", tok, n_tokens=10, n_windows=3) == [
        "abcdefghij", "ijklmnopqr", "qrstuvwxyz"]


def _sinks_page(model: str, text: str):
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app_pages" / "sinks.py"), default_timeout=300)
    at.session_state["sinks_model"] = model
    at.session_state["sinks_text"] = text
    at.run()
    assert not at.exception, at.exception
    return at


def test_page_shows_the_sink_metric_over_texts_for_the_eps_chosen():
    from attnviz.models import load_model

    text = "Attention sinks sit on the first token of the text."
    at = _sinks_page("toy-gpt2", text)
    at.slider(key="sinks_metric_windows").set_value(3)
    at.select_slider(key="sinks_metric_tokens").set_value(16)
    at.button(key="sinks_metric_run").click().run()
    at.slider(key="sinks_metric_eps").set_value(0.1).run()
    assert not at.exception, at.exception
    loaded = load_model("toy-gpt2")
    texts = sinks.text_windows(streaming.shipped_text(), loaded.tokenizer, n_tokens=16, n_windows=3) + [text]
    want = np.stack([_alpha0_by_loops(loaded.model, loaded.tokenizer, t) for t in texts])
    shown = next(m for m in at.metric if m.label.startswith("Sink"))
    assert shown.label == "Sink₀^0.1 of toy-gpt2"
    assert shown.value == f"{(want > 0.1).mean():.1%}"


def test_page_runs_the_massive_activation_intervention():
    from attnviz import massive
    from attnviz.models import load_model

    text = "The cat sat on the mat. The dog sat on the log."
    at = _sinks_page("toy-llama-gqa", text)
    assert any("no massive activations" in c.value for c in at.caption)  # random weights: none
    at.slider(key="sinks_massive_dims").set_value(2)
    at.button(key="sinks_massive_run").click().run()
    assert not at.exception, at.exception
    layer = at.selectbox(key="sinks_massive_layer").value
    token = at.selectbox(key="sinks_massive_token").value
    loaded = load_model("toy-llama-gqa")
    hidden = massive.layer_outputs(loaded.model, loaded.tokenizer(text)["input_ids"])
    dims = np.argsort(-np.abs(hidden[layer, token]), kind="stable")[:2].tolist()
    result = massive.intervention(loaded, text, massive.edit_for(hidden, layer, token, dims, "zero"))
    shown = next(m for m in at.metric if m.label == "Perplexity on your text")
    assert shown.value == f"{result.edited_perplexity:,.2f}"
    ratio = result.edited_perplexity / result.perplexity
    assert f"{result.perplexity:.2f}" in shown.delta and (f"{ratio:,.0f}×" if ratio >= 100 else f"{ratio:.2f}×") \
        in shown.delta
    at.radio(key="sinks_massive_mode").set_value("mean").run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]


def test_page_says_an_encoder_has_no_perplexity_for_the_intervention():
    at = _sinks_page("minilm-l6", "Attention sinks sit on the first token.")
    assert any("not a decoder with a language-model head" in w.value for w in at.warning)


@pytest.mark.parametrize("name", ["toy-llama-gqa", "minilm-l6"])
def test_capture_sink_scores_in_both_stores_equal_the_dense_definition(name):
    """alpha_k read a block of rows at a time, from the dense store and from q and k, equals sink_scores of the whole
    pattern, and for a causal model a loop over t >= k."""
    from attnviz.capture import capture_attention
    from attnviz.models import load_model

    loaded = load_model(name)
    text = "The sink is the first token. The sink is the first token, again and again."
    dense = capture_attention(loaded, text)
    want = sinks.sink_scores(dense.pattern, causal=dense.causal)
    for cap in (dense, capture_attention(loaded, text, store="qk")):
        np.testing.assert_allclose(sinks.capture_sink_scores(cap, block=7), want, rtol=1e-5, atol=1e-7)
    if dense.causal:
        n = dense.n_tokens
        p = dense.pattern.astype(np.float64)
        for k in (0, 3, n - 1):
            assert want[1, 2, k] == pytest.approx(sum(p[1, 2, t, k] for t in range(k, n)) / (n - k), rel=1e-9)


def test_page_reads_a_long_text_from_q_and_k():
    """Past the dense store's token limit the page keeps q and k only (and says so); alpha_k and the one-head map
    come from them (their equality with the dense definition is tested above)."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from attnviz.capture import MAX_TOKENS, capture_attention
    from attnviz.models import load_model

    text = ("Sinks hold the first token. " * 90)[: MAX_TOKENS + 50]  # byte tokens: over the dense limit
    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app_pages" / "sinks.py"), default_timeout=300)
    at.session_state["sinks_model"] = "toy-llama-gqa"
    at.session_state["sinks_text"] = text
    at.run()
    assert not at.exception, at.exception
    assert any("tokens:" in str(e.value) for e in at.info), [str(e.value) for e in at.info]  # the store is named
    loaded = load_model("toy-llama-gqa")
    qk = capture_attention(loaded, text, store="qk")
    alpha_rows = sinks.capture_sink_scores(qk)
    shown = " ".join(str(e.value) for e in at.caption)
    n_sink = int(sinks.sink_heads(alpha_rows).sum())
    assert f"{n_sink} of {alpha_rows.shape[0] * alpha_rows.shape[1]} heads are sink heads" in shown


def test_sink_rate_by_kind_counts_each_kinds_triples():
    alpha = np.zeros((2, 3, 2))  # [text, layer, head]
    alpha[:, 0] = 0.9  # a local layer where every head is a sink
    alpha[0, 1, 0] = 0.5  # one of the global layers' eight (text, layer, head) triples
    rates = sinks.sink_rate_by_kind(alpha, ["local", "global", "global"], eps=0.3)
    assert rates == {"local": 1.0, "global": 1 / 8}


def test_hiding_the_sinks_says_how_many_rows_are_left_blank():
    """With the sinks hidden, rows that keep under MIN_REMAINING of their weight off the sink keys are blank; the
    page counts them (or says nothing is left to draw when every row is), against a count made here from the
    capture's own pattern."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from attnviz.capture import capture_attention
    from attnviz.models import load_model
    from attnviz.pooling import MIN_REMAINING

    text = "Four score and seven years ago our fathers brought forth on this continent, a new nation."
    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app_pages" / "sinks.py"), default_timeout=300)
    at.session_state["sinks_model"] = "smollm2-135m"
    at.session_state["sinks_text"] = text
    at.run()
    at.toggle(key="sinks_hide").set_value(True).run()
    assert not at.exception, at.exception
    layer, head = int(at.selectbox(key="sinks_layer").value), int(at.selectbox(key="sinks_head").value)
    cap = capture_attention(load_model("smollm2-135m"), text)
    p = cap.head_pattern(layer, head).astype(np.float64)
    sink_keys = [0] + [k for k in range(1, p.shape[1]) if f"{k}" in at.toggle(key="sinks_hide").help.split(
        "positions ")[1].split(")")[0].split(", ")]
    blank = int((np.delete(p, sink_keys, axis=1).sum(-1) < MIN_REMAINING).sum())
    shown = " ".join(str(e.value) for e in [*at.caption, *at.info])
    if blank == p.shape[0]:
        assert "nothing is left to draw" in shown
    else:
        assert (f"{blank} of {p.shape[0]} rows keep under" in shown) == (blank > 0)
