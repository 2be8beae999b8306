"""Results files read back: what an experiment or an evaluation wrote, checked before it is used."""

from __future__ import annotations

from pathlib import Path

from ...errors import ReskipError
from ...reading import read_json


def read_results(path: Path, *keys: str) -> dict:
    """A results file an experiment or an evaluation wrote, read back: a JSON object holding `keys`; anything else
    (a file edited or cut) is one error naming the file and what is missing, never a traceback further on."""
    data = read_json(path)
    missing = [k for k in keys if not isinstance(data, dict) or k not in data]
    if missing:
        raise ReskipError(f"{path} is not the results file it should be ({', '.join(missing)} missing): it was "
                          "edited or cut; delete it and rerun the same command (finished arms are read back)")
    return data
