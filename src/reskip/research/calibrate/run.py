"""The calibrate stage: a trained run -> RUN/policy.json (see `calibration`), and its table."""

from __future__ import annotations

import sys
from pathlib import Path

from ...ar_retrofit.adapter_io import read_adapter_config
from ...ar_retrofit.model_card import write_card
from ...backbones.dtypes import describe, resolve_dtype_name
from ...config_fields import check_fields
from ...data.packing import pack
from ...errors import ReskipError
from ...run_folder.lock import writing
from ...skip.policy_file import PolicyFile
from ...skip.run_inputs import StageInputs, read_stage_inputs
from .budget import calibrate_budgets
from .calibration import calibrate
from .options import CalibrateOptions


def check_options(o: CalibrateOptions) -> None:
    """Refuse out-of-range options with one clear message, before anything loads."""
    check_fields(o)
    resolve_dtype_name(o.dtype)  # an unknown name fails here


def calibrate_run(run, options: CalibrateOptions = CalibrateOptions()) -> Path:
    """Calibrate the run's adapter on its calibration split; write the policy file and return its path."""
    check_options(options)
    inputs = read_stage_inputs(run, options, ("calib",))
    out = Path(options.out) if options.out else inputs.source.policy_path
    if out.is_dir():
        raise ReskipError(f"--out {out} is a folder: give the policy file's path (e.g. {out / 'policy.json'})")
    # A policy file already there (another calibration, or one of the adapter before a retraining) is replaced.
    with writing(out.parent):
        _calibrate(inputs, options, out)
    return out


def _calibrate(inputs: StageInputs, options: CalibrateOptions, out: Path) -> None:
    opened = inputs.open(options, use_policy=False)
    data = pack(opened.tokenizer, inputs.splits["calib"], inputs.seq_len, options.sequences, seed=0)
    print(f"[calibrate] {len(data)} sequences x {inputs.seq_len} tokens from the calibration split of "
          f"{inputs.data_specs}, in {describe(options.dtype, opened.device)} on {opened.device}", flush=True)
    policy = calibrate(opened.model, data, options.delta, options.quantile, options.window, options.max_skips,
                       data_record={"specs": inputs.data_specs, "split": "calib", **inputs.record["splits"]["calib"]})
    policy.data["calibration"]["dtype"] = opened.dtype
    policy.data["calibration"]["device"] = opened.device
    if options.budgets:
        print(f"[calibrate] budget frontier at {', '.join(f'{b:g}' for b in options.budgets)} blocks per step "
              f"(steps of {options.chunk_size} tokens), minimising {options.budget_objective}", flush=True)
        policy.data["budgets"] = calibrate_budgets(opened.model, data, options.budgets, options.window,
                                                   options.chunk_size, objective=options.budget_objective)
        policy.validate(opened.model.n_blocks)
        for b in policy.data["budgets"]["unreachable"]:
            print(f"warning: budget {b:g} is out of reach: this model has {opened.model.n_blocks - 1} blocks "
                  "with a router", file=sys.stderr)
    if out.is_file():
        print(f"[calibrate] replacing {out}", flush=True)
    policy.save(out)
    source = inputs.source
    if out == source.policy_path:  # the run's own policy: its adapter's model card gains the frontier
        params = sum(p.numel() for p in opened.model.side_channel.parameters())
        write_card(source.adapter_dir, read_adapter_config(source.adapter_dir), params, policy.data)
    for n in input_independent_eligible(policy):
        print(f"warning: block {n} is eligible but its signal is input-independent "
              f"({policy.blocks[n]['signal']['status']}); ReSkip will skip it as if at random", file=sys.stderr)


def input_independent_eligible(policy: PolicyFile) -> list[int]:
    """Eligible blocks whose w_recent does not depend on the input (`signal.signal_health`)."""
    return [n for n, b in sorted(policy.blocks.items())
            if b["eligible"] and b.get("signal") and b["signal"]["status"] != "ok"]


def format_policy(policy: PolicyFile) -> str:
    lines = [f"ppl(full) on calibration: {policy.data['ppl_full']:.3f}",
             "block  layers   A(n)     I(n)    cos(x,h)  tau      w_recent 5-95%    eligible"]
    for b in policy.data["blocks"]:
        tau = "-" if b["tau"] is None else f"{b['tau']:.3f}"
        imp = "-" if b["I"] is None else f"{b['I']:.3f}"
        sig = b.get("signal")
        span = "-" if not sig else f"{sig['w_recent']['p05']:.3f}-{sig['w_recent']['p95']:.3f}"
        flag = "" if not sig or sig["status"] == "ok" else "  INPUT-INDEPENDENT"
        lines.append(f"{b['block']:>5}  {b['layers'][0]:>2}-{b['layers'][1]:<3}  {b['A']:<8.3f} {imp:<7} "
                     f"{b['cos_in_out']:<9.3f} {tau:<8} {span:<17} {'yes' if b['eligible'] else 'no'}{flag}")
    budgets = policy.data.get("budgets")
    if budgets and budgets["frontier"]:
        lines += ["", f"budget frontier (calibration split, steps of {budgets['chunk_size']} tokens; ppl / full model):",
                  "budget  chosen  measured skips/step  ppl ratio  static at the budget  blocks (share skipped)"]
        for p in budgets["frontier"]:
            st = p["candidates"].get("static")
            st_txt = "-" if st is None else f"{st['measured']['ppl_ratio']:.4f}"
            shares = ", ".join(f"{n}:{blk['fraction']:.2f}" for n, blk in p["blocks"].items())
            lines.append(f"{p['budget']:<7g} {p['chosen']:<7} {p['measured']['mean_skipped']:<20.3f} "
                         f"{p['measured']['ppl_ratio']:<10.4f} {st_txt:<21} {shares}")
    wall = policy.data["calibration"]["wall_s"]  # None: an upgraded file that did not record it
    if wall is not None:
        parts = [f"blocks {wall:.1f} s"]
        if budgets and "curves_wall_s" in budgets:
            parts += [f"frontier cost curves {budgets['curves_wall_s']:.1f} s",
                      f"budget points {sum(p['wall_s'] for p in budgets['frontier']):.1f} s"]
        lines += ["", "calibration wall time: " + ", ".join(parts)]
    return "\n".join(lines)
