"""Where toy-lab models live: a folder per run under attnviz.paths.trained_dir(), holding the model (safetensors),
the byte tokenizer and LAB_FILE (the run's config and history). LAB_FILE is the one place the file name is
written; attnviz.positional and attnviz.models read it from here."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

from attnviz.paths import cache_dir, trained_dir

LAB_FILE = "lab.json"  # beside a toy-lab model's weights: its config (positional scheme, attention) and history
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,47}$")


def check_name(name: str) -> None:
    """Raises ValueError when `name` cannot be a toy-lab folder name."""
    if not _NAME.match(name):
        raise ValueError("a name is 1-48 lowercase letters, digits, '-', '_' or '.', starting with a letter "
                         "or digit")


def history(snap) -> dict:
    """A run's snapshot (attnviz.lab.training.RunSnapshot) as JSON: config, architecture, final status, per-step
    losses and per-checkpoint head scores and sink metric."""
    from attnviz.lab.tasks import chance_loss
    from attnviz.lab.variants import architecture

    cfg = snap.config
    return {
        "config": asdict(cfg),
        "architecture": architecture(cfg),
        "status": snap.status,
        "steps_trained": snap.step,
        "chance_loss": chance_loss(cfg.n_letters, cfg.task),
        "losses": snap.losses,
        "checkpoints": [{"step": c.step, "loss": None if math.isnan(c.loss) else c.loss,
                         "previous_token": c.previous_token.tolist(), "induction": c.induction.tolist(),
                         "sink": c.sink.tolist(), "sink_rate": c.sink_rate} for c in snap.checkpoints],
    }


def save_folder(model, snap, name: str) -> Path:
    """Writes the model (safetensors, with any gate weights), the byte tokenizer and LAB_FILE to trained_dir()/name,
    replacing any folder of that name in one rename (a reader never sees half a folder)."""
    from attnviz.tokenizer import byte_tokenizer

    check_name(name)
    target = trained_dir() / name
    tmp = Path(tempfile.mkdtemp(prefix=".lab-", dir=cache_dir()))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        byte_tokenizer().save_pretrained(tmp)
        (tmp / LAB_FILE).write_text(json.dumps(history(snap), indent=1))
        old = None
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=".lab-old-", dir=cache_dir()))
            os.replace(target, old / name)
        os.replace(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def read_history(folder) -> dict | None:
    """The LAB_FILE of a folder, or None when it has none or it cannot be read."""
    try:
        return json.loads((Path(folder) / LAB_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def saved_runs() -> list[str]:
    """Names of the models saved by the lab (folders under trained_dir() holding a LAB_FILE), sorted."""
    return sorted(p.name for p in trained_dir().iterdir() if (p / LAB_FILE).is_file())
