"""`reskip run`: the main job. The flags become one PipelineConfig; the pipeline calls each stage's
library function. The import of the pipeline happens inside the handler (`lazy:`), so
`reskip --help` loads no torch."""

from __future__ import annotations

import time
from pathlib import Path

from ..options import RunOptions
from ..reading import read_json
from ..run_folder import RunFolder
from ..train.log import format_summary
from .common import examples, retrofit_flags, retrofit_values, training_flags, training_values
from .options import add_option_flags, options_from_args


def run_overrides(args) -> dict:
    """The training and retrofit values the flags set (the preset's own values for the rest)."""
    overrides = training_values(args)
    if args.recompute:
        overrides["recompute"] = True
    overrides.update(retrofit_values(args))
    return overrides


RUN_CONVERTERS = {"data": lambda specs: list(specs) or ["default"]}


def cmd_run(args) -> int:
    from ..research.pipeline import PipelineConfig  # lazy: torch
    from ..stages.run import RunStageOptions, run  # lazy: torch

    config = options_from_args(PipelineConfig, args, RUN_CONVERTERS, overrides=run_overrides(args))
    out = Path(args.resume or args.out or f"runs/run-{time.strftime('%Y%m%d-%H%M%S')}")
    t = time.time()
    state = read_json(run(out, RunStageOptions(config, resume=bool(args.resume))))
    print(f"\nfinished {len(state['finished'])} stages in {time.time() - t:.0f} s in this process: "
          + ", ".join(f"{k} {v:.0f}s" for k, v in state["timings"].items()))
    if state.get("peak_rss_gib"):  # the process's high-water mark after each stage: where it rose holds the peak
        print("peak resident memory after each stage (GiB): "
              + ", ".join(f"{k} {v:.2f}" for k, v in state["peak_rss_gib"].items()))
    run = RunFolder(out)
    if run.summary.is_file():
        print(format_summary(read_json(run.summary)))
    if run.results_md.is_file():
        print(run.results_md.read_text())
    print(f"report: {run.report_dir / 'report.html'}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("run", help="the main job: parity, training, calibration, evaluation, diagnostics, report",
                       **examples("run"))
    p.add_argument("--out", help="run folder (default: runs/run-<timestamp>)")
    p.add_argument("--resume", metavar="RUN", help="continue RUN from its last finished stage and checkpoint (default: a new run)")
    add_option_flags(p, RunOptions, skip=("overrides",), converters=RUN_CONVERTERS)
    training_flags(p)
    p.add_argument("--recompute", action="store_true",
                   help="recompute the frozen layers' activations in the backward pass: the standard run under 4 GB "
                        "resident for about 11%% more training time (see Training)")
    retrofit_flags(p)
    p.set_defaults(func=cmd_run)
