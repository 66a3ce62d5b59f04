"""Widgets of the Toy lab page: starting a run or a side-by-side comparison of the attention variants, with the
message a visitor sees when the server is busy. Runs live in the visitor's session state (they belong to whoever
started them); the lab caches nothing that sessions share."""

from __future__ import annotations

import streamlit as st

from attnviz import lab

SINK_TARGET = 0.3  # the sink metric benchmarks/sink_variants.py waits for


def start_run(config: lab.LabConfig, auto_save: bool) -> lab.LabRun | None:
    """A LabRun of `config` training in the background, or None after a message saying why not."""
    try:
        return lab.LabRun(config, auto_save=config.default_name() if auto_save else None).start()
    except lab.LabBusyError as exc:
        st.warning(f"{exc}. Each run takes at most {lab.MAX_SECONDS:.0f} s.")
    except ValueError as exc:
        st.error(f"Cannot train with these settings: {exc}")
    return None


def start_comparison(config: lab.LabConfig) -> lab.VariantComparison | None:
    """The four attention variants of `config` training side by side in the background, each saved when it ends
    (as lab/<its default name>), or None after a message saying why not."""
    try:
        return lab.VariantComparison(config, auto_save=True).start()
    except lab.LabBusyError as exc:
        st.warning(f"{exc}. A comparison takes at most {lab.MAX_SECONDS:.0f} s.")
    except ValueError as exc:
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
