"""python -m attnviz: the capture written by the command line equals transformers' output_attentions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from attnviz.__main__ import main
from attnviz.capture.files import load_capture
from attnviz.models import load_model

ROOT = Path(__file__).resolve().parent.parent
TEXT = "abc abc abc"


@pytest.mark.slow
def test_capture_command_end_to_end(tmp_path):
    out = tmp_path / "cap.npz"
    done = subprocess.run([sys.executable, "-m", "attnviz", "capture", "--model", "toy-llama-gqa", "--text", TEXT,
                           "--out", str(out), "--stats", str(tmp_path / "stats.csv")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout
    cap = load_capture(out)
    loaded = load_model("toy-llama-gqa")
    with torch.no_grad():
        ref = loaded.model(**loaded.tokenizer(TEXT, return_tensors="pt"), output_attentions=True).attentions
    assert np.array_equal(cap.pattern, np.stack([a[0].numpy() for a in ref]))
    assert cap.tokens[:4] == ["<bos>", "a", "b", "c"] and cap.kv_head_of == [0, 0, 1, 1]
    stats = pd.read_csv(tmp_path / "stats.csv")
    assert len(stats) == 2 * 4 and {"layer", "head", "induction"} <= set(stats.columns)


def test_layers_float16_safetensors(tmp_path):
    out = tmp_path / "cap.safetensors"
    assert main(["capture", "--model", "toy-gpt2", "--text", TEXT, "--out", str(out), "--layers", "1",
                 "--float16", "--scores"]) == 0
    cap = load_capture(out)
    assert cap.layers == [1] and cap.pattern.dtype == np.float16 and cap.scores.shape == cap.pattern.shape


@pytest.mark.parametrize("args, message", [
    (["--model", "toy-gpt2", "--text", "  ", "--out", "x.npz"], "empty"),
    (["--model", "nope", "--text", TEXT, "--out", "x.npz"], "Unknown model"),
    (["--model", "toy-gpt2", "--text", TEXT, "--out", "x.txt"], ".npz or .safetensors"),
    (["--model", "toy-gpt2", "--text", TEXT, "--out", "x.npz", "--layers", "a,b"], "comma-separated"),
    (["--model", "toy-gpt2", "--text", TEXT, "--out", "x.npz", "--layers", "9"], "does not exist"),
])
def test_bad_input_is_a_message_not_a_traceback(tmp_path, capsys, args, message):
    args = [str(tmp_path / a) if a.startswith("x.") else a for a in args]
    assert main(["capture", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())


def test_models_command_lists_registry(capsys):
    assert main(["models"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert {"toy-gpt2", "toy-llama-gqa", "toy-bloom-alibi", "minilm-l6", "smollm2-135m"} <= set(names)


def test_stats_command_writes_every_head_equal_to_the_dense_statistics(tmp_path, capsys):
    from attnviz.capture import capture_attention
    from attnviz.stats import COLUMNS, head_stats

    text_file = tmp_path / "text.txt"
    text_file.write_text("the cat sat on the mat. " * 12, encoding="utf-8")
    out = tmp_path / "stats.csv"
    assert main(["stats", "--model", "toy-llama-gqa", "--text-file", str(text_file), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "qk store" in printed.out and "layer 2/2" in printed.err  # progress on stderr
    got = pd.read_csv(out)
    dense = head_stats(capture_attention(load_model("toy-llama-gqa"), text_file.read_text(encoding="utf-8")))
    assert got[["layer", "head", "kv_head"]].equals(dense[["layer", "head", "kv_head"]])
    for column in COLUMNS:
        np.testing.assert_allclose(got[column], dense[column], rtol=1e-6, atol=1e-7, err_msg=column)


def test_stats_command_bad_input_is_a_message(tmp_path, capsys):
    assert main(["stats", "--model", "toy-gpt2", "--text", "  ", "--out", str(tmp_path / "s.csv")]) == 2
    assert "empty" in capsys.readouterr().err


def test_stats_over_windows_of_several_files_equals_the_corpus_average(tmp_path, capsys):
    from attnviz.corpus import corpus_stats, token_windows

    files = []
    for i, text in enumerate(["the cat sat on the mat. " * 4, "a dog ran to the park. " * 3]):
        files += ["--text-file", str(tmp_path / f"t{i}.txt")]
        (tmp_path / f"t{i}.txt").write_text(text, encoding="utf-8")
    out = tmp_path / "windows.csv"
    assert main(["stats", "--model", "toy-gpt2", *files, "--window", "32", "--out", str(out)]) == 0
    assert "from 2 texts" in capsys.readouterr().out
    got = pd.read_csv(out)
    loaded = load_model("toy-gpt2")
    windows = [w for name in files[1::2] for w in token_windows(loaded, Path(name).read_text(), 32)]
    expected = corpus_stats(loaded, windows)
    assert (got["n_windows"] == len(windows)).all() and len(windows) == 3 + 2
    for column in ("entropy", "sink_mass", "prev_token", "entropy_std"):
        np.testing.assert_allclose(got[column], expected[column], atol=1e-9, err_msg=column)
    assert main(["stats", "--model", "toy-gpt2", *files, "--out", str(out)]) == 2
    assert "need stats --window" in capsys.readouterr().err
    assert main(["stats", "--model", "toy-gpt2", *files, "--window", "1", "--out", str(out)]) == 2
