"""Atomic file writes: a temp file in the same folder, then a rename. Never a half-written file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Call write(tmp_path), then move tmp_path onto `path`; on failure `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2))
