"""`reskip run`: the main job. The flags become one PipelineConfig; the pipeline calls each stage's
library function. The import of the pipeline happens inside the handler (`lazy:`), so
`reskip --help` loads no torch."""

from __future__ import annotations

import time
from pathlib import Path

from ..stage_options import PRESET_HELP
from .common import PRESETS, dtype_flag, examples, training_flags, training_values, retrofit_flags, retrofit_values
from ..reading import read_json
from ..train.log import format_summary
from ..runs import RunFolder


def run_overrides(args) -> dict:
    """The training and retrofit values the flags set (the preset's own values for the rest)."""
    overrides = training_values(args)
    if args.recompute:
        overrides["recompute"] = True
    overrides.update(retrofit_values(args))
    return overrides


def cmd_run(args) -> int:
    from ..pipeline import PipelineConfig, run_pipeline  # lazy: torch

    config = PipelineConfig(preset=args.preset, model=args.model, data=args.data or ["default"],
                            overrides=run_overrides(args), delta=args.delta, dtype=args.dtype)
    out = Path(args.resume or args.out or f"runs/run-{time.strftime('%Y%m%d-%H%M%S')}")
    t = time.time()
    state = run_pipeline(out, config, resume=bool(args.resume))
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
    p.add_argument("--preset", choices=PRESETS, default="standard", help=f"{PRESET_HELP} (default: standard)")
    p.add_argument("--model", default=None, help="backbone (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--data", nargs="+", default=None, help="training data specs (default: the bundled mix)")
    dtype_flag(p)
    training_flags(p)
    p.add_argument("--recompute", action="store_true",
                   help="recompute the frozen layers' activations in the backward pass: the standard run under 4 GB "
                        "resident for about 11%% more training time (see Training)")
    retrofit_flags(p)
    p.add_argument("--delta", type=float, default=1.0,
                   help="calibration: a block is eligible for skipping when its ablation cost A(n) (perplexity with "
                        "the block skipped / without) < 1 + delta; 1.0 admits every block whose skipping at most "
                        "doubles perplexity (default: 1.0)")
    p.set_defaults(func=cmd_run)
