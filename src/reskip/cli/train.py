"""`reskip train`: the training config from a YAML file (or the run's own on --resume) and flags.

Every TrainConfig key is a flag (`--lr 1e-3`, `--skip-blocks [3,4]`); values are read as YAML
scalars, and TrainConfig.validate refuses wrong types and ranges before any model loads. The
library import happens inside the handler (`lazy:`), so `reskip --help` loads no torch."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import yaml

from ..config_fields import flag_of
from ..errors import ReskipError
from ..reading import read_json
from ..run_folder import RunFolder
from ..train.log import format_summary
from ..train_config import TrainConfig, load_yaml
from .common import examples, retrofit_flags, retrofit_values
from .options import add_option_flags, given_values


def yaml_value(flag: str):
    """A flag's text read as one YAML value (`--lr 1e-3`, `--skip-blocks [3,4]`, `--data-weights {code: 1}`);
    TrainConfig's validation then refuses a wrong type or range, naming the key."""
    def read(values):
        texts = values if isinstance(values, list) else [values]
        try:
            items = [load_yaml(t) for t in texts]
        except yaml.YAMLError:
            raise ReskipError(f"{flag}: cannot read {' '.join(texts)!r}") from None
        return items[0] if not isinstance(values, list) or (len(items) == 1 and isinstance(items[0], list)) else items
    return read


# Every TrainConfig key is a flag read as YAML, but the backbone's name and the data specs (plain strings); the
# retrofit's keys have flags of their own (`retrofit_flags`).
CONVERTERS = {f.name: yaml_value(flag_of(f.name)) for f in dataclasses.fields(TrainConfig)
              if f.name not in ("model", "data", "retrofit")}


def train_config(args) -> TrainConfig:
    """The YAML file (or the run folder's resolved config on --resume) with the flags given over it -> TrainConfig
    (validated by its own reader: TrainConfig.from_file)."""
    overrides = given_values(TrainConfig, args, CONVERTERS)
    retrofit = retrofit_values(args)
    source = None
    if args.resume:
        source = RunFolder(args.resume).config
        if not source.is_file():
            raise ReskipError(f"{args.resume} is not a run folder (no config.yaml)")
    elif args.config:
        source = Path(args.config)
        if not source.is_file():
            raise ReskipError(f"config file {args.config} does not exist")
    cfg = TrainConfig.from_file(source, overrides) if source else TrainConfig.from_yaml("", overrides)
    cfg.retrofit = {**cfg.retrofit, **retrofit}
    return cfg


def cmd_train(args) -> int:
    from ..stages.train import TrainStageOptions, train  # lazy: torch

    cfg = train_config(args)
    cfg.validate()
    out = Path(args.resume or args.out or f"runs/train-{time.strftime('%Y%m%d-%H%M%S')}")
    summary = train(out, TrainStageOptions(cfg, resume=bool(args.resume), overwrite=args.overwrite, quiet=args.quiet))
    if summary:
        print(format_summary(read_json(summary)))
        print(f"adapter: {RunFolder(out).adapter}   log: {RunFolder(out).train_log}")
    return 0


def threads_count(text: str) -> int:
    """--threads N: a whole number >= 1 (argparse reports anything else in one line)."""
    n = int(text)
    if n < 1:
        raise ValueError(text)
    return n


def register(sub) -> None:
    p = sub.add_parser("train", help="train the side-channel (three-term loss) on a frozen backbone",
                       **examples("train"))
    p.add_argument("--config", help="YAML file with training keys; flags override it (default: none, the recipe)")
    p.add_argument("--out", help="run folder (default: runs/train-<timestamp>)")
    p.add_argument("--resume", metavar="RUN", help="continue RUN exactly from its last checkpoint (its own settings: "
                                                   "flags that contradict them are refused) (default: a new run)")
    p.add_argument("--overwrite", action="store_true",
                   help="train into --out even if it holds another run (its checkpoints, adapter and log are removed)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--threads", type=threads_count, default=None,
                   help="CPU threads torch computes with (default: torch's own choice, every core it sees); 1 where "
                        "other jobs share the cores")
    add_option_flags(p, TrainConfig, skip=("retrofit",), converters=CONVERTERS, config_file=False)
    retrofit_flags(p)
    p.set_defaults(func=cmd_train)
