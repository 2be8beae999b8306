"""The reskip cache folder and file digests: where converted backbones and extracted data live.

Nothing here downloads: the cache holds what reskip made from installed packages.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_root() -> Path:
    """Where converted backbones and extracted data live ($RESKIP_CACHE, default ~/.cache/reskip)."""
    return Path(os.environ.get("RESKIP_CACHE", Path.home() / ".cache" / "reskip"))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
