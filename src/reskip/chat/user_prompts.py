"""The user's own prompts (`reskip compress --prompts FILE`): what their traffic asks, answered by the original to heal
on. A text file holds one prompt a line; a `.jsonl` file one JSON object a line with a `prompt` (or `text`) string,
or a `messages` list whose first user turn is the prompt. Empty lines are skipped; repeated prompts count once."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ReskipError
from ..reading import read_text
from .template import normalized


def _from_json(line: str, where: str) -> str:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ReskipError(f"{where} is not valid JSON ({e})") from None
    if isinstance(row, dict):
        for key in ("prompt", "text"):
            if isinstance(row.get(key), str):
                return row[key]
        messages = row.get("messages")
        if isinstance(messages, list):
            for m in messages:
                if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str):
                    return m["content"]
    raise ReskipError(f"{where} has no `prompt` or `text` string and no `messages` list with a user turn")


def read_prompts(path: Path) -> list[str]:
    """The file's prompts, in order, each once; one clear error naming the file (and line) otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ReskipError(f"--prompts {path}: no such file (one prompt a line, or JSONL with a `prompt` field)")
    out, seen = [], set()
    for n, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        text = (_from_json(line, f"{path}:{n}") if path.suffix == ".jsonl" else line).strip()
        if text and normalized(text) and normalized(text) not in seen:
            seen.add(normalized(text))
            out.append(text)
    if not out:
        raise ReskipError(f"--prompts {path} holds no prompt")
    return out
