"""Where attnviz keeps what it writes: converted models, trained toy-lab models.

ATTNVIZ_CACHE_DIR overrides the whole location; otherwise $XDG_CACHE_HOME/attnviz or ~/.cache/attnviz.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The root of attnviz's cache. Created on first use."""
    root = os.environ.get("ATTNVIZ_CACHE_DIR")
    if root:
        path = Path(root)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        path = Path(base) / "attnviz"
    path.mkdir(parents=True, exist_ok=True)
    return path


def converted_dir() -> Path:
    """Safetensors folders converted from bundled GGUF files, one per model."""
    path = cache_dir() / "converted"
    path.mkdir(parents=True, exist_ok=True)
    return path


def trained_dir() -> Path:
    """Models trained in the toy lab, one safetensors folder each; listed as models named 'lab/<folder>'."""
    path = cache_dir() / "trained"
    path.mkdir(parents=True, exist_ok=True)
    return path
