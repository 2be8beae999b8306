"""Iterative removal against the one-shot cut: drop the unit (a block of the retrofit's size, or one layer) whose
removal costs the current model least in KL to the backbone on the calibration split, heal, measure again, drop the
next (`compress.iterative`), until as many layers are gone as `--drop` blocks hold. Each round's healing is a kd
LoRA arm of the matched parameters at `--round-steps` steps (the selection's cost, stated); the layers chosen in the
end are healed again from the start at the preset's budget, exactly as the one-shot arm of `heal_objectives.py`,
and both are scored by one `reskip eval` on the test split and kjv. When iterative removal chooses the one-shot
cut (the backbone's cheapest blocks by A(n)), there is nothing new to heal: the result says so. Prints one JSON
line and writes OUT/results-iterative-UNIT-DROP.json.

    python benchmarks/iterative_removal.py --out runs/capacity --unit layers --drop 1 --round-steps 25
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from heal_objectives import score_arms

from reskip.ar_retrofit.accounting import count_params
from reskip.ar_retrofit.blocks import retrofit_blocks
from reskip.backbones.loading import load_backbone, load_config
from reskip.compress.blocks import backbone_block_costs
from reskip.compress.healing_run import HealingConfig, load_healed_model
from reskip.compress.iterative import candidate_units, iterative_removal, removed_layers
from reskip.compress.train import train_lora
from reskip.data.packing import Packed, pack
from reskip.data.sources import load_splits
from reskip.errors import ReskipError
from reskip.progress import Progress
from reskip.research.pipeline import PRESETS, PipelineConfig
from reskip.train_config import TrainConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="standard")
    ap.add_argument("--lr", type=float, default=0.002)
    ap.add_argument("--unit", choices=("blocks", "layers"), default="blocks")
    ap.add_argument("--drop", type=int, default=1, help="blocks' worth of layers removed")
    ap.add_argument("--round-steps", type=int, default=25, help="each round's healing steps (the preset's batch)")
    ap.add_argument("--score-sequences", type=int, default=None,
                    help="calibration sequences each round reads (default: all the preset's; A(n) reads all)")
    args = ap.parse_args()
    try:
        run(args)
    except ReskipError as e:  # a refusal is one line, as the command line's are
        print(f"iterative_removal: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def run(args) -> None:
    if args.drop < 1 or args.round_steps < 1 or (args.score_sequences is not None and args.score_sequences < 1):
        raise ReskipError("--drop, --round-steps and --score-sequences take 1 or more")
    if args.preset not in PRESETS:
        raise ReskipError(f"--preset {args.preset}: one of {', '.join(PRESETS)}")
    out = Path(args.out)
    pc = PipelineConfig(preset=args.preset)
    cfg = TrainConfig.from_dict({**pc.train_config().to_dict(), "lr": args.lr})
    config = load_config(cfg.model)
    target = count_params(config, cfg.retrofit_config()).new_params
    middle = len(retrofit_blocks(config.num_hidden_layers, cfg.retrofit_config().block_size)) - 2
    if args.drop > middle:  # before any weights load
        raise ReskipError(f"--drop {args.drop}: the model has {middle} middle blocks")
    splits, _ = load_splits(cfg.data)
    backbone, tok = load_backbone(cfg.model, cfg.dtype)
    calib = pack(tok, splits["calib"], cfg.seq_len, PRESETS[args.preset]["calibrate"]["sequences"], seed=0)
    rc = cfg.retrofit_config()
    costs = backbone_block_costs(backbone, calib, rc.block_size, rc.boundaries)
    units = candidate_units(costs.blocks, args.unit)
    one_shot = sorted(costs.layers_of(costs.cheapest(args.drop)))  # the backbone's cheapest blocks by A(n)
    k = args.drop if args.unit == "blocks" else len(one_shot)
    round_cfg = TrainConfig.from_dict({**cfg.to_dict(), "steps": args.round_steps})
    name = f"iterative-{args.unit}-{args.drop}"
    t0 = time.time()

    def arm_for(layers: list[int]) -> HealingConfig:
        return HealingConfig(params=target, drop_layers=layers, drop_blocks=costs.blocks_within(layers), objective="kd")

    def heal(layers: list[int]):
        folder = out / f"iterative-{args.unit}-rounds" / f"removed-{len(layers)}"  # the same for every --drop
        train_lora(round_cfg, arm_for(layers), folder, show_progress=True)
        return load_healed_model(folder)[0]

    bar = Progress(sum(len(units) - i for i in range(k)), "iterative removal", unit="candidate")
    n = args.score_sequences or len(calib)
    scored = Packed(calib.input_ids[:n], calib.labels[:n], calib.sources[:n])
    rounds = iterative_removal(backbone, scored, units, k, heal, progress=bar)
    bar.close()
    select_s = time.time() - t0
    layers = removed_layers(rounds, units)
    result = {"preset": args.preset, "lr": args.lr, "unit": args.unit, "drop": args.drop, "params": target,
              "round_tokens": args.round_steps * cfg.batch_size * cfg.seq_len,
              "score_sequences": n, "rounds_healed": k - 1,
              "selection_wall_s": select_s, "rounds": [r.to_dict() for r in rounds], "layers": layers,
              "one_shot_layers": one_shot, "same_as_one_shot": layers == one_shot}
    if layers != one_shot:  # the chosen cut healed from the start at the preset's budget, then scored
        folder = out / f"healed-{args.drop}-kd-{name}"
        s = train_lora(cfg, arm_for(layers), folder, show_progress=True)
        result.update(tokens=cfg.steps * cfg.batch_size * cfg.seq_len, train_wall_s=s["train_wall_s"],
                      val_kl=s["kl_full"]["end"], val_ppl=s["ppl_full"]["end"],
                      rows=score_arms(cfg, args.preset, out, [folder], args.drop, f"eval-{name}"))
    (out / f"results-{name}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
