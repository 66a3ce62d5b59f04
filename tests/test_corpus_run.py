"""attnviz.corpus.corpus_run and CorpusRun: every input format and its bad inputs, the shards against each window run
on its own, resume after a SIGKILL against a run never stopped, other arguments refused, a full disk, summaries and
top windows against pandas over the Parquet rows, and the command line."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import attnviz
from attnviz.corpus import CorpusError, CorpusRun, corpus_run, read_documents
from attnviz.corpus.shards import window_stats
from attnviz.corpus.store import RunFolder
from attnviz.models import load_model
from attnviz.stats import COLUMNS

ROOT = Path(__file__).resolve().parent.parent
TEXTS = ["The cat sat on the mat. The dog ran to the park and back again. " * 4,
         "Once upon a time a king had three daughters, and the youngest was the fairest of them all. " * 3,
         "Rain fell on the hills; the river rose, and the mill wheel turned faster than ever before. " * 2]


@pytest.fixture(scope="module")
def gpt2():
    return load_model("toy-gpt2")


@pytest.fixture()
def txt_folder(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    for i, text in enumerate(TEXTS):
        (folder / f"doc{i}.txt").write_text(text, encoding="utf-8")
    return folder


def stats_rows(run: CorpusRun) -> pd.DataFrame:
    """Every shard's rows, read with pandas (not DuckDB), sorted."""
    files = sorted((run.folder.path / "shards").glob("shard-*.parquet"))
    return pd.concat([pd.read_parquet(f) for f in files]).sort_values(["window_id", "layer", "head"]) \
        .reset_index(drop=True)


# -- data as people keep it -------------------------------------------------------------------------------------------

def test_every_format_reads_the_same_documents(tmp_path, txt_folder):
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps({"body": t, "id": i}) for i, t in enumerate(TEXTS))
                                         + "\n\n", encoding="utf-8")
    pq.write_table(pa.table({"body": TEXTS}), tmp_path / "data.parquet")
    saved = tmp_path / "saved"  # the layout datasets' save_to_disk writes: state.json and Arrow stream files
    saved.mkdir()
    table = pa.table({"body": TEXTS})
    with pa.OSFile(str(saved / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    (saved / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    (saved / "dataset_info.json").write_text("{}")
    texts = [d.text for d in read_documents([txt_folder])]
    assert texts == TEXTS
    for path in ("data.jsonl", "data.parquet", "saved"):
        documents = read_documents([tmp_path / path], field="body")
        assert [d.text for d in documents] == TEXTS, path
    assert read_documents([tmp_path / "data.jsonl"], field="body")[1].source == "data.jsonl line 2"
    assert read_documents([tmp_path / "data.parquet"], field="body")[2].source == "data.parquet row 2"
    assert [d.source for d in read_documents([txt_folder])] == ["texts/doc0.txt", "texts/doc1.txt", "texts/doc2.txt"]


@pytest.mark.parametrize("name,content,message", [
    ("missing.txt", None, "missing.txt: no such file or folder"),
    ("binary.txt", b"\x00\x01\x02abc", "binary.txt: a binary file"),
    ("latin.txt", "first line\ncaf\xe9\n".encode("latin-1"), "latin.txt line 2: bytes that are not UTF-8"),
    ("empty.txt", b"  \n", "empty.txt: an empty document"),
    ("bad.jsonl", b'{"text": "fine"}\n{"text": \n', "bad.jsonl line 2: not JSON"),
    ("nofield.jsonl", b'{"text": "fine"}\n{"body": "x"}\n', "nofield.jsonl line 2: no field 'text'"),
    ("emptyfield.jsonl", b'{"text": ""}\n', "emptyfield.jsonl line 1: an empty document"),
    ("nocolumn.parquet", "parquet", "nocolumn.parquet: no column 'text'"),
    ("broken.parquet", b"PAR1 not really", "broken.parquet: cannot be read as a Parquet file"),
])
def test_bad_inputs_name_the_file_and_line(tmp_path, name, content, message):
    path = tmp_path / name
    if content == "parquet":
        pq.write_table(pa.table({"body": ["x"]}), path)
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(CorpusError) as info:
        read_documents([path])
    assert message in str(info.value)
    assert str(tmp_path) not in str(info.value)  # named as given to it: by its own name, not where it lies


def test_bad_windows_and_nothing_written(tmp_path, txt_folder, gpt2):
    out = tmp_path / "run"
    with pytest.raises(CorpusError, match="at least 2 tokens"):
        corpus_run(gpt2, txt_folder, window=1, out=out)
    with pytest.raises(CorpusError, match="longer than toy-gpt2's context"):
        corpus_run(gpt2, txt_folder, window=gpt2.shape.max_positions, out=out)
    with pytest.raises(CorpusError, match="engine must be one of"):
        corpus_run(gpt2, txt_folder, window=32, out=out, engine="spark")
    assert not out.exists()


# -- the run ----------------------------------------------------------------------------------------------------------

def test_every_window_once_and_each_equals_the_window_run_alone(tmp_path, txt_folder, gpt2):
    run = corpus_run(gpt2, txt_folder, window=[24, 48], out=tmp_path / "run", shard_windows=5)
    plan = run.folder.windows()
    rows = stats_rows(run)
    assert run.complete and len(list((run.folder.path / "shards").glob("*.parquet"))) == -(-len(plan) // 5)
    n_heads = gpt2.shape.layers * gpt2.shape.heads
    assert rows.groupby("window_id").size().eq(n_heads).all() and rows["window_id"].nunique() == len(plan)
    assert set(plan["window"]) == {24, 48} and plan["window_id"].tolist() == list(range(len(plan)))
    tokenizer = gpt2.tokenizer
    for i in (0, len(plan) // 2, len(plan) - 1):  # a window's row: its own text's statistics, by head_stats
        window = plan.iloc[i]
        assert list(window["ids"]) == tokenizer(window["text"]).input_ids
        want = window_stats(gpt2, [int(x) for x in window["ids"]])
        got = rows[rows["window_id"] == i].reset_index(drop=True)
        np.testing.assert_array_equal(got[list(COLUMNS)].to_numpy(), want[list(COLUMNS)].to_numpy())
    first = plan[plan["window"] == 24].groupby("doc")["offset"].apply(list)
    assert first.iloc[0][:3] == [0, 24, 48]  # consecutive windows of the document's tokens


def test_summary_and_top_equal_pandas_over_the_parquet_rows(tmp_path, txt_folder, gpt2):
    run = corpus_run(gpt2, txt_folder, window=[24, 48], out=tmp_path / "run", max_windows=9)
    rows = stats_rows(run).merge(run.folder.windows(columns=["window_id", "window", "text", "source"]),
                                 on="window_id")
    assert rows.groupby("window")["window_id"].nunique().tolist() == [9, 9]  # max_windows per length
    summary = run.summary().set_index(["window", "layer", "head"])
    grouped = rows.groupby(["window", "layer", "head"])
    for c in COLUMNS:
        np.testing.assert_allclose(summary[c], grouped[c].mean(), rtol=1e-12)  # NaN (induction) left out
        np.testing.assert_allclose(summary[f"{c}_std"], grouped[c].std(ddof=0), rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(summary[f"{c}_q50"], grouped[c].quantile(0.5), rtol=1e-12)
        np.testing.assert_allclose(summary[f"{c}_q90"], grouped[c].quantile(0.9), rtol=1e-12)
    assert (summary["n_windows"] == 9).all()
    top = run.top("prev_token", 1, 2, k=4, window=48)
    want = rows[(rows.layer == 1) & (rows["head"] == 2) & (rows.window == 48)].sort_values(
        ["prev_token", "window_id"], ascending=[False, True]).head(4)
    assert top["window_id"].tolist() == want["window_id"].tolist()
    assert top["text"].tolist() == want["text"].tolist()
    length = run.against_length("sink_mass")
    assert list(length.columns) == [24, 48] and length.loc[(0, 1), 48] == summary.loc[(48, 0, 1), "sink_mass"]
    with pytest.raises(CorpusError, match="No statistic 'nope'"):
        run.top("nope", 0, 0)


def test_a_second_run_with_other_arguments_is_refused(tmp_path, txt_folder, gpt2):
    out = tmp_path / "run"
    corpus_run(gpt2, txt_folder, window=24, out=out, max_windows=3)
    before = sorted(p.name for p in (out / "shards").iterdir())
    for kwargs, what in ((dict(window=32, max_windows=3), "windows"), (dict(window=24, max_windows=4), "max_windows")):
        with pytest.raises(CorpusError, match=f"holds another run \\(.*{what}"):
            corpus_run(gpt2, txt_folder, out=out, **kwargs)
    with pytest.raises(CorpusError, match="model_fingerprint"):
        corpus_run("toy-llama-gqa", txt_folder, window=24, out=out, max_windows=3)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(CorpusError, match="holds other files"):
        corpus_run(gpt2, txt_folder, window=24, out=tmp_path / "other")
    assert sorted(p.name for p in (out / "shards").iterdir()) == before
    assert corpus_run(gpt2, txt_folder, window=24, out=out, max_windows=3).complete  # the same: nothing to do


def test_a_full_disk_leaves_no_half_written_shard(tmp_path, txt_folder, gpt2, monkeypatch):
    out = tmp_path / "run"
    real = pd.DataFrame.to_parquet
    calls = []

    def full_on_the_second_shard(self, path, *args, **kwargs):
        calls.append(Path(path).name)
        if "shard-00001" in str(path):
            Path(path).write_bytes(b"half")  # the bytes that made it before the disk filled
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", full_on_the_second_shard)
    with pytest.raises(CorpusError, match="No space left on the disk while writing .*shard-00001.*go"):
        corpus_run(gpt2, txt_folder, window=24, out=out, shard_windows=4)
    assert sorted(p.name for p in (out / "shards").iterdir()) == ["shard-00000.parquet"]  # nothing aside left
    monkeypatch.undo()
    run = corpus_run(gpt2, txt_folder, window=24, out=out, shard_windows=4)
    assert run.complete and stats_rows(run)["window_id"].nunique() == len(run.folder.windows())


KILLED_RUN = """
import sys, time
import attnviz.corpus.run as run
import attnviz.corpus.shards as shards
real = shards.shard_rows
def slow(*args, **kwargs):
    rows = real(*args, **kwargs)
    time.sleep(0.4)  # time for the test to kill the process between and during shard writes
    return rows
shards.shard_rows = slow
run.corpus_run("toy-gpt2", sys.argv[1], window=[24, 48], out=sys.argv[2], shard_windows=3)
"""


@pytest.mark.slow
def test_resume_after_sigkill_equals_a_run_never_stopped(tmp_path, txt_folder, gpt2):
    whole = corpus_run("toy-gpt2", txt_folder, window=[24, 48], out=tmp_path / "whole", shard_windows=3)
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for kill_after in (1, 3):  # killed twice, at whatever point of a shard the moment falls
        process = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(txt_folder), str(out)], env=env)
        deadline = time.time() + 120
        while len(RunFolder(out).done_shards()) < kill_after and time.time() < deadline:
            assert process.poll() is None, "the run ended before it was killed"
            time.sleep(0.05)
        time.sleep(0.2)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    done_before = RunFolder(out).done_shards()
    assert 3 <= len(done_before) < whole.manifest["n_shards"]
    resumed = corpus_run("toy-gpt2", txt_folder, window=[24, 48], out=out, shard_windows=3)
    assert resumed.complete
    pd.testing.assert_frame_equal(stats_rows(resumed), stats_rows(whole))
    pd.testing.assert_frame_equal(resumed.summary(), whole.summary())
    assert not [p for p in (out / "shards").iterdir() if not p.name.startswith("shard-")]  # no file left aside


def test_a_model_object_is_lent_and_left_as_it_was(tmp_path, txt_folder, gpt2):
    import torch

    model, tokenizer = gpt2.model, gpt2.tokenizer
    setting = model.config._attn_implementation
    ids = torch.tensor([tokenizer(TEXTS[0]).input_ids[:30]])
    with torch.no_grad():
        before = model(ids).logits
    model.train()  # lent in training mode: the run computes in eval mode and hands it back as it was
    run = attnviz.corpus_run(model, txt_folder, window=24, out=tmp_path / "run", tokenizer=tokenizer, max_windows=4)
    assert model.training and all(m.training for m in model.modules())
    assert model.config._attn_implementation == setting
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
    by_name = corpus_run(gpt2, txt_folder, window=24, out=tmp_path / "named", max_windows=4)
    pd.testing.assert_frame_equal(stats_rows(run), stats_rows(by_name))
    with pytest.raises(CorpusError, match="needs its tokenizer"):
        corpus_run(model, txt_folder, window=24, out=tmp_path / "x")


def test_sql_and_compare(tmp_path, txt_folder, gpt2):
    a = corpus_run(gpt2, txt_folder, window=24, out=tmp_path / "a", max_windows=6)
    b = corpus_run("toy-llama-gqa", txt_folder, window=24, out=tmp_path / "b", max_windows=6)
    counts = a.sql("SELECT layer, count(*) AS n FROM stats GROUP BY layer ORDER BY layer")
    assert counts["n"].tolist() == [6 * gpt2.shape.heads] * gpt2.shape.layers
    same = a.compare(a)
    assert (same["entropy_diff"] == 0).all() and len(same) == gpt2.shape.layers * gpt2.shape.heads
    if (b.manifest["layers"], b.manifest["heads"]) != (a.manifest["layers"], a.manifest["heads"]):
        with pytest.raises(CorpusError, match="relative depth"):
            a.compare(b)


# -- the command line -------------------------------------------------------------------------------------------------

def test_command_line_run_summary_and_top(tmp_path, txt_folder, capsys):
    from attnviz.__main__ import main

    out = tmp_path / "run"
    assert main(["corpus", "run", "--model", "toy-gpt2", "--data", str(txt_folder), "--window", "24",
                 "--window", "48", "--out", str(out), "--max-windows", "5"]) == 0
    captured = capsys.readouterr()
    assert "windows/s" in captured.err and "left" in captured.err and "10 windows of 24, 48 tokens" in captured.out
    assert main(["corpus", "summary", str(out), "--out", str(tmp_path / "s.csv")]) == 0
    assert "wrote" in capsys.readouterr().out
    table = pd.read_csv(tmp_path / "s.csv")
    pd.testing.assert_frame_equal(table, CorpusRun(out).summary(), check_dtype=False)
    assert main(["corpus", "top", str(out), "--stat", "self", "--head", "L1H3", "-k", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and "texts/doc" in lines[0]
    assert main(["corpus", "top", str(out), "--stat", "self", "--head", "three"]) == 2
    assert "--head 'three'" in capsys.readouterr().err
    assert main(["corpus", "run", "--model", "toy-gpt2", "--data", str(tmp_path / "nope.txt"), "--window", "24",
                 "--out", str(tmp_path / "r2")]) == 2
    assert "nope.txt: no such file or folder" in capsys.readouterr().err


def test_a_model_folder_is_recorded_by_its_own_name(tmp_path):
    from attnviz.corpus.run import display_name

    folder = tmp_path / "models" / "my-model"
    folder.mkdir(parents=True)
    assert display_name(str(folder)) == "my-model" and display_name("smollm2-135m") == "smollm2-135m"


def test_files_a_killed_writer_left_aside_are_cleared_when_the_run_starts_again(tmp_path, txt_folder, gpt2):
    out = tmp_path / "run"
    corpus_run(gpt2, txt_folder, window=24, out=out, max_windows=3)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = out / "shards" / f".shard-00001.parquet.{dead.stdout.strip()}.tmp"
    left.write_bytes(b"half a shard")
    mine = out / "shards" / f".shard-00002.parquet.{os.getpid()}.tmp"  # a live writer's: left alone
    mine.write_bytes(b"being written")
    corpus_run(gpt2, txt_folder, window=24, out=out, max_windows=3)
    assert not left.exists() and mine.exists()
