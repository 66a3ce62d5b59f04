"""attnviz.corpus: statistics averaged over windows of a long text, against each window run on its own through
transformers' output_attentions with the statistics written out in float64, and two models compared head by head."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from attnviz.corpus import compare_heads, corpus_stats, token_windows, window_summary
from attnviz.models import load_model

TEXT = "The cat sat on the mat. A dog ran to the park and back again. " * 3


@pytest.fixture(scope="module")
def gpt2():
    return load_model("toy-gpt2")


def test_windows_cut_the_tokens_and_each_starts_as_a_text_would(gpt2):
    ids = gpt2.tokenizer(TEXT).input_ids  # <bos> then one token per byte
    windows = token_windows(gpt2, TEXT, 40)
    assert all(w[0] == ids[0] for w in windows)
    assert sum(len(w) - 1 for w in windows) == len(ids) - 1  # the last window kept: over half a window
    assert [w[1:] for w in windows] == [ids[1:][a:a + 40] for a in range(0, len(ids) - 1, 40)]
    assert len(token_windows(gpt2, TEXT, 40, max_windows=2)) == 2
    last = (len(ids) - 2) % 40 + 2  # its body tokens and <bos>
    assert last > 20 and window_summary(windows) == f"{len(windows)} windows of 41 tokens (the last {last})"
    minilm = load_model("minilm-l6")
    for w in token_windows(minilm, TEXT, 8):
        assert w[0] == 101 and w[-1] == 102  # [CLS] ... [SEP]


def test_the_average_over_windows_equals_each_window_by_hand(gpt2):
    windows = token_windows(gpt2, TEXT, 40)
    table = corpus_stats(gpt2, windows)
    per_window = []
    for ids in windows:
        with torch.no_grad():
            att = gpt2.model(input_ids=torch.tensor([ids]), output_attentions=True).attentions
        p = torch.stack([a[0] for a in att]).double().numpy()  # [layer, head, n, n]
        n = p.shape[-1]
        entropy = -np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0).sum(-1).mean(-1)
        sink = p[..., 1:, 0].mean(-1)
        prev = np.mean([p[..., q, q - 1] for q in range(1, n)], axis=0)
        per_window.append({"entropy": entropy, "sink_mass": sink, "prev_token": prev})
    for column in ("entropy", "sink_mass", "prev_token"):
        values = np.stack([w[column] for w in per_window])  # [window, layer, head]
        np.testing.assert_allclose(table[column].to_numpy(), values.mean(0).ravel(), atol=1e-5)
        np.testing.assert_allclose(table[f"{column}_std"].to_numpy(), values.std(0).ravel(), atol=1e-5)
    assert (table["n_windows"] == len(windows)).all() and len(table) == 2 * 4


def test_two_models_compare_head_by_head_only_where_their_heads_match(gpt2):
    windows = token_windows(gpt2, TEXT, 40, max_windows=2)
    a = corpus_stats(gpt2, windows)
    b = a.copy()
    b["sink_mass"] = b["sink_mass"] * 0.5
    diff = compare_heads(a, b.sample(frac=1.0, random_state=0), "sink_mass")  # row order does not matter
    np.testing.assert_allclose(diff["difference"], a["sink_mass"] * 0.5)
    llama = load_model("toy-llama-gqa")
    c = corpus_stats(llama, token_windows(llama, TEXT, 40, max_windows=1))
    if set(zip(a.layer, a["head"])) != set(zip(c.layer, c["head"])):
        with pytest.raises(ValueError, match="do not match"):
            compare_heads(a, c, "sink_mass")
    with pytest.raises(ValueError, match="do not match"):
        compare_heads(a, a[a["head"] < 2], "sink_mass")
    assert isinstance(diff, pd.DataFrame)
