"""attnviz.ui's shared caches: a model's version on disk, a toy-lab model saved again under its name, and a capture
narrowed to fewer layers without a new forward pass. (The Heads page: tests/test_heads_page.py; its figures:
tests/test_figures_heads.py.)"""

from __future__ import annotations

import numpy as np

from tests.servers import ROOT


def test_a_lab_model_saved_again_under_its_name_is_served_afresh(lab_cache, attention_of):
    import torch

    from attnviz import lab, ui

    text = "abcdabcdabcd"
    first = lab.LabRun(lab.LabConfig(seed=0, d_model=32))
    first.save("same")
    old_model, old_capture = ui.get_model("lab/same"), ui.get_capture("lab/same", text)
    np.testing.assert_allclose(old_capture.pattern, attention_of(first.model, old_capture.token_ids), atol=1e-6)
    version = ui.model_version("lab/same")
    assert ui.model_version("lab/same") == version  # nothing changed on disk: same key, the cached model is reused
    assert ui.get_model("lab/same") is old_model

    second = lab.LabRun(lab.LabConfig(seed=1, d_model=32))  # same architecture, other weights, same name
    second.save("same")
    assert ui.model_version("lab/same") != version
    new_model, new_capture = ui.get_model("lab/same"), ui.get_capture("lab/same", text)
    assert new_model is not old_model
    want = second.model.state_dict()
    for name, tensor in new_model.model.state_dict().items():
        torch.testing.assert_close(tensor, want[name], rtol=0, atol=0)
    np.testing.assert_allclose(new_capture.pattern, attention_of(second.model, new_capture.token_ids), atol=1e-6)
    assert np.abs(new_capture.pattern - old_capture.pattern).max() > 1e-3  # the two saves really differ

def test_model_version_is_empty_for_models_that_cannot_change_and_tracks_local_folders(tmp_path, monkeypatch):
    from attnviz import ui

    assert ui.model_version("toy-gpt2") == () and ui.model_version("smollm2-135m") == ()
    assert ui.model_version("lab/../escape") == ()
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert ui.model_version(str(folder)) == ()  # not under the server's model folders: never listed
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(tmp_path))
    before = ui.model_version(str(folder))
    (folder / "model.safetensors").write_bytes(b"x")
    assert ui.model_version(str(folder)) != before

def test_model_version_of_a_gguf_file_changes_when_the_file_is_replaced(tmp_path, monkeypatch):
    from attnviz import ui

    file = tmp_path / "mine.gguf"
    file.write_bytes(b"GGUF one")
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(tmp_path))
    before = ui.model_version(str(file))
    assert before and before == ui.model_version(str(file))  # unchanged file: the cached model is reused
    replacement = tmp_path / "new.gguf"
    replacement.write_bytes(b"GGUF two, longer")
    replacement.replace(file)  # a new file under the same name (new inode and size)
    assert ui.model_version(str(file)) != before


def test_narrowing_the_layers_slices_the_capture_already_made(monkeypatch):
    from attnviz import capture as cap
    from attnviz import ui

    calls = []
    real = cap.capture_attention
    monkeypatch.setattr(cap, "capture_attention", lambda *a, **k: calls.append(k.get("layers")) or real(*a, **k))
    def made(text, layers):
        return ui.loaded._cached_capture("toy-llama-gqa", ui.model_version("toy-llama-gqa"), text, layers, False)

    whole, part = made("slice me", None), made("slice me", (1,))
    assert part.layers == [1] and np.array_equal(part.pattern[0], whole.pattern[1])
    assert calls == [None]  # one forward pass, for the whole capture
    # a range narrowed from a range (layers 0-1 to 1) slices it too; a layer outside the range made runs the model
    two, part = made("slice a range", (0, 1)), made("slice a range", (1,))
    assert part.layers == [1] and np.array_equal(part.pattern[0], two.pattern[1])
    assert np.shares_memory(part.pattern, two.pattern)  # a range: a view of the wider capture, not a copy
    made("slice a layer", (0,))
    assert made("slice a layer", (1,)).layers == [1] and calls == [None, (0, 1), (0,), (1,)]
    fresh = cap.capture_attention(ui.get_model("toy-llama-gqa"), "slice a range", layers=[1])
    np.testing.assert_allclose(part.pattern[0], fresh.pattern[0], atol=1e-6)  # the same weights as its own capture


def test_an_export_is_admitted_by_the_memory_budget_while_it_is_written(monkeypatch, tmp_path):
    import pytest

    from attnviz import budget
    from attnviz.capture import capture_attention
    from attnviz.capture.files import export_bytes, load_capture
    from attnviz.models import load_model
    from attnviz.ui.heads import export_file

    capture = capture_attention(load_model("toy-gpt2"), "export me, please")
    export = dict(layers=[1], heads=None)
    need = export_bytes(capture, **export, dtype=np.float32)
    seen = []
    pool = budget.MemoryBudget(need)
    monkeypatch.setattr(budget, "BUDGET", pool)
    real = budget.MemoryBudget.acquire
    monkeypatch.setattr(budget.MemoryBudget, "acquire", lambda self, n, **k: seen.append(n) or real(self, n, **k))
    with export_file(capture, "npz", export, np.float32) as fh:
        (tmp_path / "x.npz").write_bytes(fh.read())
    assert seen == [need] and pool.held == 0
    np.testing.assert_array_equal(load_capture(tmp_path / "x.npz").pattern[0], capture.pattern[1])
    monkeypatch.setattr(budget, "BUDGET", budget.MemoryBudget(need - 1))
    with pytest.raises(budget.OverBudget):
        export_file(capture, "npz", export, np.float32)


def test_a_first_load_note_gives_the_gguf_size_and_no_time(monkeypatch):
    """The note before a bundled GGUF's first load names the file's size (read from its pieces) and promises no
    duration; once converted, nothing is said."""
    from attnviz import gguf_convert, models, ui

    pieces, _, _ = models._bundled_gguf("gemma3-270m")
    size = sum(p.stat().st_size for p in pieces)
    monkeypatch.setattr(gguf_convert, "converted_folder", lambda name: None)
    note = ui.loaded._first_load_note("gemma3-270m")
    assert f"{size / 1e6:,.0f} MB GGUF file" in note and " s)" not in note and "about" not in note
    monkeypatch.undo()
    if gguf_convert.converted_folder(models._bundled_gguf("gemma3-270m")[1]) is not None:
        assert ui.loaded._first_load_note("gemma3-270m") == ""
    assert ui.loaded._first_load_note("toy-gpt2") == ""


def _export_page():
    import streamlit as st

    from attnviz import ui

    st.session_state["fits"] = (ui.export_fits(2**20, "One head"), ui.export_fits(2**50, "Every layer"))


def test_an_export_over_the_limit_is_refused_with_what_to_pick_instead():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_export_page).run()
    assert not at.exception and at.session_state["fits"] == (True, False)
    assert len(at.warning) == 1 and at.warning[0].value.startswith("Every layer would be 1048576.0 GiB")
    assert "pick one layer or one head, or float16" in at.warning[0].value


def test_the_app_server_runs_numpys_products_on_one_blas_thread():
    """Once the app has started (ui.warm_up), numpy's OpenBLAS runs on one thread: the pages' numpy products are
    small, and with a thread per core each waited for the other core on a loaded machine."""
    from streamlit.testing.v1 import AppTest
    from threadpoolctl import threadpool_info

    AppTest.from_file(str(ROOT / "app.py"), default_timeout=120).run()
    openblas = [pool for pool in threadpool_info() if pool["internal_api"] == "openblas"]
    assert openblas and {pool["num_threads"] for pool in openblas} == {1}
