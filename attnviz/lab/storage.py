"""Where toy-lab models live: a folder per run under attnviz.paths.trained_dir(), holding the model (safetensors),
the byte tokenizer and LAB_FILE (the run's config and history). LAB_FILE is the one place the file name is
written; attnviz.positional and attnviz.models read it from here.

Many visitors share one server, so a folder belongs to whoever saved it: LAB_FILE keeps a digest of its owner (an
opaque token the caller holds, e.g. one per browser session; None for the server's own scripts). Every visitor
reads every folder by name (lab/<name>); only its owner replaces or deletes it. A save under a name another owner
holds is refused (NameTaken), or given the first free name "<name>-2", "<name>-3", ... when the caller asks
(rename=True: an automatic save, whose name the visitor never chose). Visitors' saves are limited in number and
size, and all saves together in size (QuotaExceeded). Every check and replacement happens under one lock, so two
saves at once never both take a name or both pass a limit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from attnviz.errors import AttnvizError
from attnviz.paths import cache_dir, trained_dir
from attnviz.lab.tasks import chance_loss
from attnviz.lab.variants import architecture
from attnviz.tokenizer import byte_tokenizer

LAB_FILE = "lab.json"  # beside a toy-lab model's weights: its config (positional scheme, attention) and history
MAX_NAME = 64          # a default name (LabConfig.default_name) is at most 54 characters; "-NN" must fit after it
_NAME = re.compile(rf"^[a-z0-9][a-z0-9_.-]{{0,{MAX_NAME - 1}}}$")
MB = 1_000_000

# What one visitor may keep. A comparison saves four models at once: room for two comparisons and four single runs.
MAX_RUNS_PER_OWNER = 12
# Twelve of the largest models the page builds (3 layers x 128 wide, gated: 3.2 MB with a 3,000-step history) fit;
# the default model is 0.6 MB.
MAX_BYTES_PER_OWNER = 48 * MB
# Every toy-lab save together, owners and scripts alike: twenty visitors' full quotas, or some 1,600 models of the
# default size. A visitor's quota lasts one browser session (a new session is a new visitor), so this cap is what
# bounds the disk however many sessions a class opens.
MAX_BYTES_TOTAL = 1000 * MB
_SUFFIXES = 999        # "<name>-2" .. "<name>-999": the free names an automatic save may take


class StorageRefused(AttnvizError, ValueError):
    """A save, delete or read refused for a reason the visitor can act on; the message says which and is safe to
    show."""


class NameTaken(StorageRefused):
    """The name belongs to another owner's model."""


class QuotaExceeded(StorageRefused):
    """The save would pass a limit on count or disk; the message names the limit."""


@dataclass(frozen=True)
class Usage:
    """What an owner keeps (runs, bytes) and what every toy-lab folder takes (total_bytes)."""

    runs: int
    bytes: int
    total_bytes: int


def check_name(name: str) -> None:
    """Raises StorageRefused (a ValueError) when `name` cannot be a toy-lab folder name."""
    if not _NAME.match(name):
        raise StorageRefused(f"a name is 1-{MAX_NAME} lowercase letters, digits, '-', '_' or '.', starting with a "
                             "letter or digit")


def history(snap) -> dict:
    """A run's snapshot (attnviz.lab.training.RunSnapshot) as JSON: config, architecture, final status, per-step
    losses and per-checkpoint head scores and sink metric."""
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


def save_folder(model, snap, name: str, owner: str | None = None, *, rename: bool = False) -> Path:
    """Writes the model (safetensors, with any gate weights), the byte tokenizer and LAB_FILE (with the owner's
    digest) to trained_dir()/name, replacing the owner's own folder of that name in one rename (a reader never sees
    half a folder). Returns the folder, whose name differs from `name` only when rename=True and another owner holds
    `name`. Raises NameTaken (another owner's name, rename=False) or QuotaExceeded."""
    check_name(name)
    key = _owner_key(owner)
    tmp = Path(tempfile.mkdtemp(prefix=".lab-", dir=cache_dir()))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        byte_tokenizer().save_pretrained(tmp)
        (tmp / LAB_FILE).write_text(json.dumps({"owner": key, **history(snap)}, indent=1))
        with _locked():
            name = _claim(name, key, rename)
            target = trained_dir() / name
            _check_quota(key, target, _folder_bytes(tmp))
            _replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def delete_folder(name: str, owner: str | None) -> None:
    """Removes the owner's folder `name`; StorageRefused when there is none, NameTaken when another owner's."""
    check_name(name)
    key = _owner_key(owner)
    with _locked():
        target = trained_dir() / name
        if not target.is_dir():
            raise StorageRefused(f"there is no toy-lab model called lab/{name}")
        if owner_of(target) != key:
            raise NameTaken(f"lab/{name} was saved by another visitor; only they can delete it")
        _replace(None, target)


def owner_of(folder) -> str | None:
    """The owner digest a folder's LAB_FILE records; None for a folder saved without an owner (or before owners)."""
    owner = (read_history(folder) or {}).get("owner")
    return owner if isinstance(owner, str) else None


def owned_runs(owner: str | None) -> list[str]:
    """Names of the folders `owner` saved, sorted."""
    key = _owner_key(owner)
    return [f.name for f in _folders() if owner_of(f) == key]


def usage(owner: str | None) -> Usage:
    """How many folders `owner` keeps and their bytes, and the bytes of every toy-lab folder."""
    key = _owner_key(owner)
    sizes = [(owner_of(f), _folder_bytes(f)) for f in _folders()]
    mine = [b for k, b in sizes if k == key]
    return Usage(len(mine), sum(mine), sum(b for _, b in sizes))


def taken_by_another(name: str, owner: str | None) -> bool:
    """Whether a folder `name` exists and another owner saved it (so `owner` cannot replace it)."""
    return _taken(trained_dir() / name, _owner_key(owner))


def _taken(folder: Path, key: str | None) -> bool:
    return folder.exists() and owner_of(folder) != key


def _owner_key(owner: str | None) -> str | None:
    """What LAB_FILE stores for an owner: a digest, so that a file read by anyone does not hand out the token."""
    return None if owner is None else hashlib.sha256(owner.encode()).hexdigest()[:32]


def _claim(name: str, key: str | None, rename: bool) -> str:
    """`name` when it is free or the owner's own; else, with rename, the first free (or own) "<name>-k"."""
    candidates = [name] + [f"{name[:MAX_NAME - len(f'-{k}')]}-{k}" for k in range(2, _SUFFIXES + 1)]
    for candidate in candidates if rename else candidates[:1]:
        if not _taken(trained_dir() / candidate, key):
            return candidate
    if rename:
        raise NameTaken(f"lab/{name} and {_SUFFIXES - 1} names after it are taken by other visitors; save under "
                        "another name")
    free = _claim(name, key, rename=True)
    raise NameTaken(f"lab/{name} was saved by another visitor and stays theirs; choose another name "
                    f"(lab/{free} is free)")


def _check_quota(key: str | None, target: Path, size: int) -> None:
    """QuotaExceeded when a folder of `size` bytes at `target` (replacing the owner's own) passes a limit."""
    replaced = _folder_bytes(target) if target.is_dir() else 0
    total = sum(_folder_bytes(f) for f in _folders()) - replaced + size
    if total > MAX_BYTES_TOTAL:
        raise QuotaExceeded(f"the server's space for toy-lab models is full: this model ({size / MB:.1f} MB) would "
                            f"bring every visitor's saved models to {total / MB:.0f} MB, over the "
                            f"{MAX_BYTES_TOTAL / MB:.0f} MB they share; delete one of your models first")
    if key is None:  # the server's own scripts: only the total applies
        return
    mine = [f for f in _folders() if f != target and owner_of(f) == key]
    if len(mine) + 1 > MAX_RUNS_PER_OWNER:
        raise QuotaExceeded(f"you already keep {len(mine)} toy-lab models, the most one visitor may keep "
                            f"({MAX_RUNS_PER_OWNER}); delete one of yours first, or save under one of your own "
                            "names to replace it")
    kept = sum(_folder_bytes(f) for f in mine) + size
    if kept > MAX_BYTES_PER_OWNER:
        raise QuotaExceeded(f"this model ({size / MB:.1f} MB) would bring your saved models to {kept / MB:.1f} MB, "
                            f"over the {MAX_BYTES_PER_OWNER / MB:.0f} MB one visitor may keep; delete one of yours "
                            "first")


def _replace(new: Path | None, target: Path) -> None:
    """Puts `new` at `target` (None: removes `target`) in one rename; the old folder is deleted afterwards."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=".lab-old-", dir=cache_dir()))
        os.replace(target, old / target.name)
    if new is not None:
        os.replace(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _folders() -> list[Path]:
    return [p for p in trained_dir().iterdir() if p.is_dir()]


def _folder_bytes(folder: Path) -> int:
    """The bytes of every file under `folder`; a file removed meanwhile (a save replacing it) counts 0."""
    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, f))
    return total


_THREADS = threading.Lock()


@contextlib.contextmanager
def _locked():
    """One save or delete at a time: a thread lock within this server, a file lock between processes."""
    with _THREADS, open(cache_dir() / ".lab.lock", "w") as fh:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: the thread lock alone
            yield
            return
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_history(folder) -> dict | None:
    """The LAB_FILE of a folder, or None when it has none or it cannot be read."""
    try:
        return json.loads((Path(folder) / LAB_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def saved_history(name: str) -> dict:
    """The LAB_FILE of the model saved as lab/<name> (its config, architecture, losses and checkpoints: history's
    fields), which the Toy lab's charts are drawn from. Raises StorageRefused for a name that cannot be one, or when
    no toy-lab model is saved under it."""
    try:
        check_name(name)
    except ValueError as exc:
        raise StorageRefused(str(exc)) from None
    saved = read_history(trained_dir() / name)
    if saved is None:
        raise StorageRefused(f"no toy-lab model is saved as lab/{name}")
    return saved


def saved_runs() -> list[str]:
    """Names of the models saved by the lab (folders under trained_dir() holding a LAB_FILE), sorted."""
    return sorted(p.name for p in trained_dir().iterdir() if (p / LAB_FILE).is_file())
