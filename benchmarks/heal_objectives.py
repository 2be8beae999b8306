"""Healing objectives side by side at one budget: the backbone's cheapest K blocks removed and healed by the same
parameter-matched LoRA, on the same tokens and schedule, with `ce`, `kd` and `kd+ce` (`compress.objectives`); every
arm scored by `reskip eval` against the backbone on the test split and the held-out kjv (KL, top-1 agreement,
perplexity). Prints one JSON line and writes OUT/results[-VARIANT].json.

    python benchmarks/heal_objectives.py --out runs/heal --preset standard --lr 0.004 --objectives ce kd

Healing capacity and tokens beyond the matched budget (the product path's table): `--params-mult 8` (a LoRA of 8x
the side-channel's count), `--full-layers 2` (the two kept layers next to the cut and the final norm trained in
full, beside the matched LoRA on the other layers), `--steps 1000` (10x the standard preset's tokens).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from reskip.ar_retrofit.accounting import count_params
from reskip.backbones.loading import load_backbone, load_config
from reskip.compress.blocks import backbone_block_costs, layer_distances
from reskip.compress.healing_run import HealingConfig
from reskip.compress.train import train_lora
from reskip.data.packing import pack
from reskip.data.sources import load_splits
from reskip.evaluate.options import EvalOptions
from reskip.evaluate.run import evaluate_run
from reskip.research.pipeline import PRESETS, PipelineConfig
from reskip.skip.spec import METHOD_KINDS, parse_specs
from reskip.train.run import train_run
from reskip.train_config import TrainConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="standard")
    ap.add_argument("--lr", type=float, default=0.004)
    ap.add_argument("--drop", type=int, default=1, help="blocks removed (the backbone's cheapest by its own A(n))")
    ap.add_argument("--objectives", nargs="+", default=["ce", "kd"])
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--params-mult", type=float, default=1.0, help="the LoRA's parameters, x the side-channel's")
    ap.add_argument("--full-layers", type=int, default=0, help="kept layers next to the cut trained in full")
    ap.add_argument("--full-lr-mult", type=float, default=0.1, help="their learning rate, x --lr")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: the preset's)")
    ap.add_argument("--cut", choices=("blocks", "angular-run", "angular-single"), default="blocks")
    args = ap.parse_args()
    out = Path(args.out)
    pc = PipelineConfig(preset=args.preset)
    cfg = TrainConfig.from_dict({**pc.train_config().to_dict(), "lr": args.lr,
                                 **({"steps": args.steps} if args.steps else {})})
    target = round(args.params_mult * count_params(load_config(cfg.model), cfg.retrofit_config()).new_params)
    suffix = "".join([f"-{args.preset}" if args.preset != "standard" else "",
                      f"-p{args.params_mult:g}" if args.params_mult != 1 else "",
                      f"-full{args.full_layers}" if args.full_layers else "",
                      f"-{cfg.steps}steps" if args.steps else "",
                      f"-t{args.temperature:g}" if args.temperature != 1 else "",
                      "" if args.cut == "blocks" else f"-{args.cut}"])
    splits, _ = load_splits(cfg.data)
    model, tok = load_backbone(cfg.model, cfg.dtype)
    calib = pack(tok, splits["calib"], cfg.seq_len, PRESETS[args.preset]["calibrate"]["sequences"], seed=0)
    rc = cfg.retrofit_config()
    costs = backbone_block_costs(model, calib, rc.block_size, rc.boundaries)
    blocks = costs.cheapest(args.drop)
    layers = sorted(costs.layers_of(blocks))
    distances = None if args.cut == "blocks" else layer_distances(model, calib)
    if distances is not None:  # as many layers as the blocks hold, cut where the angular distance says
        layers = (distances.cheapest_run if args.cut == "angular-run" else distances.cheapest_single)(len(layers))
        blocks = costs.blocks_within(layers)
    arms = {}
    for objective in args.objectives:
        arm = HealingConfig(params=target, drop_layers=layers, drop_blocks=blocks,
                      objective=objective, temperature=args.temperature, full_layers=args.full_layers,
                      full_lr_mult=args.full_lr_mult)
        t0 = time.time()
        s = train_lora(cfg, arm, out / f"healed-{args.drop}-{objective}{suffix}", show_progress=True)
        arms[objective] = {"summary": s, "wall_s": time.time() - t0}
    rows = score_arms(cfg, args.preset, out, [out / f"healed-{args.drop}-{o}{suffix}" for o in args.objectives],
                      args.drop, f"eval{suffix}")
    result = {"preset": args.preset, "lr": args.lr, "drop_blocks": blocks, "drop_layers": layers, "cut": args.cut,
              "A": costs.A, "params": target,
              **({} if distances is None else {"angular_run": distances.cheapest_run(len(layers)),
                                               "angular_single": distances.cheapest_single(len(layers))}),
              "tokens": cfg.steps * cfg.batch_size * cfg.seq_len, "temperature": args.temperature,
              "full_layers": args.full_layers, "full_lr_mult": args.full_lr_mult,
              "arms": {o: {"val_ppl": a["summary"]["ppl_full"]["end"], "val_kl": a["summary"]["kl_full"]["end"],
                           "val_ppl_backbone": a["summary"]["ppl_backbone"], "train_wall_s": a["summary"]["train_wall_s"],
                           "lora_parameters": a["summary"]["lora"]["parameters"],
                           "full_parameters": a["summary"]["lora"].get("full_parameters", 0)}
                       for o, a in arms.items()},
              "rows": rows}
    (out / f"results{suffix}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


def score_arms(cfg: TrainConfig, preset: str, out: Path, arms: list[Path], drop: int, eval_name: str) -> dict:
    """The backbone, the unhealed cut of `drop` blocks and each arm scored by one `reskip eval` on the test split and
    kjv: {method: {split: {kl_to_backbone, top1_agreement, ppl_ratio}}}. The eval's host is a retrofit run of the same
    backbone and data (its adapter is not scored: only the backbone's references and the model methods are)."""
    host = out / "host"
    if not (host / "summary.json").is_file():
        train_run(host, TrainConfig.from_dict({**cfg.to_dict(), "steps": 1, "batch_size": 1, "eval_every": 1,
                                               "save_every": 1, "eval_sequences": 1}), show_progress=False,
                  overwrite=True)
    methods = ["backbone", f"pruned:{drop}", *(f"healed:{arm}" for arm in arms)]
    ev = evaluate_run(host, EvalOptions(methods=parse_specs(methods, METHOD_KINDS), heldout=["kjv"], benchmarks=[],
                                        seq_len=cfg.seq_len, quiet=True, out=str(out / eval_name),
                                        calib_sequences=PRESETS[preset]["calibrate"]["sequences"],
                                        **PRESETS[preset]["eval"] | {"mc_limit": 1}))
    r = json.loads(Path(ev).read_text())
    return {name: {split: {k: m[name][k] for k in ("kl_to_backbone", "top1_agreement", "ppl_ratio")}
                   for split, m in (("test", r["methods"]), ("kjv", r["heldout"]["methods"]))}
            for name in r["methods"]}


if __name__ == "__main__":
    main()
