"""The calibrate stage: a trained run -> RUN/policy.json (see `calibration`), and its table."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from ..data.packing import pack
from ..data.sources import load_splits
from ..ar_retrofit.adapter_io import read_adapter_config
from ..ar_retrofit.model_card import write_card
from ..backbones.dtypes import describe, resolve_dtype_name
from ..errors import ReskipError, check_range
from ..run_lock import writing
from .budget import calibrate_budgets
from .calibration import calibrate
from .options import CalibrateOptions
from ..skip.policy_file import PolicyFile
from ..skip.inference_run import check_positions, open_run, resolve_adapter


def check_options(o: CalibrateOptions) -> None:
    """Refuse out-of-range options with one clear message, before anything loads."""
    for flag, value, lo, hi in (("delta", o.delta, 0.0, None), ("quantile", o.quantile, 0.0, 1.0),
                                ("window", o.window, 1, None), ("max-skips", o.max_skips, 0, None),
                                ("sequences", o.sequences, 1, None), ("seq-len", o.seq_len, 8, None),
                                ("chunk-size", o.chunk_size, 1, None)):
        check_range(flag, value, lo, hi)
    resolve_dtype_name(o.dtype)  # an unknown name fails here
    for b in o.budgets:
        if not (isinstance(b, (int, float)) and b > 0 and math.isfinite(b)):
            raise ReskipError(f"--budgets: every budget must be a number > 0 (blocks skipped per step), got {b!r}")


def calibrate_run(run, options: CalibrateOptions = CalibrateOptions()) -> tuple[PolicyFile, Path]:
    """Calibrate the run's adapter on its calibration split; write and return the policy file."""
    check_options(options)
    source = resolve_adapter(run)  # the data are read (and an empty split refused) before the model loads
    source_specs = options.data or source.data_specs
    splits, record = load_splits(source_specs)
    if not splits["calib"]:
        raise ReskipError(f"the calibration split of {source_specs} is empty: give more documents")
    check_positions(source, options.seq_len or source.seq_len, options.model, options.trust_remote_code)
    out = Path(options.out) if options.out else source.policy_path
    if out.is_dir():
        raise ReskipError(f"--out {out} is a folder: give the policy file's path (e.g. {out / 'policy.json'})")
    # A policy file already there (another calibration, or one of the adapter before a retraining) is replaced.
    with writing(out.parent):
        return _calibrate(run, options, source, source_specs, splits, record, out)


def _calibrate(run, options: CalibrateOptions, source, source_specs: list[str], splits, record, out: Path
               ) -> tuple[PolicyFile, Path]:
    opened = open_run(run, model=options.model, dtype=options.dtype,
                      trust_remote_code=options.trust_remote_code, use_policy=False)
    seq_len = options.seq_len or source.seq_len
    data = pack(opened.tokenizer, splits["calib"], seq_len, options.sequences, seed=0)
    print(f"[calibrate] {len(data)} sequences x {seq_len} tokens from the calibration split of {source_specs}, "
          f"in {describe(options.dtype)}", flush=True)
    policy = calibrate(opened.model, data, options.delta, options.quantile, options.window, options.max_skips,
                       data_record={"specs": source_specs, "split": "calib", **record["splits"]["calib"]})
    policy.data["calibration"]["dtype"] = opened.dtype
    if options.budgets:
        print(f"[calibrate] budget frontier at {', '.join(f'{b:g}' for b in options.budgets)} blocks per step "
              f"(steps of {options.chunk_size} tokens)", flush=True)
        policy.data["budgets"] = calibrate_budgets(opened.model, data, options.budgets, options.window,
                                                   options.chunk_size)
        policy.validate(opened.model.n_blocks)
        for b in policy.data["budgets"]["unreachable"]:
            print(f"warning: budget {b:g} is out of reach: this model has {opened.model.n_blocks - 1} blocks "
                  "with a router", file=sys.stderr)
    if out.is_file():
        print(f"[calibrate] replacing {out}", flush=True)
    policy.save(out)
    if out == source.policy_path:  # the run's own policy: its adapter's model card gains the frontier
        params = sum(p.numel() for p in opened.model.side_channel.parameters())
        write_card(source.adapter_dir, read_adapter_config(source.adapter_dir), params, policy.data)
    for n in input_independent_eligible(policy):
        print(f"warning: block {n} is eligible but its signal is input-independent "
              f"({policy.blocks[n]['signal']['status']}); ReSkip will skip it as if at random", file=sys.stderr)
    return policy, out


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
    wall = policy.data["calibration"].get("wall_s")  # absent in policy files written before it was recorded
    if wall is not None:
        parts = [f"blocks {wall:.1f} s"]
        if budgets and "curves_wall_s" in budgets:
            parts += [f"frontier cost curves {budgets['curves_wall_s']:.1f} s",
                      f"budget points {sum(p['wall_s'] for p in budgets['frontier']):.1f} s"]
        lines += ["", "calibration wall time: " + ", ".join(parts)]
    return "\n".join(lines)
