"""The original's greedy replies to a prompt set, kept in the reskip cache: computed once per model (its fingerprint:
family, layers, config and a digest of its weights), prompt set (its sha256), reply length and dtype, then read back.
A file that does not match its key or does not parse is ignored and written again."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..cache import cache_root
from ..io_atomic import atomic_write_json
from .sampling import Written


def cache_path(key: dict) -> Path:
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return cache_root() / "chat-replies" / f"{name}.json"


def read_replies(key: dict) -> list[Written] | None:
    path = cache_path(key)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("key") != key:
            return None
        return [Written([int(t) for t in r["ids"]], None if r["stop"] is None else int(r["stop"]))
                for r in data["replies"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_replies(key: dict, replies: list[Written]) -> Path:
    path = cache_path(key)
    atomic_write_json(path, {"key": key, "replies": [{"ids": r.ids, "stop": r.stop} for r in replies]})
    return path
