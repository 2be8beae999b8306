"""`reskip experiment scale`: does ReSkip's margin over static pruning grow with training tokens, and with
the backbone?

Each arm is the main job (`pipeline.run_pipeline`: parity, training, calibration, evaluation on the test
split and the held-out kjv, diagnostics with the signal test and its cost probes) at one preset's training
length (standard: 0.2M tokens, long: 0.8M, large: 2M) on one backbone (`--model`). An arm's folder,
OUT/experiments/scale/arms/<backbone>-<preset>, is an ordinary run folder, resumed as any run (a stopped
training continues from its last checkpoint), so one process per core can run arms side by side. The
results hold every finished arm found there, whichever backbone, read from the runs' files only:

- validation perplexity against the backbone's, test and kjv perplexity, the training wall time;
- A(n) of the best middle block;
- the budget frontier at 1, 1.5, 2 and 3 blocks per step against static, influence and random at the same
  measured skips, on the test split and on kjv, with the 95% bootstrap interval (over sequences) of
  ReSkip's perplexity ratio minus static's;
- per eligible block, the share of the oracle's headroom over random captured by alpha (signal), the cost
  probe, and the position-only chooser, at the signal test's highest rate.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ...backbones.loading import DEFAULT_BACKBONE
from ...errors import ReskipError
from ...run_folder import RunFolder
from ...run_folder.versions import read_run_file
from ...statistics import bootstrap_difference
from ..pipeline import PipelineConfig, config_of, run_pipeline
from .options import ExperimentOptions
from .record import claim, interval_text

SCALE_PRESETS = ("standard", "long", "large")
BUDGETS = (1.0, 1.5, 2.0, 3.0)  # blocks skipped per step, on average
GOAL_AT_TWO = 1.10  # at two blocks per step, perplexity within this multiple of the backbone's
GOAL_A = 1.15  # the best middle block's A(n) at most this
BASELINES = ("static", "influence", "random")


def arm_slug(model: str | None, preset: str) -> str:
    name = Path(model).name if model else DEFAULT_BACKBONE
    return "".join(c if c.isalnum() or c in ".-" else "-" for c in f"{name}-{preset}").strip("-")


def run(options: ExperimentOptions, folder: Path, show=print) -> dict | None:
    """Run (or resume) the chosen presets' arms on options.model; then the results of every finished arm."""
    presets = list(options.arms or SCALE_PRESETS)
    unknown = [p for p in presets if p not in SCALE_PRESETS]
    if unknown:
        raise ReskipError(f"`scale` has no arm {', '.join(map(repr, unknown))}; its arms: {', '.join(SCALE_PRESETS)} "
                          "(presets at 1x, 4x and 10x the standard training tokens)")
    overrides = {**options.overrides, "seed": options.seed}
    configs = {p: PipelineConfig(trust_remote_code=options.trust_remote_code, preset=p, model=options.model, data=list(options.data), overrides=overrides, dtype=options.dtype,
                                 device=options.device) for p in presets}
    for c in configs.values():  # every arm's configuration is checked before the first trains
        c.check()
    for k, (preset, config) in enumerate(configs.items(), start=1):
        where = folder / "arms" / arm_slug(options.model, preset)
        show(f"[experiment scale] arm {k}/{len(configs)}: {where.name}")
        run_pipeline(where, config, resume=RunFolder(where).pipeline.is_file())
    return results(folder)


def results(folder: Path) -> dict | None:
    """Every finished arm under `folder`/arms, measured from its files; None when there is none."""
    arms = {}
    for path in sorted((Path(folder) / "arms").glob("*/pipeline.json")):
        state = read_run_file(path)
        if "report" in state.get("finished", []):
            arms[path.parent.name] = measure_arm(path.parent)
    if not arms:
        return None
    arms = dict(sorted(arms.items(), key=lambda kv: (kv[1]["model"], kv[1]["tokens"])))
    models = sorted({a["model"] for a in arms.values()})
    return {"experiment": "scale", "preset": ", ".join(dict.fromkeys(a["preset"] for a in arms.values())),
            "model": ", ".join(models), "data": sorted({d for a in arms.values() for d in a["data"]}),
            "seed": sorted({a["seed"] for a in arms.values()}), "scale_arms": arms,
            "claims": claims(arms), "tables": tables(arms), "verdict": verdict(arms)}


def _read(path: Path) -> dict:
    return read_run_file(path)


def measure_arm(root: Path) -> dict:
    """One finished pipeline run -> its row of the scale table (files only)."""
    run = RunFolder(root)
    state, summary = _read(run.pipeline), _read(run.summary)
    ev = _read(root / "eval" / "results.json")
    policy, diag = _read(run.policy), _read(root / "diagnostics.json")
    train = config_of(state).train_config()
    middle = [b for b in policy["blocks"] if 1 < b["block"] < len(policy["blocks"])]
    best = min(middle, key=lambda b: b["A"])
    st = diag.get("signal_test")
    return {
        "model": state["model"] or DEFAULT_BACKBONE, "preset": state["preset"], "data": state["data"],
        "seed": train.seed, "dtype": state["dtype"], "tokens": train.steps * train.batch_size * train.seq_len,
        "train_wall_s": state["timings"]["train"], "wall_s": sum(state["timings"].values()),
        "val_ppl": summary["ppl_full"]["end"], "val_ppl_backbone": summary["ppl_backbone"],
        "test_ppl_ratio": ev["methods"]["retrofit"]["ppl_ratio"],
        "kjv_ppl_ratio": ev["heldout"]["methods"]["retrofit"]["ppl_ratio"] if ev.get("heldout") else None,
        "best_middle_block": {"block": best["block"], "A": best["A"]},
        "A": {str(b["block"]): b["A"] for b in middle},
        "frontier": {"test": frontier(ev["methods"]),
                     "kjv": frontier(ev["heldout"]["methods"], ev["methods"]) if ev.get("heldout") else None},
        "headroom": headroom(st) if st else None,
    }


def frontier(methods: dict, matched_on: dict | None = None) -> list[dict]:
    """ReSkip's budgets in BUDGETS against static, influence and random at its measured skips (the eval's
    matched baselines): perplexity / backbone of each, and ReSkip - static with its bootstrap interval.
    matched_on: the methods whose measured skips the baselines were matched to (the held-out source's are
    matched to the test split's: the policy skips more or fewer blocks there, and that drift is its own cost)."""
    back = methods["backbone"]["per_sequence"]
    full, targets = np.array(back["nll"], dtype=float), np.array(back["targets"], dtype=float)
    rows = []
    for b in BUDGETS:
        name = f"reskip:budget={b:g}"
        if name not in methods:
            continue
        r = methods[name]
        row = {"budget": b, "mean_skipped": r["mean_skipped"], "reskip": r["ppl_ratio"]}
        k = round((matched_on or methods)[name]["mean_skipped"], 2)
        row["baselines_at"] = k
        for kind in BASELINES:
            m = _matched(methods, kind, k)
            row[kind] = None if m is None else methods[m]["ppl_ratio"]
        st = _matched(methods, "static", k)
        if st is not None:
            a = np.array(r["per_sequence"]["nll"], dtype=float)
            s = np.array(methods[st]["per_sequence"]["nll"], dtype=float)
            row["reskip_minus_static"] = bootstrap_difference(full, a, s, targets)
        rows.append(row)
    return rows


def _matched(methods: dict, kind: str, k: float) -> str | None:
    """The eval's matched baseline of `kind` at k blocks per step (`evaluate.methods.matched_methods`' names)."""
    if kind != "random":
        name = f"{kind}:{k:g}"
        return name if name in methods else None
    found = [n for n, m in methods.items() if n.startswith("random:") and m.get("matched")
             and math.isclose(round(m["mean_skipped"], 2), k, abs_tol=0.15)]
    return min(found, key=lambda n: abs(methods[n]["mean_skipped"] - k)) if found else None


def headroom(st: dict) -> dict:
    """Per tested block at the highest rate: A(n), the oracle's headroom over random (ppl / full), and the
    share of it captured by each capturing chooser."""
    p = max(st["rates"])
    return {str(r["block"]): {"A": r.get("A"), "p": p, "oracle_headroom": r["ppl_ratio"]["random"] - r["ppl_ratio"]["oracle"],
                              **{c: v for c, v in r.get("captured", {"signal": r["captured_share"]}).items()}}
            for r in st["blocks"] if r["p"] == p}


def _at(arm: dict, split: str, budget: float) -> dict | None:
    rows = arm["frontier"].get(split) or []
    return next((r for r in rows if r["budget"] == budget), None)


def claims(arms: dict) -> list[dict]:
    """The compass's goals, per arm: met or not."""
    out = []
    for name, a in arms.items():
        for split in ("test", "kjv"):
            r = _at(a, split, 1.0)
            d = None if r is None else r.get("reskip_minus_static")
            out.append(claim(f"{name}: at one block per step ReSkip is below static beyond the interval ({split})",
                             "-" if d is None else f"reskip - static = {interval_text(d)}",
                             None if d is None else d["hi"] < 0))
        r = _at(a, "test", 2.0)
        out.append(claim(f"{name}: at two blocks per step within {GOAL_AT_TWO:.2f} x the backbone's perplexity (test)",
                         "-" if r is None else f"{r['reskip']:.4f}", None if r is None else r["reskip"] <= GOAL_AT_TWO))
        best = a["best_middle_block"]
        out.append(claim(f"{name}: the best middle block's A(n) <= {GOAL_A}", f"block {best['block']}: {best['A']:.3f}",
                         best["A"] <= GOAL_A))
    return out


def _f(x, fmt=".4f") -> str:
    return "-" if x is None else format(x, fmt)


def tables(arms: dict) -> dict:
    head = ["| arm | tokens | train wall (min) | val ppl / backbone | test ppl / backbone | kjv ppl / backbone "
            "| best middle A(n) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    head += [f"| {n} | {a['tokens']:,} | {a['train_wall_s'] / 60:.1f} | {a['val_ppl'] / a['val_ppl_backbone']:.4f} "
             f"| {a['test_ppl_ratio']:.4f} | {_f(a['kjv_ppl_ratio'])} | {a['best_middle_block']['A']:.3f} "
             f"(block {a['best_middle_block']['block']}) |" for n, a in arms.items()]
    front = ["| arm | split | budget | ReSkip's blocks / step | ReSkip | baselines' blocks / step | static | influence "
             "| random | ReSkip - static [95% CI] |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for n, a in arms.items():
        for split in ("test", "kjv"):
            for r in a["frontier"].get(split) or []:
                d = r.get("reskip_minus_static")
                ci = "-" if d is None else interval_text(d)
                front.append(f"| {n} | {split} | {r['budget']:g} | {r['mean_skipped']:.2f} | {r['reskip']:.4f} "
                             f"| {r['baselines_at']:g} | {_f(r['static'])} | {_f(r['influence'])} | {_f(r['random'])} "
                             f"| {ci} |")
    room = ["| arm | block | A(n) | oracle headroom (ppl / full) | captured by alpha | by the probe | by position |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for n, a in arms.items():
        for blk, h in (a["headroom"] or {}).items():
            room.append(f"| {n} | {blk} | {_f(h['A'], '.3f')} | {h['oracle_headroom']:.3f} | {_f(h.get('signal'), '.0%')} "
                        f"| {_f(h.get('probe'), '.0%')} | {_f(h.get('position'), '.0%')} |")
    return {"Arms (perplexities against the backbone's)": head,
            "The frontier against static, influence and random at matched skips": front,
            "Headroom over random captured per block (signal test, test split, highest rate)": room}


def verdict(arms: dict) -> str:
    """Does ReSkip's margin over static at one block per step grow with training tokens (per backbone)?"""
    parts = []
    for model in sorted({a["model"] for a in arms.values()}):
        series = []
        for name, a in arms.items():
            if a["model"] != model:
                continue
            margins = {s: (_at(a, s, 1.0) or {}).get("reskip_minus_static") for s in ("test", "kjv")}
            series.append(f"{a['tokens'] / 1e6:.1f}M tokens: " + ", ".join(
                f"{s} {_f(m and m['mean'], '+.4f')}" for s, m in margins.items()))
        parts.append(f"{model}: ReSkip - static at one block per step (ppl / backbone; below 0 favours ReSkip) "
                     + "; ".join(series))
    return ". ".join(parts) + "."
