"""What every command shares: the parser class (bad input -> one line, exit 2), the flags that
several commands take (declared here once), and the few conversions of strings into objects.

Nothing here imports torch: `reskip --help` and `reskip report` must stay light.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing

from ..ar_retrofit.config import RetrofitConfig
from ..config_fields import flag_of, help_of
from ..errors import ReskipError
from ..options import DTYPE_HELP, DTYPE_NAMES
from ..train_config import RECIPE_RETROFIT, TrainConfig

# Every subcommand's --help ends with an example or two (torchtune's habit).
EXAMPLES = {
    "parity": "reskip parity                                   # the bundled backbone, float32\n"
              "reskip parity --model HuggingFaceTB/SmolLM2-360M --dtype bfloat16 --json",
    "params": "reskip params --backbone Qwen3-4B\nreskip params --backbone my-model/config.json --rank 128 --json",
    "run-parity": "reskip run-parity --out runs/my-run",
    "train": "reskip train --out runs/my-run                       # the default recipe on the bundled model and data\n"
             "reskip train --config my.yaml --lr 1e-3 --out runs/r2  # a YAML file of training keys, a flag over it\n"
             "reskip train --resume runs/my-run                      # continue from its last checkpoint",
    "calibrate": "reskip calibrate runs/my-run\n"
                 "reskip calibrate runs/my-run --delta 1.0 --budgets 0.5 1 2 --sequences 64",
    "generate": "reskip generate runs/my-run \"Explain photosynthesis\" --policy reskip:budget=1\n"
                "reskip generate runs/my-run \"Once upon a time\" --policy static:1 --sample --top-p 0.9",
    "eval": "reskip eval runs/my-run\n"
            "reskip eval runs/my-run --methods backbone retrofit static:1 reskip:budget=1 --heldout kjv "
            "--benchmarks none\n"
            "reskip eval runs/my-run --methods backbone pruned:1 healed:ARM export:my-model --heldout kjv",
    "diagnose": "reskip diagnose runs/my-run\nreskip diagnose runs/my-run --signal-sequences 0 --sequences 8",
    "report": "reskip report runs/my-run                 # RUN/report/report.html\n"
              "reskip report runs/experiments            # every experiment in that folder",
    "run": "reskip run --out runs/my-run                # the main job: the standard preset\n"
           "reskip run --preset quick --out runs/smoke   # a smoke run of every stage\n"
           "reskip run --resume runs/my-run              # continue from its last finished stage",
    "experiment": "reskip experiment baselines --preset standard\n"
                  "reskip experiment nested --preset standard --out runs/depths   # one LoRA for 0-3 blocks removed\n"
                  "reskip experiment variants --preset medium --arms shortcut --out runs/exp",
    "export": "reskip export runs/experiments/experiments/baselines/arms/healed-1@0.004 --out my-model\n"
              "reskip export runs/depths/experiments/nested/arms/nested@0.002 --depth 2 --out my-model-2",
    "compress": "reskip compress --out smollm2-26-layers                # one block removed, healed by kd\n"
                "reskip compress --model /models/my-llama --drop 2 --data my-texts/ --out my-llama-smaller",
    "lab": "reskip lab runs/my-run                      # then open http://127.0.0.1:7860",
}


class Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (the same shape as every other reskip error)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


class RawEpilog(argparse.HelpFormatter):
    """Help whose epilog (the examples) keeps its lines."""

    def _fill_text(self, text, width, indent):
        return "".join(indent + line for line in text.splitlines(keepends=True))


def examples(command: str) -> dict:
    """The keyword arguments of `add_parser` that end a subcommand's --help with its examples."""
    return {"epilog": "examples:\n" + "\n".join("  " + x for x in EXAMPLES[command].splitlines()),
            "formatter_class": RawEpilog}


def dtype_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="auto", help=f"{DTYPE_HELP} (default: auto)")


TRAINING_FLAGS = ("steps", "batch_size", "seq_len", "lr")  # a preset's training length and batch, overridable by flag


def training_flags(p: argparse.ArgumentParser) -> None:
    """The preset's training values, each overridable (TrainConfig's help text)."""
    for name in TRAINING_FLAGS:
        p.add_argument(flag_of(name), type=float if name == "lr" else int, default=None,
                       help=f"{help_of(TrainConfig, name)} (default: the preset's)".replace("%", "%%"))


def training_values(args, names=TRAINING_FLAGS) -> dict:
    """The training values among `names` that flags set."""
    return {k: getattr(args, k) for k in names if getattr(args, k) is not None}


# The retrofit's flags: these fields of RetrofitConfig, each flag built from its field (type, choices, help); a field
# given on the command line as text that is not its type reads through its converter.
RETROFIT_FLAGS = ("block_size", "boundaries", "rank", "skip_path", "shortcut_rank", "variant", "inner_lora")
RETROFIT_TEXT = {"boundaries": ("; as 4,8,12 (overrides --block-size)", lambda text: parse_boundaries(text))}


def retrofit_flags(p: argparse.ArgumentParser) -> None:
    """The retrofit's flags, each from its RetrofitConfig field: its type, its choices, its help text, and the
    default training builds (the recipe's) stated."""
    recipe = {**dataclasses.asdict(RetrofitConfig()), **RECIPE_RETROFIT}  # what training builds by default
    hints = typing.get_type_hints(RetrofitConfig)
    for f in dataclasses.fields(RetrofitConfig):
        if f.name not in RETROFIT_FLAGS:
            continue
        value = recipe[f.name]
        shown = "none" if value is None else ",".join(map(str, value)) if isinstance(value, list) else value
        extra = RETROFIT_TEXT.get(f.name, ("", None))[0]
        kwargs = {"default": None, "help": f"{help_of(RetrofitConfig, f.name)}{extra} (default: {shown})".replace("%", "%%")}
        if f.name not in RETROFIT_TEXT and int in (hints[f.name], *typing.get_args(hints[f.name])):
            kwargs["type"] = int
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        p.add_argument(flag_of(f.name), **kwargs)


def adapter_flag(p: argparse.ArgumentParser) -> None:
    """The run a command reads: a positional RUN, or `--adapter RUN` (the same, kept as an alias); `resolve_run`
    puts it in `args.adapter` before the command runs."""
    p.add_argument("run_positional", nargs="?", metavar="RUN", help="training run folder or adapter folder")
    p.add_argument("--adapter", metavar="RUN", default=None, help="the same as RUN, an alias (default: RUN)")


def resolve_run(args) -> None:
    """One run, named once: RUN or --adapter RUN (refused when neither is given or the two differ)."""
    if not hasattr(args, "run_positional"):
        return
    given = {x for x in (args.run_positional, args.adapter) if x is not None}
    if not given:
        raise ReskipError(f"reskip {args.command}: name the run: RUN (a training run or adapter folder) or --adapter RUN")
    if len(given) > 1:
        raise ReskipError(f"reskip {args.command}: RUN {args.run_positional} and --adapter {args.adapter} name two "
                          "runs: give one")
    args.adapter = given.pop()


def parse_boundaries(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise ReskipError(f"--boundaries takes comma-separated layer indices, e.g. 4,8,12; got {text!r}") from None


def retrofit_values(args) -> dict:
    """The retrofit flags that were given, as RetrofitConfig keys."""
    out = {}
    for name in RETROFIT_FLAGS:
        value = getattr(args, name)
        if value is not None:
            convert = RETROFIT_TEXT.get(name, (None, None))[1]
            out[name] = convert(value) if convert else value
    return out


def retrofit_config(args) -> RetrofitConfig:
    # the training recipe's retrofit unless flags say otherwise, so parity and params describe what train builds
    return RetrofitConfig(**{**RECIPE_RETROFIT, **retrofit_values(args)})  # its checks raise RetrofitConfigError
