"""A corpus run's folder. Everything in it is written aside and then renamed into place, so a run killed at any
moment leaves only whole files:

  manifest.json          what the run is: the model (and a sha256 of its weights), the tokenizer (and a sha256 of
                         its vocabulary and rules), the window lengths, the field, the data's fingerprint, the shard
                         size and the attnviz version. A second run into the folder must match it or is refused.
  windows.parquet        the plan: one row per window (window_id, window, doc, source, offset, n_tokens, text, ids),
                         window_id in run order, a shard being SHARD_WINDOWS consecutive ids
  shards/shard-NNNNN.parquet   every head's statistics of that shard's windows (window_id, layer, head, kv_head and
                         the columns of attnviz.stats.COLUMNS): present means whole, so a run started again computes
                         only the shards not there, and every window is in exactly one shard file.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pandas as pd

from attnviz.corpus.sources import CorpusError

MANIFEST = "manifest.json"
WINDOWS = "windows.parquet"
SHARDS = "shards"
FORMAT = "attnviz corpus run 1"
# what must match for a run to go on in a folder (the data's file names may differ, its fingerprint may not)
IDENTITY = ("format", "model_fingerprint", "tokenizer_fingerprint", "windows", "max_windows", "field",
            "data_fingerprint", "shard_windows", "layers")


class RunFolder:
    """The folder `path` of one corpus run; `name` is how messages call it (a page passes the run's name)."""

    def __init__(self, path: str | os.PathLike, name: str | None = None):
        self.path = Path(path)
        self.name = name or str(path)

    # -- the manifest and the plan --------------------------------------------------------------------------------

    def manifest(self) -> dict | None:
        try:
            return json.loads((self.path / MANIFEST).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise CorpusError(f"{self.name}: its manifest cannot be read; it is not a corpus run.") from exc

    def start(self, manifest: dict, windows: pd.DataFrame) -> None:
        """Makes the folder this run's: writes the plan and the manifest, or checks that the manifest there is this
        run's (CorpusError naming what differs otherwise)."""
        self._clear_aside()
        existing = self.manifest()
        if existing is not None:
            different = [k for k in IDENTITY if existing.get(k) != manifest.get(k)]
            if different:
                raise CorpusError(f"{self.name} holds another run ({', '.join(different)} differ): give another "
                                  "output folder, or the same arguments to go on with that run.")
            if not (self.path / WINDOWS).is_file():
                self.write(WINDOWS, windows)
            return
        if self.path.exists() and any(p.name not in (WINDOWS, SHARDS) and not p.name.startswith(".")
                                      for p in self.path.iterdir()):
            raise CorpusError(f"{self.name} is a folder that holds other files: give a new or empty folder.")
        self.path.mkdir(parents=True, exist_ok=True)
        self.write(WINDOWS, windows)
        self.write(MANIFEST, manifest)

    def _clear_aside(self) -> None:
        """Removes the files a killed writer left aside (.NAME.PID.tmp) whose process is gone from this machine."""
        for folder in (self.path, self.path / SHARDS):
            for aside in folder.glob(".*.tmp") if folder.is_dir() else ():
                pid = aside.name.rsplit(".", 2)[-2]
                if pid.isdigit() and not _alive(int(pid)):
                    aside.unlink(missing_ok=True)

    def windows(self, columns=None) -> pd.DataFrame:
        return pd.read_parquet(self.path / WINDOWS, columns=columns)

    # -- shards ---------------------------------------------------------------------------------------------------

    def shard_path(self, shard: int) -> Path:
        return self.path / SHARDS / f"shard-{shard:05d}.parquet"

    def done_shards(self) -> set[int]:
        folder = self.path / SHARDS
        if not folder.is_dir():
            return set()
        return {int(p.stem.split("-")[1]) for p in folder.glob("shard-*.parquet")}

    def write_shard(self, shard: int, rows: pd.DataFrame) -> None:
        self.write(f"{SHARDS}/{self.shard_path(shard).name}", rows)

    def complete(self) -> bool:
        manifest = self.manifest()
        return manifest is not None and len(self.done_shards()) == manifest["n_shards"]

    # -- whole files, written aside and renamed ------------------------------------------------------------------

    def write(self, relative: str, content) -> None:
        """Writes a DataFrame (Parquet) or a dict (JSON) to relative, atomically: a temporary file beside it, flushed
        to the disk, then renamed over it. A full disk leaves nothing half-written and says so."""
        target = self.path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        aside = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            if isinstance(content, pd.DataFrame):
                content.to_parquet(aside, index=False)
            else:
                aside.write_text(json.dumps(content, indent=1), encoding="utf-8")
            with open(aside, "rb") as f:
                os.fsync(f.fileno())
            os.replace(aside, target)
        except OSError as exc:
            aside.unlink(missing_ok=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise CorpusError(f"No space left on the disk while writing {self.name}/{relative}: free some space "
                                  "and run the same command again; it goes on from there.") from exc
            raise CorpusError(f"Cannot write {self.name}/{relative} ({exc.strerror or 'write error'}).") from exc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
