"""`reskip experiment NAME`: the source documents' claims as experiments on the user's own backbone.
The flags become one ExperimentOptions; the experiment's library code is imported inside the handler
(`lazy:`), so `reskip --help` loads no torch."""

from __future__ import annotations

from ..research.experiments.options import EXPERIMENTS, ExperimentOptions
from .common import TRAINING_FLAGS, examples, retrofit_flags, retrofit_values, training_flags, training_values
from .options import add_option_flags, options_from_args

OWN_FLAGS = ("name", "overrides", "boundaries")  # the positional name; the training and retrofit flags set the rest
# (--boundaries is a retrofit override of every arm; `block-size` reads it as one more arm of its own)
CONVERTERS = {"data": lambda specs: list(specs) or ["default"], "arms": lambda names: list(names) or None}


def experiment_options(args) -> ExperimentOptions:
    overrides = training_values(args, (*TRAINING_FLAGS, "eval_every"))
    overrides.update(retrofit_values(args))  # block_size, rank, ...: the pipeline's overrides take retrofit keys by name
    # boundaries=None: --boundaries (retrofit_flags' text) is in the overrides, parsed
    return options_from_args(ExperimentOptions, args, CONVERTERS, name=args.name, overrides=overrides, boundaries=None)


def cmd_experiment(args) -> int:
    from ..stages.experiment import experiment  # lazy: torch

    options = experiment_options(args)
    path = experiment(None, options)
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
                                          "and LoRA-healed static pruning; nested: one LoRA for every depth "
                                          "against kd-healed models per depth; stacked: ReSkip on the healed model; "
                                          "frontier: fidelity against compute for all of them; depth-request: a "
                                          "depth chosen per prompt (results.json + results.md with verdicts)",
                       **examples("experiment"))
    p.add_argument("name", choices=EXPERIMENTS, help="the experiment")
    add_option_flags(p, ExperimentOptions, skip=OWN_FLAGS, converters=CONVERTERS)
    training_flags(p)
    p.add_argument("--eval-every", type=int, default=None, help="steps between validations, the logged curve "
                                                                "(default: the preset's)")
    retrofit_flags(p)
    p.set_defaults(func=cmd_experiment)
