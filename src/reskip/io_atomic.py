"""Atomic writes: a temp file (or folder) beside the target, then a rename. Never a half-written file, and a
folder written as a unit appears whole or not at all."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _as_created(path, mode: int) -> None:
    """mkstemp and mkdtemp make 0600 files and 0700 folders; what they become is made with the user's umask,
    like any file a program writes (so others can read a run where the umask lets them)."""
    os.chmod(path, mode & ~_umask())


def with_umask(folder: Path) -> None:
    """Every file and folder a library wrote inside `folder` with its own mode (safetensors writes 0600 whatever the
    umask) gets the mode the user's umask gives a new one, so an exported model, an adapter or a checkpoint can be
    read by another account (a service user) where the umask lets it; links are left alone."""
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            if not os.path.islink(os.path.join(root, name)):
                _as_created(os.path.join(root, name), 0o777)
        for name in files:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                executable = os.stat(p).st_mode & 0o111
                _as_created(p, 0o777 if executable else 0o666)


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Call write(tmp_path), then move tmp_path onto `path`; on failure `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        _as_created(tmp, 0o666)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def atomic_write_json(path: Path, obj) -> None:
    """Strict JSON: a value that is not a finite number (an undefined ratio) is written as null, never as NaN or
    Infinity, which JSON does not have and other readers refuse."""
    atomic_write_text(path, json.dumps(finite_or_null(obj), indent=2, allow_nan=False))


def finite_or_null(obj):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj


def atomic_folder(path: Path, write: Callable[[Path], None]) -> Path:
    """Call write(tmp_folder), then put tmp_folder in place of folder `path` (an existing one is replaced).

    A kill while writing leaves `path` as it was (its temporary is removed on the next call); a kill between
    the two renames leaves no `path` (readers refuse it with one line) and the previous folder beside it as
    `.NAME.*.old`, also removed on the next call."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in path.parent.glob(f".{path.name}.*.old"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        write(tmp)
        _as_created(tmp, 0o777)
        with_umask(tmp)
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".old"))
            os.replace(path, old / path.name)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path
