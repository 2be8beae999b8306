"""`reskip experiment stacked`: dynamic skipping stacked on the healed model. The `kd`-healed model with one block
removed (the `nested` experiment's `kd-1` arm, exported as a plain model) becomes the frozen backbone of the
retrofit (the standard recipe: side-channel, routers, the skip branch distilled from it); ReSkip on top at budgets
of 0.25, 0.5 and 0.75 of its blocks per step reaches the compute between the static points (1 and 2 blocks of the
original removed). Every method is compared with the *original* backbone (`reskip eval --reference`): KL per
position, top-1 agreement, perplexity ratio, compute as a share of the original's layers.

What a user would do instead at the same mean compute: per-sequence mixing of the two neighbouring static models
(`kd-1` and `kd-2` of the nested experiment; a share f of the sequences served by the deeper cut, f chosen so the
mean layer FLOPs equal the ReSkip point's). On the same sequences, stacked - mixture of KL and top-1 with 95%
bootstrap intervals, on the test split and the held-out source. The room a per-token signal has on the healed
model: the diagnose stage's signal test there (w_recent, a fitted cost probe and the hindsight oracle against
random positions, per block), kept beside the result.

`--variants backbone-teacher` also stacks the retrofit whose full path is distilled toward its backbone, the healed
model (`full_objective: kd`), instead of trained by cross-entropy on the mix: the recipe's full path moves away from
the original before anything is skipped.

Needs `reskip experiment nested` finished in the same OUT (its kd-1 and kd-2 arms and their rows).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ...backbones.loading import DEFAULT_BACKBONE
from ...compress.export import RECORD, export_run
from ...errors import ReskipError
from ...evaluate.methods import REFERENCE
from ...evaluate.run import evaluate_run
from ...options import HELDOUT
from ...reading import read_json
from ...run_folder import RunFolder
from ...skip.policy_file import PolicyFile
from ...skip.spec import METHOD_KINDS, parse_specs
from ...train.checkpoint import latest_checkpoint
from ...train.run import train_run
from ..calibrate.run import calibrate_run
from ..diagnose import diagnose_run
from ..pipeline import PipelineConfig
from .baselines import arm_name, arm_slug
from .options import ExperimentOptions
from .record import claim, interval_text
from .results_file import read_results
from .static_mixture import minus_mixture, mixture, same_sequences

BUDGETS = (0.25, 0.5, 0.75)  # blocks of the healed model per step: between the static points


def run(options: ExperimentOptions, folder: Path, show=print) -> dict:
    nested_dir = folder.parent / "nested"
    if not (nested_dir / "results.json").is_file():
        raise ReskipError(f"{nested_dir} has no results.json: run `reskip experiment nested` with the same --out "
                          "first (its kd-1 and kd-2 arms are the static models this experiment stacks on and "
                          "compares with)")
    nested = read_results(nested_dir / "results.json", "lr", "rows")
    arm = nested_dir / "arms" / arm_slug(arm_name("kd-1", nested["lr"]))
    healed = folder / "healed-1"
    if not (healed / RECORD).is_file():
        show(f"[experiment stacked] exporting {arm} as the backbone of the retrofit")
        export_run(arm, healed, "float32")
    original = options.model or DEFAULT_BACKBONE
    unknown = sorted(set(options.variants or ()) - set(VARIANTS))
    if unknown:
        raise ReskipError(f"stacked: no variant {', '.join(unknown)}; its variants: {', '.join(VARIANTS)}")
    asked = list(VARIANTS) if options.variants == [] else (options.variants or [])  # [] (the flag alone): all
    variants = ["recipe", *(v for v in VARIANTS if v in asked and v != "recipe")]
    out = {"experiment": "stacked", "preset": options.preset, "model": original, "data": list(options.data),
           "seed": options.seed, "healed_backbone": str(healed), "budgets": list(BUDGETS), "variants": variants,
           "points": {}, "retrofit": {}, "claims": [], "tables": {}}
    for variant in variants:
        pc, ev = _stacked_run(options, folder, healed, original, variant, show)
        splits = {"test": ev["methods"], HELDOUT: ev["heldout"]["methods"]}
        points = {s: _points(rows, nested["rows"][s]) for s, rows in splits.items()}
        out["points"][variant] = points
        out["retrofit"][variant] = {s: _summary(rows["retrofit"]) for s, rows in splits.items()}
        out["claims"] += [_claim(points, b, variant) for b in BUDGETS]
        out["tables"].update({f"Stacked ReSkip ({variant}) against the static mixture ({s})": _table(p)
                              for s, p in points.items()})
    files = RunFolder(folder / "run")
    if not files.diagnostics.is_file():
        show("[experiment stacked] the signal test on the healed model (oracle and probe headroom)")
        diagnose_run(files.root, pc_of(options, healed, "recipe").diagnose_options())
    out.update(static={s: {k: _summary(nested["rows"][s][k]) for k in ("kd-1", "kd-2")} for s in ("test", HELDOUT)},
               signal_test=_signal(read_json(files.diagnostics)), training=_training(pc_of(options, healed, "recipe")))
    return out


# the retrofit stacked on the healed model: the recipe (its full path trained by CE on the mix), or its full path
# distilled toward its backbone, the healed model (`full_objective: kd`)
VARIANTS = {"recipe": {}, "backbone-teacher": {"full_objective": "kd"}}


def pc_of(options: ExperimentOptions, healed: Path, variant: str) -> PipelineConfig:
    pc = PipelineConfig(trust_remote_code=options.trust_remote_code, preset=options.preset, model=str(healed),
                        data=list(options.data), dtype=options.dtype, device=options.device,
                        overrides={**options.overrides, "seed": options.seed, **VARIANTS[variant]})
    pc.check()
    return pc


def _stacked_run(options: ExperimentOptions, folder: Path, healed: Path, original: str, variant: str, show):
    """Train, calibrate (budgets between the static points) and evaluate against the original one stacked variant;
    (its pipeline config, its eval's results)."""
    pc = pc_of(options, healed, variant)
    suffix = "" if variant == "recipe" else f"-{variant}"
    run_dir, ev_dir = folder / f"run{suffix}", folder / f"eval{suffix}"
    files = RunFolder(run_dir)
    if not files.summary.is_file():
        show(f"[experiment stacked] training the retrofit ({variant}) on the healed model")
        train_run(run_dir, pc.train_config(), resume=latest_checkpoint(run_dir) is not None,
                  show_progress=not options.quiet, overwrite=True)
    if not files.policy.is_file() or not set(BUDGETS) <= set(PolicyFile.load(files.policy).budgets()):
        calibrate_run(run_dir, dataclasses.replace(pc.calibrate_options(), budgets=BUDGETS))
    if not (ev_dir / "results.json").is_file():
        methods = parse_specs(["backbone", "retrofit", "budgets"], METHOD_KINDS)
        evaluate_run(run_dir, dataclasses.replace(pc.eval_options(), methods=methods, benchmarks=[], heldout=[HELDOUT],
                                                  reference=original, out=str(ev_dir)))
    return pc, read_results(ev_dir / "results.json", "methods", "heldout")


def _summary(row: dict) -> dict:
    return {k: row[k] for k in ("kl_to_backbone", "top1_agreement", "ppl_ratio", "flops_executed_share")}


def _points(rows: dict, static: dict) -> list[dict]:
    """Each budget point of the stacked model beside the mixture of kd-1 and kd-2 at its mean layer FLOPs (per
    sequence: a share f of the sequences served by kd-2), with stacked - mixture and its 95% interval. The two
    evaluations scored the same sequences against the same original (checked: equal per-sequence positions and
    reference perplexity)."""
    pair = {k: static[k] for k in ("kd-1", "kd-2")}
    original = rows[REFERENCE]  # the stacked eval scores against the original through `--reference`
    same_sequences(original, pair["kd-1"])
    if not np.allclose(original["per_sequence"]["nll"], static["backbone"]["per_sequence"]["nll"], rtol=1e-5):
        raise ReskipError("the stacked eval and the nested experiment did not score against the same original: "
                          "rerun both with the same model, preset and dtype")
    out = []
    for name, r in rows.items():
        if r["kind"] != "reskip" or "budget" not in r["arguments"]:
            continue
        # outside the two static points' compute the mixture is the nearer one itself
        share = min(max(r["flops_executed_share"], pair["kd-2"]["flops_executed_share"]),
                    pair["kd-1"]["flops_executed_share"])
        mix = mixture(pair, share)
        out.append({"method": name, "budget": r["arguments"]["budget"], "mean_skipped": r["mean_skipped"],
                    "flops_executed_share": r["flops_executed_share"], "kl": r["kl_to_backbone"],
                    "top1": r["top1_agreement"], "ppl_ratio": r["ppl_ratio"], "mixture_share_kd2": mix["share_deeper"],
                    "mixture_kl": mix["kl"], "mixture_top1": mix["top1"], "minus_mixture": minus_mixture(r, mix)})
    return out


def _claim(points: dict, budget: float, variant: str):
    at = {s: next((p for p in ps if p["budget"] == budget), None) for s, ps in points.items()}
    if any(p is None for p in at.values()):
        return claim(f"stacked ReSkip ({variant}) at {budget:g} blocks per step is closer to the original than the "
                     "static mixture", "the budget was out of the calibrated frontier's reach", None)
    measured = "; ".join(f"{s}: KL {p['kl']:.3f} vs mixture {p['mixture_kl']:.3f}, difference "
                         f"{p['minus_mixture']['kl']['mean']:+.3f} [{p['minus_mixture']['kl']['lo']:+.3f}, "
                         f"{p['minus_mixture']['kl']['hi']:+.3f}] at {p['flops_executed_share']:.3f} of the layer FLOPs"
                         for s, p in at.items())
    return claim(f"stacked ReSkip ({variant}) at {budget:g} blocks of the healed model per step is closer to the "
                 "original than the static mixture beyond the 95% interval on every split", measured,
                 all(p["minus_mixture"]["kl"]["hi"] < 0 for p in at.values()))


def _table(points: list[dict]) -> list[str]:
    lines = ["| point | layer FLOPs | KL | top-1 | ppl / original | mixture: share kd-2 | mixture KL | mixture top-1 "
             "| stacked - mixture: KL [95%] | top-1 [95%] |", "| --- |" + " --- |" * 9]
    for p in points:
        d = p["minus_mixture"]
        lines.append(f"| {p['method']} | {p['flops_executed_share']:.3f} | {p['kl']:.4f} | {p['top1']:.3f} "
                     f"| {p['ppl_ratio']:.3f} | {p['mixture_share_kd2']:.2f} | {p['mixture_kl']:.4f} "
                     f"| {p['mixture_top1']:.3f} | " + " | ".join(
                         interval_text(d[m]) for m in ("kl", "top1")) + " |")
    return lines


def _signal(diagnostics: dict) -> dict | None:
    st = diagnostics.get("signal_test")
    if not st:
        return None
    return {"sentence": st["sentence"], "rates": st["rates"],
            "blocks": [{"block": b["block"], "p": b["p"], "ppl_ratio": b["ppl_ratio"], "captured": b["captured"]}
                       for b in st["blocks"]]}


def _training(pc: PipelineConfig) -> dict:
    cfg = pc.train_config()
    return {"steps": cfg.steps, "batch_size": cfg.batch_size, "seq_len": cfg.seq_len,
            "tokens": cfg.steps * cfg.batch_size * cfg.seq_len}
