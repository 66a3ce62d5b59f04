"""The Corpus page (AppTest through app.py's navigation) over runs made by corpus_run on toy models in tmp_path: no
runs folder, a runs folder, a widget change, a small run started from pasted text, bad uploads and pastes, a link
to an unknown run, a damaged run; the figures' numbers against CorpusRun's tables, and those against pandas over
the Parquet rows. No message names a folder of the server."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from streamlit.testing.v1 import AppTest

from attnviz.corpus import CorpusRun, corpus_run, layer_means
from attnviz.figures import corpus as figs
from attnviz.models import load_model

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
TEXT = ("When in the Course of human events, it becomes necessary for one people to dissolve the political bands "
        "which have connected them with another. The cat sat on the mat; the cat sat on the mat again. ") * 2


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    """A runs folder with two runs of the same shape (toy-gpt2 and toy-llama-gqa, 2 x 4 heads, windows of 16 and
    32 tokens) and one of another (all-MiniLM-L6-v2, 6 x 12, windows of 16)."""
    root = tmp_path_factory.mktemp("runs")
    data = root.parent / "texts.txt"
    data.write_text(TEXT, encoding="utf-8")
    corpus_run("toy-gpt2", data, window=[16, 32], out=root / "a-gpt2", max_windows=6)
    corpus_run("toy-llama-gqa", data, window=[16, 32], out=root / "b-llama", max_windows=6)
    corpus_run(load_model("minilm-l6"), data, window=16, out=root / "c-minilm", max_windows=3)
    (root / "not-a-run").mkdir()  # no manifest: not listed
    return root


def corpus_page(query: dict | None = None, **state) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    for key, value in (query or {}).items():
        at.query_params[key] = value
    for key, value in state.items():
        at.session_state[key] = value
    at.switch_page("app_pages/corpus.py")
    at.run()
    assert not at.exception, at.exception
    return at


def array(value) -> np.ndarray:
    """A trace's array as plotly serialises it: a (nested) list, or a typed array {"dtype", "bdata" (base64),
    "shape"}."""
    import base64

    if isinstance(value, dict):
        out = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"])).astype(float)
        shape = value.get("shape")
        return out.reshape([int(n) for n in str(shape).split(",")]) if shape else out
    return np.array(value, dtype=float)


def messages(at: AppTest) -> list[str]:
    return [m.value for kind in ("error", "warning", "info", "success") for m in getattr(at, kind)]


def charts(at: AppTest) -> dict[str, dict]:
    """Each drawn chart's plotly spec, by its title."""
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    return {s["layout"]["title"]["text"]: s for s in specs}


def chart(at: AppTest, starts: str) -> dict:
    found = [s for title, s in charts(at).items() if title.startswith(starts)]
    assert len(found) == 1, list(charts(at))
    return found[0]


def no_paths(at: AppTest, *folders: Path) -> None:
    shown = " ".join(messages(at) + [c.value for c in at.caption] + [m.value for m in at.markdown])
    for folder in folders:
        assert str(folder) not in shown


def test_without_a_runs_folder_the_page_says_how_an_operator_sets_one(monkeypatch):
    monkeypatch.delenv("ATTNVIZ_RUNS_DIR", raising=False)
    at = corpus_page()
    said = " ".join(messages(at))
    assert "ATTNVIZ_RUNS_DIR" in said and "attnviz corpus run" in said
    assert not at.get("plotly_chart") and at.button(key="corpus_start")


def test_a_run_of_the_runs_folder_is_drawn_from_its_own_tables(runs_dir, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_RUNS_DIR", str(runs_dir))
    at = corpus_page()
    assert at.selectbox(key="corpus_run").options == ["a-gpt2", "b-llama", "c-minilm"]
    assert at.selectbox(key="corpus_run").value == "a-gpt2"
    run = CorpusRun(runs_dir / "a-gpt2", name="a-gpt2")
    summary = run.summary()
    rows = summary[summary["window"] == 16]

    grid = chart(at, "entropy: each head's mean")["data"][0]
    want = rows.pivot(index="layer", columns="head", values="entropy")
    np.testing.assert_allclose(array(grid["z"]), want.to_numpy(), rtol=1e-12)
    spread = array(grid["customdata"])  # [layer, head, (std, q10, q50, q90, n_windows)]
    for i, column in enumerate(("entropy_std", "entropy_q10", "entropy_q50", "entropy_q90", "n_windows")):
        np.testing.assert_allclose(spread[..., i], rows.pivot(index="layer", columns="head", values=column))

    ranked = at.dataframe[0].value
    assert list(ranked["entropy"]) == sorted(rows["entropy"], reverse=True) and len(ranked) == 8

    best = rows.sort_values("entropy", ascending=False).iloc[0]
    layer, head = int(best["layer"]), int(best["head"])
    assert (at.selectbox(key="corpus_layer").value, at.selectbox(key="corpus_head").value) == (layer, head)
    top = run.top("entropy", layer, head, 5, window=16)
    assert [link.proto.page for link in at.get("page_link")] == ["heads"] * len(top)
    for link, text in zip(at.get("page_link"), top["text"]):
        query = dict(pair.split("=", 1) for pair in link.proto.query_string.split("&"))
        assert query["model"] == "toy-gpt2" and (query["layer"], query["head"]) == (str(layer), str(head))
        assert query["tab"] == "head" and query["text"]
    assert [c.value for c in at.code if c.proto.language != "python"] == list(top["text"])  # not the snippet

    by_length = run.against_length("entropy").groupby(level="layer").mean()
    lines = chart(at, "entropy against window length")["data"]
    assert [t["name"] for t in lines] == ["layer 0", "layer 1"]
    for trace, (_, want_line) in zip(lines, by_length.iterrows()):
        assert list(array(trace["x"])) == [16, 32]
        np.testing.assert_allclose(array(trace["y"]), want_line.to_numpy())

    diff = chart(at, "entropy, run A − run B")["data"][0]  # b-llama: the same shape, head by head
    merged = run.compare(CorpusRun(runs_dir / "b-llama"), "entropy")
    merged = merged[merged["window"] == 16].pivot(index="layer", columns="head", values="entropy_diff")
    np.testing.assert_allclose(array(diff["z"]), merged.to_numpy())

    assert at.query_params["run"] in ("a-gpt2", ["a-gpt2"])
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels.count("Summary (.csv)") == labels.count("Summary (.parquet)") == 1  # beside each chart's files
    no_paths(at, runs_dir)


def test_the_summary_the_page_reads_equals_pandas_over_the_parquet_rows(runs_dir):
    run = CorpusRun(runs_dir / "a-gpt2")
    shards = sorted((runs_dir / "a-gpt2" / "shards").glob("shard-*.parquet"))
    rows = pd.concat([pd.read_parquet(f) for f in shards])
    windows = pd.read_parquet(runs_dir / "a-gpt2" / "windows.parquet", columns=["window_id", "window"])
    grouped = rows.merge(windows, on="window_id").groupby(["window", "layer", "head"])
    summary = run.summary().set_index(["window", "layer", "head"])
    for column in ("entropy", "sink_mass", "prev_token"):
        np.testing.assert_allclose(summary[column], grouped[column].mean(), rtol=1e-10)
        np.testing.assert_allclose(summary[f"{column}_std"], grouped[column].std(ddof=0), rtol=1e-8, atol=1e-12)
        np.testing.assert_allclose(summary[f"{column}_q50"], grouped[column].median(), rtol=1e-10)
    grid = figs.grid_arrays(run.summary(), "sink_mass", 32)
    want = rows.merge(windows, on="window_id").query("window == 32").groupby(["layer", "head"])["sink_mass"]
    np.testing.assert_allclose(grid["mean"].ravel(), want.mean().to_numpy(), rtol=1e-10)
    np.testing.assert_allclose(grid["std"].ravel(), want.std(ddof=0).to_numpy(), rtol=1e-8, atol=1e-12)


def test_a_widget_change_redraws_from_the_chosen_statistic_and_keeps_it_in_the_link(runs_dir, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_RUNS_DIR", str(runs_dir))
    at = corpus_page()
    at.selectbox(key="corpus_stat").set_value("sink_mass").run()
    at.selectbox(key="corpus_window").set_value(32).run()
    at.selectbox(key="corpus_layer").set_value(0).run()
    at.selectbox(key="corpus_head").set_value(3).run()
    assert not at.exception, at.exception
    run = CorpusRun(runs_dir / "a-gpt2")
    rows = run.summary().query("window == 32")
    grid = chart(at, "sink_mass: each head's mean")["data"][0]
    np.testing.assert_allclose(array(grid["z"]),
                               rows.pivot(index="layer", columns="head", values="sink_mass").to_numpy())
    windows = [c.value for c in at.code if c.proto.language != "python"]  # not the snippet
    assert windows == list(run.top("sink_mass", 0, 3, 5, window=32)["text"])
    query = {k: (v[0] if isinstance(v, list) else v) for k, v in at.query_params.items()}
    assert query == {"run": "a-gpt2", "stat": "sink_mass", "window": "32", "layer": "0", "head": "3",
                     "order": "high", "b": "b-llama"}

    # the link reproduces the view in a new session
    again = corpus_page(query)
    assert again.selectbox(key="corpus_stat").value == "sink_mass" and again.selectbox(key="corpus_window").value == 32
    assert (again.selectbox(key="corpus_layer").value, again.selectbox(key="corpus_head").value) == (0, 3)
    assert not again.warning


def test_runs_of_different_shapes_are_compared_by_relative_depth(runs_dir, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_RUNS_DIR", str(runs_dir))
    at = corpus_page({"run": "a-gpt2", "b": "c-minilm", "stat": "prev_token"})
    assert at.selectbox(key="corpus_run_b").value == "c-minilm"
    assert not any(t.startswith("prev_token, run A − run B") for t in charts(at))
    curves = chart(at, "prev_token, mean over each layer's heads")["data"]
    for trace, name, layers in zip(curves, ("a-gpt2", "c-minilm"), (2, 6)):
        summary = CorpusRun(runs_dir / name).summary()
        means = layer_means(summary[summary["window"] == 16], "prev_token")
        np.testing.assert_allclose(array(trace["y"]), means.to_numpy())
        np.testing.assert_allclose(array(trace["x"]), np.arange(layers) / (layers - 1))
    boxes = chart(at, "prev_token of every head")["data"]
    assert [len(array(b["y"])) for b in boxes] == [8, 72]


def test_a_small_run_started_from_pasted_text_is_listed_and_drawn(runs_dir, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_RUNS_DIR", str(runs_dir))
    at = corpus_page()
    at.text_area(key="corpus_paste").set_value("The cat sat on the mat. " * 6 + f"\n{'---'}\n" + "A dog ran off. " * 6)
    at.multiselect(key="corpus_windows").set_value([16, 32])
    at.slider(key="corpus_max_windows").set_value(3)
    at.button(key="corpus_start").click().run()
    assert not at.exception and not at.error, (at.exception, messages(at))
    name = at.selectbox(key="corpus_run").value
    assert name.startswith("yours/1: 2 pasted texts") and name in at.selectbox(key="corpus_run").options
    folder = Path(at.session_state["corpus_mine"][name])
    assert not folder.is_relative_to(runs_dir), "a visitor's run goes in the session's own folder"
    run = CorpusRun(folder)
    assert run.complete and run.manifest["windows"] == [16, 32] and run.manifest["n_windows"] == 6
    assert run.manifest["data"] == ["pasted text 1", "pasted text 2"]
    grid = chart(at, "entropy: each head's mean over 3 windows of 16 tokens")["data"][0]
    rows = run.summary().query("window == 16")
    np.testing.assert_allclose(array(grid["z"]),
                               rows.pivot(index="layer", columns="head", values="entropy").to_numpy())
    assert any(name in m.value for m in at.success)
    no_paths(at, runs_dir, folder)


def _parquet_bytes(column: str) -> bytes:
    import io

    buffer = io.BytesIO()
    pq.write_table(pa.table({column: ["some text here"]}), buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("name, content, said", [
    ("notes.txt", b"\x00\x01\x02 a binary file", "notes.txt: a binary file"),
    ("notes.txt", "caf\u00e9 au lait".encode("latin-1"), "notes.txt line 1: bytes that are not UTF-8"),
    ("rows.jsonl", b'{"body": "hello there"}\n', "rows.jsonl line 1: no field 'text'"),
    ("rows.parquet", _parquet_bytes("body"), "rows.parquet: no column 'text'"),
    ("rows.parquet", b"PAR1 not really", "rows.parquet: cannot be read as a Parquet file"),
], ids=["binary", "not-utf8", "jsonl-field", "parquet-column", "not-parquet"])
def test_a_bad_upload_gets_a_message_and_starts_no_run(name, content, said, monkeypatch, tmp_path):
    monkeypatch.delenv("ATTNVIZ_RUNS_DIR", raising=False)
    at = corpus_page(corpus_source="Upload a file")
    at.file_uploader(key="corpus_upload").set_value((name, content, "application/octet-stream"))
    at.button(key="corpus_start").click().run()
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and said in errors[0], errors
    assert "--field" not in errors[0] and "/tmp" not in errors[0]
    assert "corpus_mine" not in at.session_state and not at.get("plotly_chart")


@pytest.mark.parametrize("state, said", [
    ({"corpus_paste": " \n---\n  "}, "The paste is empty"),
    ({"corpus_windows": []}, "Choose at least one window length"),
    ({"corpus_model": "minilm-l6", "corpus_windows": [512]}, "A window of 512 tokens is too long for minilm-l6"),
], ids=["empty-paste", "no-window", "window-too-long"])
def test_a_paste_or_a_setting_the_page_cannot_run_is_said(state, said, monkeypatch):
    monkeypatch.delenv("ATTNVIZ_RUNS_DIR", raising=False)
    at = corpus_page(**state)
    at.button(key="corpus_start").click().run()
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and said in errors[0], errors
    assert "corpus_mine" not in at.session_state


def test_a_link_to_an_unknown_run_says_so_and_shows_a_listed_one(runs_dir, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_RUNS_DIR", str(runs_dir))
    at = corpus_page({"run": "../etc", "window": "100", "b": "yours/3: notes.txt, toy-gpt2"})
    warnings = [w.value for w in at.warning]
    assert any("`run=../etc` is not a run on this server" in w and "a-gpt2, b-llama, c-minilm" in w for w in warnings)
    assert any("`window=100`" in w and "16, 32" in w for w in warnings)
    assert any("`b=yours/3" in w and "lasts as long as the visitor's session" in w for w in warnings)
    assert at.selectbox(key="corpus_run").value == "a-gpt2" and at.get("plotly_chart")
    no_paths(at, runs_dir)


def test_a_damaged_run_is_named_without_its_folder(runs_dir, monkeypatch, tmp_path):
    import shutil

    broken = tmp_path / "runs" / "broken"
    shutil.copytree(runs_dir / "a-gpt2", broken)
    for shard in (broken / "shards").glob("*.parquet"):
        shard.write_bytes(b"not parquet")
    monkeypatch.setenv("ATTNVIZ_RUNS_DIR", str(tmp_path / "runs"))
    at = corpus_page()
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "The run broken cannot be read" in errors[0], errors
    no_paths(at, tmp_path)


def test_heads_links_and_exports():
    from attnviz.ui import corpus as corpus_ui

    source = (ROOT / "app_pages" / "heads.py").read_text()
    limit = next(line for line in source.splitlines() if line.startswith("URL_TEXT_LIMIT ="))
    assert int(limit.split("=")[1].split("#")[0].strip().replace("_", "")) == corpus_ui.HEADS_LINK_CHARS
    assert corpus_ui.heads_link("toy-gpt2", "abc", 1, 2) == {"model": "toy-gpt2", "text": "abc", "layer": "1",
                                                              "head": "2", "tab": "head"}
    assert corpus_ui.heads_link("toy-gpt2", "a" * (corpus_ui.HEADS_LINK_CHARS + 1), 1, 2) is None
    assert corpus_ui.heads_link("/srv/models/mine", "abc", 1, 2) is None  # a server path never goes in a link
    assert corpus_ui.model_shown("/srv/models/mine") == "mine (a model folder of this server)"
    table = pd.DataFrame({"window": [16], "layer": [0], "head": [1], "entropy": [0.5]})
    import io

    assert pd.read_parquet(io.BytesIO(corpus_ui.summary_file(table, "parquet"))).equals(table)
    assert corpus_ui.summary_file(table, "csv").decode() == table.to_csv(index=False)
    assert corpus_ui.file_stem("yours/1: notes.txt · toy-gpt2") == "yours-1-notes.txt-toy-gpt2"
