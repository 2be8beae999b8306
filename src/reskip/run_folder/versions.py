"""The format version of each JSON run file reskip writes, and one upgrade per file kind from each older version to
the next: a user's older file loads under today's names, and no reader keeps a fallback to an old key name.

A file without `format_version` is version 1. Readers call `read_run_file` (or `upgraded` on data already read);
writers stamp `format_version` with `stamped`."""

from __future__ import annotations

from pathlib import Path

from ..errors import ReskipError
from ..reading import read_json


def _summary_from_1(d: dict) -> None:
    # the training process's wall time had another name
    if "wall_s_this_session" in d:
        d["wall_s_process"] = d.pop("wall_s_this_session")
    _summary_skip_ppl(d)


def _diagnostics_from_1(d: dict) -> None:
    # the second source document's instance was called the "seed" instance
    memory = d.get("memory")
    if isinstance(memory, dict) and "seed_instance" in memory:
        memory["source_instance"] = memory.pop("seed_instance")


def _pipeline_from_1(d: dict) -> None:
    d.setdefault("dtype", "float32")  # a run recorded without a dtype ran in float32, the only one there was


def _summary_skip_ppl(d: dict) -> None:
    d.setdefault("skip_ppl", {"start": None, "end": None})  # not measured then


def _policy_from_1(d: dict) -> None:
    adapter = d.get("adapter")
    if isinstance(adapter, dict):
        adapter.setdefault("forward_config", None)  # not kept then: the forward's settings cannot be checked
    calibration = d.get("calibration")
    if isinstance(calibration, dict):
        calibration.setdefault("wall_s", None)  # not recorded then


def _policy_from_2(d: dict) -> None:
    adapter = d.get("adapter")
    if isinstance(adapter, dict):  # its side-channel digest was taken over the tensors' names before the rename
        adapter["legacy_tensor_names"] = True


def _results_from_1(d: dict) -> None:
    # rows were keyed by their method's name only: each gets the kind and arguments its name was written with (the
    # grammar's first word; a budget the one argument a reader of an old file needs)
    tables = [d.get("methods"), (d.get("heldout") or {}).get("methods")]
    for rows in (t for t in tables if isinstance(t, dict)):
        for name, row in rows.items():
            if isinstance(row, dict) and "kind" not in row:
                kind, _, rest = str(name).partition(":")
                budget = rest.split(":")[0][len("budget="):] if rest.startswith("budget=") else None
                row["kind"] = kind
                row["arguments"] = {"budget": float(budget)} if budget else {}


# file name -> (today's version, {version: the upgrade from it to the next})
FILE_VERSIONS = {
    "summary.json": (2, {1: _summary_from_1}),
    "diagnostics.json": (2, {1: _diagnostics_from_1}),
    "pipeline.json": (2, {1: _pipeline_from_1}),
    "policy.json": (3, {1: _policy_from_1, 2: _policy_from_2}),
    "parity.json": (1, {}),
    "results.json": (2, {1: _results_from_1}),  # the eval stage's (an experiment's is read as it is, by its report)
}


# What every reader of a kind may rely on, after its upgrade: top-level key -> the JSON types it may hold (the
# deeper checks belong to the kind's own reader: PolicyFile.validate, the pipeline's state check).
_NUMBER = (int, float)
SCHEMAS = {
    "summary.json": {"steps": (int,), "tokens_seen": (int,), "wall_s_process": _NUMBER, "ppl_backbone": _NUMBER,
                     "ppl_full": (dict,), "kl_full": (dict,), "entropy": (dict,), "skip_kl": (dict,),
                     "skip_ppl": (dict,)},
    "diagnostics.json": {"n_blocks": (int,), "blocks": (list,), "dilution": (dict,), "memory": (dict,),
                         "routing_health": (list,), "mean_alpha": (dict,)},
    "pipeline.json": {"finished": (list,), "timings": (dict,)},
    "policy.json": {"backbone": (dict,), "adapter": (dict,), "delta": _NUMBER, "quantile": _NUMBER,
                    "window": (int,), "max_skips": (int,), "blocks": (list,), "mean_alpha": (dict,)},
    "results.json": {"meta": (dict,), "methods": (dict,), "frontier": (list,)},
    "parity.json": {"parity": (list,), "params": (dict,)},
}


_KIND_NAMES = {(int,): "an integer", _NUMBER: "a number", (dict,): "an object", (list,): "a list"}


def _check_schema(kind: str, data: dict, where) -> None:
    for key, types in SCHEMAS[kind].items():
        if key not in data:
            raise ReskipError(f"{where}: missing field {key!r}; the file is corrupt or cut short: restore it, or run "
                              "its stage again")
        if isinstance(data[key], bool) or not isinstance(data[key], types):
            raise ReskipError(f"{where}: {key} must be {_KIND_NAMES[types]}, got {str(data[key])[:40]!r}; the file "
                              "is corrupt: restore it, or run its stage again")


def version_of(kind: str) -> int:
    return FILE_VERSIONS[kind][0]


def stamped(kind: str, data: dict) -> dict:
    """`data` with today's format_version of `kind` (what a writer saves)."""
    return {"format_version": version_of(kind), **{k: v for k, v in data.items() if k != "format_version"}}


def upgraded(kind: str, data, where) -> dict:
    """`data` of a `kind` file (`where` names it in errors) upgraded in place to today's version."""
    if not isinstance(data, dict):
        raise ReskipError(f"{where}: the top level is not a JSON object; it is corrupt: restore or remove it")
    if kind == "summary.json" and "lora" in data:  # the other summary.json: a healing run's (its own fields)
        raise ReskipError(f"{where} is a healing run's summary (a LoRA run, not the retrofit's): its figures are "
                          "in the baselines experiment's report (`reskip report OUT` of the experiment's --out)")
    today, steps = FILE_VERSIONS[kind]
    version = data.get("format_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= today:
        raise ReskipError(f"{where} has format_version {version!r}; this reskip reads versions 1 to {today}: "
                          "upgrade reskip, or remove the file")
    for v in range(version, today):
        steps[v](data)
    data["format_version"] = today
    _check_schema(kind, data, where)
    return data


def read_run_file(path: Path, kind: str | None = None):
    """A run file; one of the versioned kinds (`kind`, else the file's own name: summary.json, diagnostics.json,
    pipeline.json, policy.json) upgraded to today's version, any other read as it is."""
    kind = kind or Path(path).name
    data = read_json(path)
    return upgraded(kind, data, path) if kind in FILE_VERSIONS else data
