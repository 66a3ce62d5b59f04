"""What both engines of a corpus run compute for a shard (shard_rows: every head's statistics on each of its
windows), and the fingerprint of the weights that every Ray node checks against the run's manifest. Below the
engines: attnviz.corpus.run (corpus_run, the local engine) and attnviz.corpus.ray both import it."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from attnviz.capture import capture_attention, input_device, records_inputs
from attnviz.cores import run_each
from attnviz.stats import head_stats, streaming_attend


def model_fingerprint(model) -> str:
    """sha256 of the model's weights (every state_dict tensor's name, dtype, shape and bytes, in order)."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def shard_rows(loaded, window_ids: Sequence[int], windows: Sequence[Sequence[int]]) -> pd.DataFrame:
    """Every head's statistics on each window (its token ids): one row per (window, layer, head) with window_id,
    layer, head, kv_head and the columns of attnviz.stats.COLUMNS (learned_sink too for a model that has sink
    logits). What both engines compute for a shard.

    On a CPU the windows run side by side, one per core (attnviz.cores.run_each, longest first): a 512-token
    window's products are too small to split well over cores (benchmarks/corpus.py measures the engine against the
    FLOP limit and transformers' own forward). On a GPU they run one after another."""
    tables: list[pd.DataFrame | None] = [None] * len(windows)

    def one(i: int) -> None:
        tables[i] = window_stats(loaded, [int(t) for t in windows[i]])
        tables[i].insert(0, "window_id", np.int64(window_ids[i]))

    order = sorted(range(len(windows)), key=lambda i: -len(windows[i]))
    run_each(one, order, n_workers=None if input_device(loaded.model).type == "cpu" else 1)
    return pd.concat(tables, ignore_index=True)


def window_stats(loaded, ids: list[int]) -> pd.DataFrame:
    """attnviz.stats.head_stats of one text given as token ids: computed during the forward pass (q and k, never the
    N x N pattern) where the family records q and k, else from the dense pattern."""
    if records_inputs(loaded.model):
        during = streaming_attend(ids, keep_inputs=False)
        capture = capture_attention(loaded, "(token ids)", token_ids=ids, store="qk", during=during)
    else:
        capture = capture_attention(loaded, "(token ids)", token_ids=ids)
    return head_stats(capture)
