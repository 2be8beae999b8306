"""`reskip experiment nested`: one model for every depth. One LoRA is trained so that the backbone with its first
1, 2, ... K blocks removed (one fixed nested order: the middle blocks by their cost to the backbone, KL of the
single-block ablation on the calibration split) is each distilled from the whole backbone (`kd`): at every step
the student runs at one depth (`train.schedules.nested_depth`: each depth once in every K steps) and the teacher
(the backbone: all layers, the LoRA off) once. Depth 0 is the backbone itself (the LoRA not applied).

Beside it, what a user would do instead: a separate `kd`-healed model per depth (the same blocks removed), each
with the same trainable parameters and the same training tokens as the nested model alone, so the nested model
spends 1/K of the separate models' total. Scored by the one evaluator against the backbone (KL per position, top-1
agreement, perplexity) on the data's test split and the held-out sources, with 95% bootstrap intervals over
sequences for nested - separate at each depth; the target: KL within 10% of the separate model's.

Arms: OUT/experiments/nested/arms/<name>@<lr> (nested, kd-1, ..., kd-K), each a LoRA run folder that resumes; a
finished one is read back, so separate processes can train arms side by side (`--arms nested kd-1`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ...ar_retrofit.accounting import count_params
from ...backbones.loading import load_config
from ...compress.blocks import BlockCosts
from ...compress.healing_run import HealingConfig
from ...compress.train import train_lora
from ...data.heldout import HELDOUT_SOURCES
from ...errors import ReskipError
from ...evaluate.against_backbone import Reference
from ...options import PRESETS
from ...run_folder import RunFolder
from ...skip.spec import Spec
from ...statistics import bootstrap_mean_difference, bootstrap_sum_ratio
from ..pipeline import PipelineConfig
from .baselines import _block_costs, arm_name, arm_slug
from .options import ExperimentOptions
from .record import claim, interval_text

RANK_BY = "kl"  # the nested order: the middle blocks by KL(backbone || the block removed), cheapest first
WITHIN = 0.10  # the target: the nested model's KL within 10% of the separately healed model's at each depth


NESTED = ("nested", "nested-sum")  # the nested model at one arm's tokens, and at the separate arms' sum


def arms_of(costs: BlockCosts, depths: int, params: int, summed: bool = False) -> dict[str, HealingConfig]:
    """The nested arm (and with `summed` its twin trained K times as long) and one separately kd-healed arm per
    depth, on the same blocks."""
    order = costs.ranked(RANK_BY)[:depths]
    if len(order) < depths:
        raise ReskipError(f"--depths {depths}: the backbone has {len(order)} middle blocks")
    nested = HealingConfig(params=params, objective="kd", nested_blocks=order,
                     nested_layers=[list(costs.blocks[n - 1]) for n in order])
    arms = {"nested": nested, **({"nested-sum": nested} if summed else {})}
    for k in range(1, depths + 1):
        blocks = sorted(order[:k])
        arms[f"kd-{k}"] = HealingConfig(params=params, drop_layers=sorted(costs.layers_of(blocks)), drop_blocks=blocks,
                                  objective="kd")
    return arms


def run(options: ExperimentOptions, folder: Path, show=print) -> dict | None:
    lrs = options.lrs or [0.002]
    if len(lrs) != 1:
        raise ReskipError(f"--lrs: `nested` trains every arm at one learning rate, got {lrs}")
    pc = PipelineConfig(trust_remote_code=options.trust_remote_code, preset=options.preset, model=options.model,
                        data=list(options.data), overrides={**options.overrides, "seed": options.seed, "lr": lrs[0]},
                        dtype=options.dtype, device=options.device)
    pc.check()
    cfg = pc.train_config()
    params = count_params(load_config(cfg.model, cfg.trust_remote_code), cfg.retrofit_config()).new_params
    costs = _block_costs(pc, folder, show)
    arms = arms_of(costs, options.depths, params, options.nested_sum)
    unknown = set(options.arms or ()) - set(arms)
    if unknown:
        raise ReskipError(f"`nested` has no arm {', '.join(sorted(unknown))}; its arms: {', '.join(arms)}")
    where = {name: folder / "arms" / arm_slug(arm_name(name, cfg.lr)) for name in arms}
    summaries, pending = {}, []
    for name, arm in arms.items():
        if options.arms and name not in options.arms and not RunFolder(where[name]).summary.is_file():
            pending.append(name)
            continue
        show(f"[experiment nested] arm {name}")
        steps = cfg.steps * (options.depths if name == "nested-sum" else 1)
        summaries[name] = train_lora(dataclasses.replace(cfg, steps=steps), arm, where[name],
                                     show_progress=not options.quiet)
    if pending:
        show(f"[experiment nested] not trained yet: {', '.join(pending)}")
        return None
    variants = [v for v in NESTED if v in arms]
    measured = _measure(pc, cfg.seq_len, options.depths, where, variants, show)
    out = {"experiment": "nested", "preset": options.preset, "model": cfg.model, "data": list(cfg.data),
           "seed": cfg.seed, "lr": cfg.lr, "params": params, "rank_by": RANK_BY,
           "nested_blocks": arms["nested"].nested_blocks, "depths": options.depths, "variants": variants,
           "training": {"steps": cfg.steps, "batch_size": cfg.batch_size, "seq_len": cfg.seq_len,
                        "tokens": cfg.steps * cfg.batch_size * cfg.seq_len,
                        "steps_per_arm": {n: s["steps"] for n, s in summaries.items()},
                        "wall_s": {n: s["train_wall_s"] for n, s in summaries.items()}},
           "validation": {n: {"kl": s["kl_full"]["end"], "ppl": s["ppl_full"]["end"],
                              **({"kl_depth": s["kl_depth"], "ppl_depth": s["ppl_depth"]} if n in NESTED else {})}
                          for n, s in summaries.items()},
           "backbone_blocks": costs.to_dict(), **measured}
    out["claims"] = claims(out)
    out["tables"] = {f"Fidelity to the backbone at each depth ({split})": table(out, split) for split in out["rows"]}
    return out


def table(out: dict, split: str) -> list[str]:
    """One row per model on one split: its blocks removed, compute, fidelity and perplexity; beside each nested
    depth, nested - separate with its 95% interval."""
    rows = out["rows"][split]
    lines = ["| model | blocks removed | layer FLOPs | KL to backbone | top-1 agreement | ppl / backbone "
             "| nested - separate: KL [95%] | top-1 [95%] |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in rows.items():
        if name == "backbone":
            continue
        variant, _, k = name.partition(":")
        d = out["minus_separate"].get(variant, {}).get(split, {}).get(k)
        cells = ("-", "-") if d is None else tuple(
            interval_text(d[m]) for m in ("kl", "top1"))
        lines.append(f"| {name} | {r['mean_skipped']:g} | {r['flops_executed_share']:.3f} | {r['kl_to_backbone']:.4f} "
                     f"| {r['top1_agreement']:.3f} | {r['ppl_ratio']:.3f} | {cells[0]} | {cells[1]} |")
    return lines


def _measure(pc: PipelineConfig, seq_len: int, depths: int, where: dict[str, Path], variants: list[str],
             show) -> dict:
    cfg = pc.train_config()
    ref = Reference.load(cfg.model, cfg.dtype, cfg.device, cfg.trust_remote_code, cfg.retrofit_config().block_size)
    specs = {f"{v}:{k}": Spec("nested", f"{v}:{k}", k=k, run=str(where[v]))
             for v in variants for k in range(depths + 1)}
    specs.update({f"kd-{k}": Spec("healed", f"kd-{k}", run=str(where[f"kd-{k}"])) for k in range(1, depths + 1)})
    methods = ref.methods(specs)
    n = PRESETS[pc.preset]["eval"]["sequences"]
    scored = ref.score(methods, {"test": list(cfg.data), **{h: [h] for h in HELDOUT_SOURCES}}, n, seq_len,
                       lambda line: show(f"[experiment nested] {line}"))
    rows = {split: {name: {k: r[k] for k in ("kind", "arguments", "ppl_ratio", "kl_to_backbone", "top1_agreement",
                                             "flops_executed_share", "mean_skipped", "per_sequence")}
                    for name, r in s["rows"].items()} for split, s in scored.items()}
    return {"dtype": ref.context.dtype, "sequences": n, "rows": rows,
            "minus_separate": {v: {split: _differences(r, v, depths) for split, r in rows.items()} for v in variants}}


def _differences(rows: dict, variant: str, depths: int) -> dict:
    """Per depth: nested - separate of KL and of top-1 agreement with 95% intervals, and KL nested / separate."""
    out = {}
    for k in range(1, depths + 1):
        a, b = rows[f"{variant}:{k}"]["per_sequence"], rows[f"kd-{k}"]["per_sequence"]
        counts = np.array(a["positions"], float)
        out[str(k)] = {"kl": bootstrap_mean_difference(np.array(a["kl"], float), np.array(b["kl"], float), counts),
                       "top1": bootstrap_mean_difference(np.array(a["agree"], float), np.array(b["agree"], float),
                                                         counts),
                       "kl_ratio": bootstrap_sum_ratio(np.array(a["kl"], float), np.array(b["kl"], float))}
    return out


def claims(out: dict) -> list[dict]:
    """At each depth, for each nested variant: its KL within 10% of the separate model's, on every split."""
    result = []
    for v in out["variants"]:
        budget = "the tokens of one separate model" if v == "nested" else \
            f"the separate models' summed tokens ({out['depths']} x one)"
        for k in range(1, out["depths"] + 1):
            ratios = {s: d[str(k)]["kl_ratio"] for s, d in out["minus_separate"][v].items()}
            measured = "; ".join(f"{s}: KL {out['rows'][s][f'{v}:{k}']['kl_to_backbone']:.3f} vs "
                                 f"{out['rows'][s][f'kd-{k}']['kl_to_backbone']:.3f} ({r['mean']:.2f}x, 95% "
                                 f"[{r['lo']:.2f}, {r['hi']:.2f}])" for s, r in ratios.items())
            result.append(claim(f"{v} ({budget}) at {k} block(s) removed: KL to the backbone within {WITHIN:.0%} of "
                                "the separately kd-healed model's", measured,
                                all(r["mean"] <= 1 + WITHIN for r in ratios.values())))
    return result
