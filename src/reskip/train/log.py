"""`train_log.jsonl`: one JSON record per line, `kind` "train" (a step) or "eval" (validation).

The one writer and the one reader of the log: training appends to it, the summary, the
diagnostics and the report read it through `read_log`. The log is the source of truth of a run;
summary.json is derived from it.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ReskipError
from ..io_atomic import atomic_write_text
from ..reading import is_finite_number, read_jsonl
from ..run_folder.versions import stamped


def append_record(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


# What every record holds, by kind: the fields the summary, resume and the report read (numbers, finite)
REQUIRED = {"train": ("loss",), "eval": ("ppl_full", "ppl_backbone")}


def check_record(record, path: Path, n: int) -> dict:
    """A record of the log as the readers need it (its kind, its step, its kind's numbers), or one error naming
    the file and the record."""
    def bad(what: str) -> ReskipError:
        return ReskipError(f"{path}: record {n} {what}: the log is corrupt; restore it, or train the run anew")

    if not isinstance(record, dict):
        raise bad(f"is not a JSON object ({type(record).__name__})")
    if record.get("kind") not in REQUIRED:
        raise bad(f"has kind {str(record.get('kind'))[:40]!r}, not one of {', '.join(REQUIRED)}")
    step = record.get("step")
    if not (isinstance(step, int) and not isinstance(step, bool) and step >= 0):
        raise bad(f"has step {str(step)[:40]!r}, not a whole number >= 0")
    for key in REQUIRED[record["kind"]]:
        if not is_finite_number(record.get(key)):
            raise bad(f"({record['kind']}) has {key} {str(record.get(key))[:40]!r}, not a finite number")
    return record


def truncate_after(path: Path, step: int) -> None:
    """On resume, drop records after the checkpoint's step so the log reads as one run."""
    if path.exists():
        keep = [r for r in read_log(path) if r["step"] <= step]  # a last record cut short is dropped too
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in keep))


def read_log(path: Path) -> list[dict] | None:
    """Every record of the log, each checked (`check_record`), or None when there is no log."""
    path = Path(path)
    if not path.is_file():
        return None
    # a last record cut short by a stopped process is left out
    return [check_record(r, path, n) for n, r in enumerate(read_jsonl(path), 1)]


def records(log: list[dict] | None, kind: str) -> list[dict]:
    """The records of one kind ("train" or "eval")."""
    return [r for r in log or [] if r["kind"] == kind]


def last_eval(path: Path) -> dict | None:
    """The last validation record, or None."""
    evals = records(read_log(path), "eval")
    return evals[-1] if evals else None


def summarize(path: Path, wall_s: float) -> dict:
    """First and last evaluation side by side (read from the log only)."""
    log = read_log(path) or []
    evals, trains = records(log, "eval"), records(log, "train")
    first, last = evals[0], evals[-1]
    return stamped("summary.json", {
        "steps": trains[-1]["step"] if trains else 0,
        "tokens_seen": last["tokens_seen"],
        "wall_s_process": wall_s,  # this process's training time (a resumed run's earlier processes not counted)
        "ppl_backbone": last["ppl_backbone"],
        "ppl_full": {"start": first["ppl_full"], "end": last["ppl_full"]},
        "kl_full": {"start": first["kl_full"], "end": last["kl_full"]},
        "entropy": {"start": first["entropy"], "end": last["entropy"], "max": last["entropy_max"]},
        "skip_kl": {"start": first.get("skip_kl"), "end": last.get("skip_kl")},
        "skip_ppl": {"start": first.get("skip_ppl"), "end": last.get("skip_ppl")},
    })


def format_summary(s: dict) -> str:
    lines = [
        f"steps {s['steps']}, tokens {s['tokens_seen']:,}, wall {s['wall_s_process']:.0f} s",
        f"validation perplexity: backbone {s['ppl_backbone']:.3f} | retrofit {s['ppl_full']['start']:.3f} -> "
        f"{s['ppl_full']['end']:.3f}   KL(backbone||retrofit) {s['kl_full']['end']:.4f}",
        "block  entropy start -> end (max log n)   skip-branch KL start -> end   skip-branch ppl end",
    ]
    for n in sorted(s["skip_kl"]["end"] or {}, key=int):
        first, last, top = (s["entropy"][x].get(n) for x in ("start", "end", "max"))
        ent = f"{first:.3f} -> {last:.3f} ({top:.3f})" if first is not None else "-  (no router)"
        ppl = (s["skip_ppl"]["end"] or {}).get(n)  # None: not measured at the last validation
        lines.append(f"{n:>5}  {ent:<32} {s['skip_kl']['start'][n]:.4f} -> {s['skip_kl']['end'][n]:.4f}"
                     f"{'' if ppl is None else f'   {ppl:.3f}'}")
    return "\n".join(lines)
