"""Resolve data specs ("default", "kjv", files, folders, HF dataset ids) into four disjoint splits."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..errors import ReskipError
from .documents import SPLITS, Document, read_hf_dataset, read_user_file, split_of
from .heldout import HELDOUT_SOURCES, kjv_documents
from .mix import default_mix

TEXT_SUFFIXES = (".txt", ".md", ".jsonl", ".py", ".rst")


def load_splits(specs: list[str]) -> tuple[dict[str, list[Document]], dict]:
    """Documents per split for the given specs, and a record of where they came from."""
    if not specs:
        raise ReskipError("no data given: use 'default' for the bundled mix, or files / dataset ids")
    splits: dict[str, list[Document]] = {s: [] for s in SPLITS}
    record = {"specs": list(specs), "parts": []}
    for spec in specs:
        if spec == "default":
            mix, manifest = default_mix()
            for s in SPLITS:
                splits[s].extend(mix[s])
            record["parts"].append({"spec": spec, "manifest": manifest})
            continue
        path = Path(spec).expanduser()
        if spec in HELDOUT_SOURCES and not path.exists():
            docs = kjv_documents()
        elif path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file())
            if not files:
                raise ReskipError(f"folder {path} holds no {'/'.join(TEXT_SUFFIXES)} files")
            docs = [d for f in files for d in read_user_file(f)]
        elif path.exists() or path.suffix in TEXT_SUFFIXES:
            docs = read_user_file(path)
        else:
            docs = read_hf_dataset(spec)
        for d in docs:
            splits[split_of(d.doc_id)].append(d)
        record["parts"].append({"spec": spec, "documents": len(docs)})
    if not splits["train"]:
        raise ReskipError(f"the data {specs} gave no training documents: the data set is empty")
    record["splits"] = {
        s: {
            "documents": len(docs),
            "by_source": {src: sum(d.source == src for d in docs) for src in sorted({d.source for d in docs})},
            "ids_sha256": hashlib.sha256("\n".join(d.doc_id for d in docs).encode()).hexdigest(),
        }
        for s, docs in splits.items()
    }
    return splits, record
