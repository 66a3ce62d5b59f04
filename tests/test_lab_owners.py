"""attnviz.lab.storage with many visitors: a folder belongs to whoever saved it, other visitors read it but never
replace it, and the limits on count and disk refuse with a message that names them."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from attnviz import lab
from attnviz.lab import storage

ALICE, BOB = "token-of-alice", "token-of-bob"  # what ui.lab.visitor() keeps per browser session


def untrained(seed: int, owner: str | None, **kw) -> lab.LabRun:
    """A run that was never trained (saving needs no training): its weights are drawn from `seed`."""
    return lab.LabRun(lab.LabConfig(seed=seed, d_model=32, **kw), owner=owner)


def saved_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def same_weights(run: lab.LabRun, folder: Path) -> bool:
    want = run.model.state_dict()
    got = saved_weights(folder)
    return all(torch.equal(t, want[name]) for name, t in got.items())


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir())


def test_a_save_under_another_visitors_name_does_not_overwrite_it(lab_cache):
    from attnviz.models import load_model

    alice, bob = untrained(0, ALICE), untrained(1, BOB)
    folder = alice.save("class-model")
    with pytest.raises(lab.NameTaken) as refused:
        bob.save("class-model")
    assert "another visitor" in str(refused.value) and "lab/class-model-2 is free" in str(refused.value)
    assert str(lab_cache) not in str(refused.value)
    assert same_weights(alice, folder) and not same_weights(bob, folder)
    assert bob.snapshot().saved_as is None
    assert storage.taken_by_another("class-model", BOB) and not storage.taken_by_another("class-model", ALICE)
    assert not storage.taken_by_another("no-such-model", BOB)
    # every visitor still reads Alice's model by name, as every page loads it
    ids = torch.tensor([[lab.BOS_ID] + [ord(c) for c in "abcabc"]])
    with torch.no_grad():
        torch.testing.assert_close(load_model("lab/class-model", device="cpu").model(input_ids=ids).logits,
                                   alice.model(input_ids=ids).logits, rtol=0, atol=1e-6)
    with pytest.raises(lab.NameTaken):
        storage.delete_folder("class-model", BOB)
    assert same_weights(alice, folder)


def test_the_same_visitor_saving_again_replaces_their_own_model(lab_cache):
    first, second = untrained(0, ALICE), untrained(1, ALICE)
    folder = first.save("mine")
    second.save("mine")
    assert same_weights(second, folder) and not same_weights(first, folder)
    assert storage.owned_runs(ALICE) == ["mine"] and storage.owned_runs(BOB) == []
    storage.delete_folder("mine", ALICE)
    assert not folder.exists() and lab.saved_runs() == []


def test_an_automatic_save_under_a_taken_name_takes_the_first_free_one(lab_cache):
    """Two visitors train the same settings: both runs auto-save under the same default name, the second as
    <name>-2, and neither replaces the other; the second visitor's next run replaces their own <name>-2."""
    from attnviz import models

    cfg = lab.LabConfig(steps=2, d_model=32)
    name = cfg.default_name()
    alice = lab.LabRun(cfg, auto_save=name, owner=ALICE)
    alice.run()
    bob = lab.LabRun(lab.LabConfig(steps=2, d_model=32, lr=1e-2), auto_save=name, owner=BOB)  # other weights
    bob.run()
    assert alice.snapshot().saved_as == name and bob.snapshot().saved_as == f"{name}-2"
    assert bob.snapshot().error is None
    assert same_weights(alice, lab_cache / "trained" / name)
    assert same_weights(bob, lab_cache / "trained" / f"{name}-2")
    assert {f"lab/{name}", f"lab/{name}-2"} <= {s.name for s in models.available_models()}
    again = lab.LabRun(lab.LabConfig(steps=2, d_model=32, lr=3e-2), auto_save=name, owner=BOB)
    again.run()
    assert again.snapshot().saved_as == f"{name}-2" and storage.owned_runs(BOB) == [f"{name}-2"]
    assert same_weights(again, lab_cache / "trained" / f"{name}-2")


def test_a_folder_saved_without_an_owner_is_the_servers_and_no_visitor_replaces_it(lab_cache):
    script = untrained(0, None)
    folder = script.save("reference")
    with pytest.raises(lab.NameTaken):
        untrained(1, ALICE).save("reference")
    untrained(2, None).save("reference")  # the server's own scripts replace their folders as before
    assert storage.owner_of(folder) is None and not same_weights(script, folder)


def test_the_lab_file_keeps_a_digest_of_the_owner_not_the_token(lab_cache):
    folder = untrained(0, ALICE).save("digest")
    text = (folder / lab.LAB_FILE).read_text()
    assert ALICE not in text
    assert storage.owner_of(folder) == storage.owner_of(untrained(0, ALICE).save("digest-again"))


def test_the_longest_default_name_still_has_room_for_a_suffix(lab_cache):
    cfg = lab.LabConfig(task="induction", attention="learned_sink", steps=lab.MAX_STEPS, seed=2**31 - 1,
                        d_model=32)
    name = cfg.default_name()
    lab.LabRun(cfg, owner=ALICE).save(name)
    assert lab.LabRun(cfg, owner=BOB).save(name, rename=True).name == f"{name}-2"
    storage.check_name(f"{name}-999")


def test_the_count_quota_refuses_with_a_message_that_says_the_limit(lab_cache, monkeypatch):
    monkeypatch.setattr(storage, "MAX_RUNS_PER_OWNER", 2)
    run = untrained(0, ALICE)
    run.save("one")
    run.save("two")
    with pytest.raises(lab.QuotaExceeded) as refused:
        run.save("three")
    assert "the most one visitor may keep (2)" in str(refused.value)
    assert sorted(storage.owned_runs(ALICE)) == ["one", "two"] and not (lab_cache / "trained" / "three").exists()
    run.save("two")                     # replacing one's own model adds none
    untrained(1, BOB).save("three")     # the quota is per visitor
    storage.delete_folder("one", ALICE)
    run.save("three-a")                 # a deleted model frees its place
    assert [p.name for p in lab_cache.iterdir() if p.name.startswith(".lab-")] == []  # no half-saved folder left


def test_the_disk_quotas_refuse_with_a_message_that_says_the_limit(lab_cache, monkeypatch):
    run = lab.LabRun(lab.LabConfig(d_model=64), owner=ALICE)
    size = folder_bytes(run.save("first"))
    assert 0.5 * storage.MB < size < 0.7 * storage.MB  # the default model, as the constants' comments say
    monkeypatch.setattr(storage, "MAX_BYTES_PER_OWNER", 1 * storage.MB)
    with pytest.raises(lab.QuotaExceeded) as refused:
        run.save("second")
    message = str(refused.value)
    assert f"({size / 1e6:.1f} MB)" in message and f"{2 * size / 1e6:.1f} MB" in message
    assert "over the 1 MB one visitor may keep" in message and str(lab_cache) not in message
    run.save("first")  # the same size again, in place of the first: within the quota

    monkeypatch.setattr(storage, "MAX_BYTES_TOTAL", 1 * storage.MB)
    for owner in (BOB, None):  # the total binds every save, the server's scripts' too
        with pytest.raises(lab.QuotaExceeded) as refused:
            lab.LabRun(lab.LabConfig(d_model=64), owner=owner).save("another")
        assert "over the 1 MB they share" in str(refused.value)
    assert lab.saved_runs() == ["first"]
    assert storage.usage(ALICE) == storage.Usage(1, size, size)


def test_a_refused_automatic_save_is_reported_not_raised(lab_cache, monkeypatch):
    monkeypatch.setattr(storage, "MAX_BYTES_TOTAL", 1000)
    cfg = lab.LabConfig(steps=2, d_model=32)
    snap = lab.LabRun(cfg, auto_save=cfg.default_name(), owner=ALICE).run()
    assert snap.status == "done" and snap.saved_as is None
    assert snap.error.startswith("training ended, but the model was not saved: the server's space for toy-lab "
                                 "models is full")


def test_visitors_saving_one_name_at_once_leave_one_owner(lab_cache):
    """The check of a name and the rename that takes it happen under one lock: of four visitors saving the same
    new name at the same moment, one gets it and the three others are refused."""
    runs = [untrained(i, f"visitor-{i}") for i in range(4)]
    start, outcome = threading.Barrier(len(runs)), {}

    def save(i: int) -> None:
        start.wait()
        try:
            runs[i].save("race")
            outcome[i] = "saved"
        except lab.NameTaken:
            outcome[i] = "refused"

    threads = [threading.Thread(target=save, args=(i,)) for i in range(len(runs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    winners = [i for i, o in outcome.items() if o == "saved"]
    assert len(outcome) == 4 and len(winners) == 1
    assert storage.owned_runs(f"visitor-{winners[0]}") == ["race"]
    assert same_weights(runs[winners[0]], lab_cache / "trained" / "race")


def _trained_page(name: str | None = None):
    """The Toy lab page in a session of its own (AppTest: one browser session each), after a 20-step run that
    saved itself automatically, then, when `name` is given, a press of Save under that name."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"), default_timeout=120)
    at.session_state["lab_steps"] = 20
    at.session_state["lab_width"] = 32
    at.run()
    at.switch_page("app_pages/toy_lab.py").run()
    at.button(key="lab_train").click().run()
    assert at.session_state["lab_run"].join(timeout=120).status == "done"
    at.run()
    if name is not None:
        at.text_input(key="lab_save_name").set_value(name)
        at.button(key="lab_save").click().run()
    assert not at.exception, at.exception
    return at


def test_the_page_never_saves_over_another_sessions_model(lab_cache):
    first = _trained_page("class-model")
    mine = first.session_state["lab_run"]
    default = mine.config.default_name()
    assert mine.snapshot().saved_as == "class-model"
    second = _trained_page("class-model")
    theirs = second.session_state["lab_run"]
    refused = [e.value for e in second.error]
    assert refused == ["Not saved: lab/class-model was saved by another visitor and stays theirs; choose another "
                       "name (lab/class-model-2 is free)."]
    assert same_weights(mine, lab_cache / "trained" / "class-model")
    # both sessions trained the same settings: the second's automatic save took the default name's first free one
    assert theirs.snapshot().saved_as == f"{default}-2"
    assert same_weights(mine, lab_cache / "trained" / default)
    assert same_weights(theirs, lab_cache / "trained" / f"{default}-2")
    assert any(f"lab/{default}-2** (lab/{default} is another visitor's)" in s.value for s in second.success)
    assert not any("another visitor's" in s.value for s in first.success)
    # each session lists its own models, and deletes only those
    assert second.selectbox(key="lab_delete_name").options == [f"lab/{default}-2"]
    second.button(key="lab_delete").click().run()
    assert not second.exception and not (lab_cache / "trained" / f"{default}-2").exists()
    assert sorted(lab.saved_runs()) == sorted(["class-model", default])
