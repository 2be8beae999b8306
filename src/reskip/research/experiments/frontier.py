"""`reskip experiment frontier`: fidelity against compute for every way to serve the model cheaper, in one table and
one figure, in domain and on the held-out source. Static points: the backbone and the separately `kd`-healed models
of the `nested` experiment (1..K blocks removed), joined by their per-sequence mixtures (`static_mixture`). Beside
them: the nested model at each depth, the `stacked` experiment's ReSkip on the healed model (when it has run), and
the source design's ReSkip judged on fidelity: the recipe with the backbone as its only teacher (its full path
distilled toward the backbone, `full_objective: kd`), its budget frontier calibrated to minimise KL to the backbone
(`budget_objective: kl`) at 0.5, 1, 1.5 and 2 blocks per step.

The rule, stated before the runs: a dynamic point becomes a product path at its compute when its KL to the
backbone is below the best static model or mixture at that compute beyond the 95% interval on both the test split
and the held-out source, with top-1 agreement not worse (its interval's upper end above 0).

Needs `reskip experiment nested` finished in the same OUT.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ...backbones.loading import DEFAULT_BACKBONE
from ...errors import ReskipError
from ...evaluate.run import evaluate_run
from ...io_atomic import atomic_write
from ...options import HELDOUT
from ...reading import read_json
from ...run_folder import RunFolder
from ...skip.policy_file import PolicyFile
from ...skip.spec import METHOD_KINDS, parse_specs
from ...train.checkpoint import latest_checkpoint
from ...train.run import train_run
from ..calibrate.run import calibrate_run
from ..pipeline import PipelineConfig
from ..report.figures import fig_fidelity_frontier
from .options import ExperimentOptions
from .record import claim, interval_text
from .results_file import read_results
from .static_mixture import backbone_row, minus_mixture, mixture, same_sequences

BUDGETS = (0.5, 1.0, 1.5, 2.0)
SPLITS = ("test", HELDOUT)
FIELDS = ("flops_executed_share", "kl_to_backbone", "top1_agreement", "ppl_ratio", "mean_skipped")


def run(options: ExperimentOptions, folder: Path, show=print) -> dict:
    root = folder.parent
    if not (root / "nested" / "results.json").is_file():
        raise ReskipError(f"{root / 'nested'} has no results.json: run `reskip experiment nested` with the same --out "
                          "first (its kd-healed models are the static points)")
    nested = read_results(root / "nested" / "results.json", "training", "rows", "depths")
    recipe = _recipe_eval(options, folder, show)
    # each stacked variant's eval (eval/: the recipe; eval-VARIANT/: the others), when that experiment has run
    stacked = {p.parent.name.removeprefix("eval").removeprefix("-") or "recipe": read_json(p)
               for p in sorted((root / "stacked").glob("eval*/results.json"))}
    out = {"experiment": "frontier", "preset": options.preset, "model": options.model or DEFAULT_BACKBONE,
           "data": list(options.data), "seed": options.seed, "budgets": list(BUDGETS), "splits": {},
           "training": nested["training"], "recipe_eval": str(folder / "eval" / "results.json"),
           "stacked": sorted(stacked)}
    for split in SPLITS:
        out["splits"][split] = _split(nested["rows"][split], _methods(recipe, split),
                                      {v: _methods(ev, split) for v, ev in stacked.items()}, nested["depths"],
                                      nested.get("variants", ["nested"]))
    out["claims"] = [c for c in (_claim(out, name) for name in _dynamic_names(out)) if c]
    out["tables"] = {f"Fidelity against compute ({s})": _table(out["splits"][s]) for s in SPLITS}
    png = fig_fidelity_frontier(out)[1]
    atomic_write(folder / "frontier.png", lambda tmp: Path(tmp).write_bytes(png))
    return out


def _recipe_eval(options: ExperimentOptions, folder: Path, show) -> dict:
    """Train (or read) the recipe with the backbone as its only teacher, calibrate its frontier for fidelity, and
    evaluate it against the backbone on the test split and the held-out source."""
    pc = PipelineConfig(trust_remote_code=options.trust_remote_code, preset=options.preset, model=options.model,
                        data=list(options.data), dtype=options.dtype, device=options.device,
                        overrides={**options.overrides, "seed": options.seed, "full_objective": "kd"})
    pc.check()
    run_dir = folder / "recipe-backbone-teacher"
    files = RunFolder(run_dir)
    if not files.summary.is_file():
        show("[experiment frontier] training the recipe with the backbone as its only teacher")
        train_run(run_dir, pc.train_config(), resume=latest_checkpoint(run_dir) is not None,
                  show_progress=not options.quiet, overwrite=True)
    if not files.policy.is_file() or PolicyFile.load(files.policy).data.get("budgets", {}).get("objective") != "kl":
        calibrate_run(run_dir, dataclasses.replace(pc.calibrate_options(), budgets=BUDGETS, budget_objective="kl"))
    path = folder / "eval" / "results.json"
    if not path.is_file():
        methods = parse_specs(["backbone", "retrofit", "budgets"], METHOD_KINDS)
        evaluate_run(run_dir, dataclasses.replace(pc.eval_options(), methods=methods, benchmarks=[], heldout=[HELDOUT],
                                                  out=str(folder / "eval")))
    return read_results(path, "methods", "heldout")


def _methods(ev: dict, split: str) -> dict:
    return ev["methods"] if split == "test" else ev["heldout"]["methods"]


def _split(nested: dict, recipe: dict, stacked: dict[str, dict], depths: int, variants: list[str]) -> dict:
    """Every point of one split: static (backbone, kd-k), nested:k, and the dynamic points each beside the static
    mixture at its compute."""
    static = {"backbone": backbone_row(nested["kd-1"]), **{f"kd-{k}": nested[f"kd-{k}"] for k in range(1, depths + 1)}}
    # name -> (family, row): each point's family travels with its row
    dynamic = {f"{v}:{k}": (v, nested[f"{v}:{k}"]) for v in variants for k in range(1, depths + 1)}
    dynamic.update({f"backbone-teacher {name}": ("backbone-teacher", r) for name, r in recipe.items()
                    if r["kind"] == "reskip"})
    for variant, rows in stacked.items():
        label = "stacked" if variant == "recipe" else f"stacked-{variant}"
        dynamic.update({f"{label} {name}": (label, r) for name, r in rows.items() if r["kind"] == "reskip"})
    points = {}
    for name, (family, r) in {**{n: ("static", r) for n, r in static.items()}, **dynamic}.items():
        same_sequences(r, static["kd-1"])
        points[name] = {"kind": "static" if name in static else "dynamic", "family": family,
                        **{f: r[f] for f in FIELDS if f in r}}
        mix = mixture(static, r["flops_executed_share"]) if name in dynamic else None
        if mix:
            points[name]["mixture"] = {k: mix[k] for k in ("between", "share_deeper", "kl", "top1")}
            points[name]["minus_mixture"] = minus_mixture(r, mix)
    return points


def _dynamic_names(out: dict) -> list[str]:
    return [n for n, p in out["splits"]["test"].items() if p["kind"] == "dynamic" and "minus_mixture" in p]


def _claim(out: dict, name: str) -> dict | None:
    at = {s: out["splits"][s].get(name) for s in SPLITS}
    if any(p is None or "minus_mixture" not in p for p in at.values()):
        return None
    held = all(p["minus_mixture"]["kl"]["hi"] < 0 and p["minus_mixture"]["top1"]["hi"] > 0 for p in at.values())
    measured = "; ".join(f"{s}: KL {p['kl_to_backbone']:.3f} vs {p['mixture']['kl']:.3f} "
                         f"({' / '.join(p['mixture']['between'])}), difference {p['minus_mixture']['kl']['mean']:+.3f} "
                         f"[{p['minus_mixture']['kl']['lo']:+.3f}, {p['minus_mixture']['kl']['hi']:+.3f}] at "
                         f"{p['flops_executed_share']:.3f} of the layer FLOPs" for s, p in at.items())
    return claim(f"{name} is closer to the backbone than the static models' mixture at its compute", measured, held)


def _table(points: dict) -> list[str]:
    lines = ["| point | kind | layer FLOPs | KL to backbone | top-1 agreement | ppl / backbone | static mixture there "
             "| KL - mixture [95%] | top-1 - mixture [95%] |", "| --- |" + " --- |" * 8]
    for name, p in sorted(points.items(), key=lambda kv: -kv[1]["flops_executed_share"]):
        mix = p.get("mixture")
        d = p.get("minus_mixture")
        there = "-" if not mix else f"{mix['kl']:.4f} ({mix['between'][0]} / {mix['between'][1]}, f {mix['share_deeper']:.2f})"
        cells = ["-", "-"] if not d else [interval_text(d[m])
                                          for m in ("kl", "top1")]
        lines.append(f"| {name} | {p['kind']} | {p['flops_executed_share']:.3f} | {p['kl_to_backbone']:.4f} "
                     f"| {p['top1_agreement']:.3f} | {p['ppl_ratio']:.3f} | {there} | {cells[0]} | {cells[1]} |")
    return lines
