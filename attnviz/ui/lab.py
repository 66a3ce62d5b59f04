"""Widgets of the Toy lab page: starting a run or a side-by-side comparison of the attention variants, with the
message a visitor sees when the server is busy; saving and deleting a visitor's models. Runs live in the visitor's
session state (they belong to whoever started them); the lab caches nothing that sessions share.

A visitor is one browser session: visitor() makes its owner token (attnviz.lab.storage) the first time it is asked
for and keeps it in the session state, where the browser can neither read nor set it. A new session (a reload, a
new tab) is a new visitor: the models saved before stay readable by name, but only the old session could replace
or delete them."""

from __future__ import annotations

import logging
import secrets

import numpy as np
import streamlit as st

from attnviz import lab
from attnviz.errors import AttnvizError
from attnviz.lab import storage

log = logging.getLogger(__name__)

SINK_TARGET = 0.3  # the sink metric benchmarks/sink_variants.py waits for


def visitor() -> str:
    """This browser session's owner token, made once per session (secrets.token_hex: unguessable)."""
    if "lab_owner" not in st.session_state:
        st.session_state["lab_owner"] = secrets.token_hex(16)
    return st.session_state["lab_owner"]


def start_run(config: lab.LabConfig, auto_save: bool) -> lab.LabRun | None:
    """A LabRun of `config` training in the background, or None after a message saying why not."""
    try:
        return lab.LabRun(config, auto_save=config.default_name() if auto_save else None, owner=visitor()).start()
    except lab.LabBusyError as exc:
        st.warning(f"{exc}. Each run takes at most {lab.MAX_SECONDS:.0f} s.")
    except AttnvizError as exc:
        st.error(f"Cannot train with these settings: {exc}")
    return None


def start_comparison(config: lab.LabConfig) -> lab.VariantComparison | None:
    """The four attention variants of `config` training side by side in the background, each saved by this visitor
    when it ends (as lab/<its default name>, or the first free lab/<its default name>-k), or None after a message
    saying why not."""
    try:
        return lab.VariantComparison(config, auto_save=True, owner=visitor()).start()
    except lab.LabBusyError as exc:
        st.warning(f"{exc}. A comparison takes at most {lab.MAX_SECONDS:.0f} s.")
    except AttnvizError as exc:
        st.error(f"Cannot train with these settings: {exc}")
    return None

# What benchmarks/sink_variants.py measured on a shared 2-core CPU (one run per setting, every variant in it).
SINK_MEASUREMENT = (
    "Measured (benchmarks/sink_variants.py, 2-core CPU): on the **induction** task with 2 layers × **8 heads**, every "
    "variant's Sink₀^0.3 passes 0.3 by step 50, while the loss is still above chance (early in training all four "
    "park attention on <bos>); after 600 steps (about 25 s each) softmax keeps 24% of its (text, layer, head) triples "
    "as sinks, off by one 15%, the learned sink and the gate 12%, at the same loss (0.07–0.10 nats). On the byte-level "
    "**text** task (2 × 4 heads, 64-token rows) no variant forms a first-token sink within 1,000 steps (75–105 s "
    "each; Sink₀^0.3 stays at 0%, loss 0.36–0.45 nats): the two minutes of CPU a visitor gets are not enough for "
    "sinks to emerge from language modelling, so compare the variants' losses and maps there.")


def taken_by_another(name: str) -> bool:
    """Whether lab/<name> is another visitor's model."""
    return storage.taken_by_another(name, visitor())


def save_run(run: lab.LabRun, name: str) -> None:
    """Saves a finished run as lab/<name> for this visitor (owner: visitor(), set when the run started), or says in
    the page why not: another visitor's name, a limit, a bad name, a run still training, a failed write."""
    try:
        run.save(name)
    except AttnvizError as exc:  # StorageRefused, a bad name, a run still training: written for the page
        st.error(f"Not saved: {exc}.")
    except OSError:
        log.exception("saving a toy-lab run failed")
        st.error("Not saved: the server could not write the model. Try again, or train again later.")


def my_models() -> None:
    """The models this visitor saved, what they take against the limits, and a button that deletes one."""
    mine = storage.owned_runs(visitor())
    if not mine:
        return
    use = storage.usage(visitor())
    st.subheader("Your saved models")
    st.caption(f"You keep {use.runs} of at most {storage.MAX_RUNS_PER_OWNER} models, {use.bytes / storage.MB:.1f} MB "
               f"of the {storage.MAX_BYTES_PER_OWNER / storage.MB:.0f} MB one visitor may use; all visitors' models "
               f"take {use.total_bytes / storage.MB:.0f} MB of {storage.MAX_BYTES_TOTAL / storage.MB:.0f} MB. "
               "Every visitor can open them by name; only this browser session can replace or delete them (a "
               "reload starts a new session).")
    c1, c2, _ = st.columns([2, 1, 2])
    name = c1.selectbox("Model", mine, key="lab_delete_name", persist_state="session",
                        format_func=lambda n: f"lab/{n}")
    if c2.button("Delete", key="lab_delete") and name in mine:
        try:
            storage.delete_folder(name, visitor())
            st.rerun()
        except storage.StorageRefused as exc:
            st.error(f"Not deleted: {exc}.")


def variant_maps(comparison: lab.VariantComparison) -> tuple[list[str], dict[str, np.ndarray]] | None:
    """comparison.patterns on its map_text, computed once per comparison and kept in the session (the models are
    the session's own), or None after a message saying why not."""
    from attnviz.capture import CaptureError

    kept = st.session_state.get("lab_comparison_maps")
    if kept is not None and kept[0] is comparison:
        return kept[1]
    try:
        maps = comparison.patterns(comparison.map_text())
    except (CaptureError, RuntimeError) as exc:  # messages written for the page
        st.error(f"No maps: {exc}")
        return None
    st.session_state["lab_comparison_maps"] = (comparison, maps)
    return maps


def comparison_progress(comparison, noun: str) -> dict:
    """A side-by-side training's progress bar (the slowest model's step, the longest time) and each model's error,
    for a lab.VariantComparison or lab.HybridComparison; its snapshots {name: snapshot}, returned for the charts.
    noun: what the page calls one of the models ("variant", "model")."""
    snaps = comparison.snapshots()
    first = next(iter(snaps.values()))
    late = " (time limit reached)" if comparison.timed_out else ""
    st.progress(min(1.0, min(s.progress for s in snaps.values())),
                text=f"step {min(s.step for s in snaps.values())} of {first.config.steps} for each {noun}, "
                     f"{max(s.elapsed_s for s in snaps.values()):.0f} s{late}")
    for name, snap in snaps.items():
        if snap.error:
            st.error(f"{name.replace('_', ' ')}: {snap.error}.")
    return snaps
