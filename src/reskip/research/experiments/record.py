"""An experiment's files: OUT/results.json (the arms' measurements and the claims' verdicts) and
OUT/results.md (claim | what was measured | verdict, then the arms side by side). Written to a temp
file and renamed, so a stopped experiment never leaves half a table."""

from __future__ import annotations

from pathlib import Path
from statistics import median

from ...io_atomic import atomic_write_json, atomic_write_text
from .arms import beats_random, middle_blocks

RESULTS = "results.json"
TABLE = "results.md"


def claim(text: str, measured: str, held: bool | None) -> dict:
    """held: True, False, or None when the measurement cannot decide."""
    return {"claim": text, "measured": measured,
            "verdict": "held" if held else ("did not hold" if held is False else "undecided")}


def interval_text(d: dict) -> str:
    """A difference with its 95% interval, as every experiment's tables print it: +0.0123 [-0.0045, +0.0290]."""
    return f"{d['mean']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}]"


def write(folder: Path, result: dict) -> Path:
    folder = Path(folder)
    atomic_write_json(folder / RESULTS, result)
    atomic_write_text(folder / TABLE, markdown(result))
    return folder / RESULTS


def _cell(x) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def claims_table(claims: list[dict]) -> list[str]:
    out = ["| claim | what was measured | verdict |", "| --- | --- | --- |"]
    out += [f"| {_cell(c['claim'])} | {_cell(c['measured'])} | **{c['verdict']}** |" for c in claims]
    return out


def arms_table(arms: dict) -> list[str]:
    """One row per trained arm: its size, the damage on the way, where it ended, and its routing."""
    out = ["| arm | params | worst val ppl (step) | final val ppl | KL to backbone | min A(n), middle blocks "
           "| median w_recent 5-95% range | signal beats random (blocks) |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, a in arms.items():
        mids = middle_blocks(a)
        min_a = min((b["A"] for b in mids), default=None)
        ranges = [b["w_recent_range"] for b in mids if b["w_recent_range"] is not None]
        med = median(ranges) if ranges else None  # the same statistic as `mix`'s verdict reads
        beats = beats_random(a)
        out.append(f"| {name} | {a['params']:,} | {a['worst_ppl']:.3f} ({a['worst_step']}) | {a['final_ppl']:.3f} "
                   f"| {a['final_kl']:.4f} | {'-' if min_a is None else f'{min_a:.3f}'} "
                   f"| {'-' if med is None else f'{med:.4f}'} | {'not measured' if beats is None else beats or 'none'} |")
    return out


def curves_table(arms: dict) -> list[str]:
    """Validation perplexity at every logged step, one column per arm (every arm logs the same steps)."""
    names = list(arms)
    steps = [e["step"] for e in arms[names[0]]["curve"]]
    out = ["| step | c(t) | " + " | ".join(names) + " |", "| --- | --- |" + " --- |" * len(names)]
    for k, step in enumerate(steps):
        cells = [f"{arms[n]['curve'][k]['ppl']:.3f}" if k < len(arms[n]["curve"]) else "-" for n in names]
        out.append(f"| {step} | {arms[names[0]]['curve'][k]['c']:.2f} | " + " | ".join(cells) + " |")
    return out


def markdown(result: dict) -> str:
    b = result.get("training")
    lines = [f"# Experiment: {result['experiment']}", "",
             f"Backbone {result['model']}, data {result['data']}, preset {result['preset']}, seed {result['seed']}"
             + (f"; every arm {b['steps']} steps x {b['batch_size']} x {b['seq_len']} tokens ({b['tokens']:,} tokens)"
                if b else "") + f"; wall time {result['wall_s']:.0f} s.", "",
             "## Claims", "", *claims_table(result["claims"]), ""]
    if result.get("verdict"):
        lines += ["## Verdict", "", result["verdict"], ""]
    if result.get("arms"):
        lines += ["## Arms", "", *arms_table(result["arms"]), "", "## Validation perplexity during training", "",
                  *curves_table(result["arms"]), ""]
    for title, rows in result.get("tables", {}).items():
        lines += [f"## {title}", "", *rows, ""]
    return "\n".join(lines)
