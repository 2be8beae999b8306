"""`reskip experiment NAME`: the source documents' claims as experiments on the user's own backbone.
The flags become one ExperimentOptions; the experiment's library code is imported inside the handler
(`lazy:`), so `reskip --help` loads no torch."""

from __future__ import annotations

from ..experiments.options import EXPERIMENTS, SOURCE_BUDGET_BYTES, ExperimentOptions
from .common import BUDGET_FLAGS, PRESETS, dtype_flag, budget_flags, budget_values, retrofit_flags, retrofit_values


def experiment_options(args) -> ExperimentOptions:
    overrides = budget_values(args, (*BUDGET_FLAGS, "eval_every"))
    retrofit = retrofit_values(args)
    boundaries = retrofit.pop("boundaries", None) if args.name == "block-size" else None
    overrides.update(retrofit)  # block_size, rank, ...: the pipeline's overrides take retrofit keys by name
    return ExperimentOptions(name=args.name, preset=args.preset, model=args.model, data=args.data or ["default"],
                             out=args.out, seed=args.seed, overrides=overrides, calib_sequences=args.calib_sequences,
                             test_sequences=args.test_sequences, boundaries=boundaries, budget_bytes=args.budget_bytes,
                             context=args.context, dtype_bytes=args.dtype_bytes, dtype=args.dtype, arms=args.arms, lrs=args.lrs,
                             variants=args.variants, quiet=args.quiet)


def cmd_experiment(args) -> int:
    from ..experiments.stage import run_experiment  # lazy: torch

    options = experiment_options(args)
    path = run_experiment(options, show=(lambda *a, **k: None) if options.quiet else print)
    if path is None:  # arms left to other processes: the run that finishes the last one writes the results
        print(f"arms {', '.join(options.arms)} finished; results.json waits for the others")
        return 0
    print((path.parent / "results.md").read_text())
    print(f"results: {path}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("experiment", help="rerun a source document's claim on your backbone: variants, block-size, "
                                          "mix, placement; scale: the main job at 1x, 4x and 10x the standard "
                                          "training tokens; baselines: the recipe beside a parameter-matched LoRA "
                                          "and LoRA-healed static pruning (results.json + results.md with verdicts)")
    p.add_argument("name", choices=EXPERIMENTS)
    p.add_argument("--preset", choices=PRESETS, default="quick",
                   help="the training budget of every arm (the pipeline's presets; default quick; `scale`'s arms "
                        "are presets themselves)")
    p.add_argument("--model", default=None, help="backbone; default: bundled SmolLM2-135M-Instruct")
    p.add_argument("--data", nargs="+", default=None, help="data specs (default: the bundled mix)")
    p.add_argument("--out", default=None,
                   help="run folder to write OUT/experiments/NAME into (default runs/experiments); "
                        "`reskip report OUT` shows every experiment there")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arms", nargs="+", default=None, metavar="ARM",
                   help="run only these arms now (names, e.g. 'dialogue only', or folder names, dialogue-only), "
                        "e.g. one process per core; results.json is written once every arm has finished; "
                        "`scale`: presets among standard, long, large (default all three), and results.json holds "
                        "every finished arm of any backbone")
    budget_flags(p)
    p.add_argument("--eval-every", type=int, default=None, help="steps between validations (the logged curve)")
    retrofit_flags(p)
    p.add_argument("--calib-sequences", type=int, default=None, help="per arm (default: the preset's)")
    p.add_argument("--test-sequences", type=int, default=None,
                   help="per arm, for the signal test (default: twice the preset's diagnose sequences)")
    p.add_argument("--budget-bytes", type=int, default=SOURCE_BUDGET_BYTES,
                   help="placement: the depth-state budget (default 256 MiB, the second source document's)")
    p.add_argument("--context", type=int, default=None,
                   help="placement: your context length (default the model's, at most 8192)")
    p.add_argument("--lrs", nargs="+", type=float, default=None, metavar="LR",
                   help="baselines: the learning rates every method is trained at, the best on validation kept "
                        "(default: 0.5, 1 and 2 x the recipe's)")
    p.add_argument("--variants", nargs="*", default=None, metavar="VARIANT",
                   help="baselines: also these of the recipe's variants (none named: both) at the same total trainable parameters: side+lora (the "
                        "side-channel at half its rank and a LoRA inside the blocks) and full-teacher (the skip "
                        "branch distilled toward the full path)")
    p.add_argument("--dtype-bytes", type=int, default=2, help="placement: bytes per state value (default 2, bf16)")
    dtype_flag(p)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_experiment)
