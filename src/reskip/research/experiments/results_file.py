"""Results files read back: what an experiment or an evaluation wrote, checked before it is used."""

from __future__ import annotations

from pathlib import Path

from ...errors import ReskipError
from ...reading import read_json

# Row and method names results files written before a rename still hold: (old prefix, current prefix). A method that
# removes blocks and heals them is `healed:K` (it was `healed-static:K`; `static:K` is the retrofit's skip policy).
RENAMED = (("healed-static:", "healed:"),)


def current_names(data):
    """`data` (a results file's JSON) with every name written before a rename (`RENAMED`) read as today's, in keys
    and in strings alike ("healed-static:1:kd - healed-static:1 (test)" -> "healed:1:kd - healed:1 (test)"); folders
    on disk keep their names (`baselines.arm_folder`)."""
    if isinstance(data, dict):
        return {current_names(k): current_names(v) for k, v in data.items()}
    if isinstance(data, list):
        return [current_names(v) for v in data]
    if isinstance(data, str):
        for old, new in RENAMED:
            data = data.replace(old, new)
    return data


def read_results(path: Path, *keys: str) -> dict:
    """A results file an experiment or an evaluation wrote, read back: a JSON object holding `keys`; anything else
    (a file edited or cut) is one error naming the file and what is missing, never a traceback further on. Names
    written before a rename read as today's (`current_names`)."""
    data = current_names(read_json(path))
    missing = [k for k in keys if not isinstance(data, dict) or k not in data]
    if missing:
        raise ReskipError(f"{path} is not the results file it should be ({', '.join(missing)} missing): it was "
                          "edited or cut; delete it and rerun the same command (finished arms are read back)")
    return data
