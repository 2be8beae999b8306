"""Documents and their deterministic assignment to train / validation / calibration / test.

A document is the unit of splitting: a chat conversation, or a segment (~4,000
characters, cut at blank lines) of a long text such as a play or a source file. The
split of a document is a pure function of its id, so it never changes between
runs, machines or processes, and the four splits are disjoint by construction.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ReskipError
from ..reading import read_text

SPLITS = ("train", "val", "calib", "test")
# Fractions of documents per split (hash buckets): most for training, the rest equal.
SPLIT_FRACTIONS = {"train": 0.91, "val": 0.03, "calib": 0.03, "test": 0.03}
SEGMENT_CHARS = 4000


@dataclass
class Document:
    """`text` for plain text, `messages` ([{role, content}]) for chat; `source` names the mix part. `open_end`: the
    last assistant turn was cut at a token limit (a reply the model wrote itself), so nothing is taught to end it."""

    doc_id: str
    source: str
    text: str | None = None
    messages: list[dict] | None = field(default=None)
    open_end: bool = False

    def to_json(self) -> dict:
        d = {"doc_id": self.doc_id, "source": self.source}
        d.update({"text": self.text} if self.messages is None else {"messages": self.messages})
        return {**d, **({"open_end": True} if self.open_end else {})}

    @classmethod
    def from_json(cls, d: dict) -> "Document":
        return cls(d["doc_id"], d["source"], d.get("text"), d.get("messages"), bool(d.get("open_end", False)))


def split_of(doc_id: str) -> str:
    """Hash bucket of a document id -> its split name."""
    u = int.from_bytes(hashlib.sha256(doc_id.encode()).digest()[:8], "big") / 2**64
    edge = 0.0
    for name in SPLITS:
        edge += SPLIT_FRACTIONS[name]
        if u < edge:
            return name
    return SPLITS[-1]


def segments(text: str, max_chars: int = SEGMENT_CHARS) -> list[str]:
    """Cut a long text at blank lines into pieces of at most ~max_chars (a longer paragraph stays whole)."""
    out, current = [], []
    size = 0
    for para in text.split("\n\n"):
        if current and size + len(para) > max_chars:
            out.append("\n\n".join(current))
            current, size = [], 0
        current.append(para)
        size += len(para) + 2
    if current and "".join(current).strip():
        out.append("\n\n".join(current))
    return out


def text_documents(name: str, text: str, source: str) -> list[Document]:
    return [Document(f"{source}:{name}#{i}", source, seg) for i, seg in enumerate(segments(text))]


def read_user_file(path: Path) -> list[Document]:
    """Plain text (.txt/.md/...), JSONL with `text`, or chat JSONL with `messages`."""
    if not path.is_file():
        raise ReskipError(f"data file {path} does not exist")
    source = path.stem
    if path.suffix != ".jsonl":
        return text_documents(path.name, path.read_text(encoding="utf-8", errors="replace"), source)
    docs = []
    for i, line in enumerate(read_text(path).splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ReskipError(f"{path}:{i + 1} is not valid JSON ({e})") from e
        if not isinstance(row, dict):
            raise ReskipError(f"{path}:{i + 1} is not a JSON object with a `text` string or a `messages` list")
        if isinstance(row.get("messages"), list):
            open_end = row.get("open_end", False)
            if not isinstance(open_end, bool):
                raise ReskipError(f"{path}:{i + 1}: open_end must be true or false")
            docs.append(Document(f"{source}:{i}", source, messages=check_messages(row["messages"], f"{path}:{i + 1}"),
                                 open_end=open_end))
        elif isinstance(row.get("text"), str):
            docs.extend(text_documents(f"{path.name}:{i}", row["text"], source))
        else:
            raise ReskipError(f"{path}:{i + 1} has neither a `text` string nor a `messages` list")
    return docs


def check_messages(messages: list, where: str) -> list[dict]:
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") or not isinstance(
            m.get("content"), str
        ):
            raise ReskipError(f"{where}: each message needs role system/user/assistant and a content string")
    if not any(m["role"] == "assistant" for m in messages):
        raise ReskipError(f"{where}: a chat needs at least one assistant message (the loss is on those)")
    return messages


def read_hf_dataset(name: str, split: str = "train") -> list[Document]:
    """A Hugging Face dataset id (needs `datasets` and either the network or its local cache)."""
    try:
        import datasets  # lazy: optional (installed by the user for hub dataset ids), and heavy
    except ImportError as e:
        raise ReskipError(f"reading the dataset {name!r} needs `pip install datasets`") from e
    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as e:  # noqa: BLE001 - datasets raises many types; report one clear line
        raise ReskipError(f"cannot load dataset {name!r} ({type(e).__name__}: {e})") from e
    docs = []
    for i, row in enumerate(ds):
        if isinstance(row.get("messages"), list):
            docs.append(Document(f"{name}:{i}", name, messages=check_messages(row["messages"], f"{name}[{i}]")))
        elif isinstance(row.get("text"), str):
            docs.extend(text_documents(str(i), row["text"], name))
    if not docs:
        raise ReskipError(f"dataset {name!r} has no `text` or `messages` column")
    return docs
