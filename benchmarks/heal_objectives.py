"""Healing objectives side by side at one budget: the backbone's cheapest K blocks removed and healed by the same
parameter-matched LoRA, on the same tokens and schedule, with `ce`, `kd` and `kd+ce` (`baselines.healing`); every
arm scored by `reskip eval` against the backbone on the test split and the held-out kjv (KL, top-1 agreement,
perplexity). Prints one JSON line and writes OUT/results.json.

    python benchmarks/heal_objectives.py --out runs/heal --preset standard --lr 0.004 --objectives ce kd
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from reskip.baselines.arms import LoraArm
from reskip.baselines.pruning import backbone_block_costs
from reskip.baselines.train import train_lora
from reskip.ar_retrofit.accounting import count_params
from reskip.backbones.loading import load_backbone, load_config
from reskip.data.packing import pack
from reskip.data.sources import load_splits
from reskip.evaluate.options import EvalOptions
from reskip.evaluate.stage import evaluate_run
from reskip.pipeline import PRESETS, PipelineConfig
from reskip.skip.spec import METHOD_KINDS, parse_specs
from reskip.train.loop import train_run
from reskip.train_config import TrainConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="standard")
    ap.add_argument("--lr", type=float, default=0.004)
    ap.add_argument("--drop", type=int, default=1, help="blocks removed (the backbone's cheapest by its own A(n))")
    ap.add_argument("--objectives", nargs="+", default=["ce", "kd"])
    ap.add_argument("--temperature", type=float, default=1.0)
    args = ap.parse_args()
    out = Path(args.out)
    pc = PipelineConfig(preset=args.preset)
    cfg = TrainConfig.from_dict({**pc.train_config().to_dict(), "lr": args.lr})
    target = count_params(load_config(cfg.model), cfg.retrofit_config()).new_params
    splits, _ = load_splits(cfg.data)
    model, tok = load_backbone(cfg.model, cfg.dtype)
    calib = pack(tok, splits["calib"], cfg.seq_len, PRESETS[args.preset]["calibrate"]["sequences"], seed=0)
    rc = cfg.retrofit_config()
    costs = backbone_block_costs(model, calib, rc.block_size, rc.boundaries)
    blocks = costs.cheapest(args.drop)
    arms = {}
    for objective in args.objectives:
        arm = LoraArm(params=target, drop_layers=sorted(costs.layers_of(blocks)), drop_blocks=blocks,
                      objective=objective, temperature=args.temperature)
        t0 = time.time()
        s = train_lora(cfg, arm, out / f"healed-{args.drop}-{objective}", show_progress=True)
        arms[objective] = {"summary": s, "wall_s": time.time() - t0}
    # the eval's host: a retrofit run of the same backbone and data (its adapter is not scored: only the
    # backbone's references and the model methods are)
    host = out / "host"
    if not (host / "summary.json").is_file():
        train_run(host, TrainConfig.from_dict({**cfg.to_dict(), "steps": 1, "batch_size": 1, "eval_every": 1,
                                               "save_every": 1, "eval_sequences": 1}), show_progress=False,
                  overwrite=True)
    methods = ["backbone", f"pruned:{args.drop}", *(f"healed:{out / f'healed-{args.drop}-{o}'}" for o in args.objectives)]
    ev = evaluate_run(host, EvalOptions(methods=parse_specs(methods, METHOD_KINDS), heldout=["kjv"], benchmarks=[],
                                        seq_len=cfg.seq_len, quiet=True, out=str(out / "eval"),
                                        calib_sequences=PRESETS[args.preset]["calibrate"]["sequences"],
                                        **PRESETS[args.preset]["eval"] | {"mc_limit": 1}))
    r = json.loads(Path(ev).read_text())
    rows = {name: {split: {k: m[name][k] for k in ("kl_to_backbone", "top1_agreement", "ppl_ratio")}
                   for split, m in (("test", r["methods"]), ("kjv", r["heldout"]["methods"]))}
            for name in r["methods"]}
    result = {"preset": args.preset, "lr": args.lr, "drop_blocks": blocks, "A": costs.A, "params": target,
              "tokens": cfg.steps * cfg.batch_size * cfg.seq_len, "temperature": args.temperature,
              "arms": {o: {"val_ppl": a["summary"]["ppl_full"]["end"], "val_kl": a["summary"]["kl_full"]["end"],
                           "val_ppl_backbone": a["summary"]["ppl_backbone"], "train_wall_s": a["summary"]["train_wall_s"]}
                       for o, a in arms.items()},
              "rows": rows}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
