"""`reskip train`: the training config from a YAML file (or the run's own on --resume) and flags.

Every TrainConfig key is a flag (`--lr 1e-3`, `--skip-blocks [3,4]`); values are read as YAML
scalars, and TrainConfig.validate refuses wrong types and ranges before any model loads. The
library import happens inside the handler (`lazy:`), so `reskip --help` loads no torch."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import yaml

from ..errors import ReskipError
from ..reading import read_json
from ..runs import RunFolder
from ..train_config import TrainConfig, load_yaml
from ..train.log import format_summary
from .common import examples, retrofit_flags, retrofit_values

OWN_FLAGS = ("model", "data", "retrofit")  # TrainConfig fields with a flag of their own shape


def train_config(args) -> TrainConfig:
    """YAML file (or the run folder's resolved config on --resume) + flags -> TrainConfig."""
    overrides = {}
    for f in dataclasses.fields(TrainConfig):
        raw = getattr(args, f.name, None)
        if f.name in OWN_FLAGS or raw is None:
            continue
        try:
            overrides[f.name] = load_yaml(raw)
        except yaml.YAMLError:
            raise ReskipError(f"--{f.name.replace('_', '-')}: cannot read {raw!r}") from None
    for name in ("model", "data"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
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
    from ..train.loop import train_run  # lazy: torch

    cfg = train_config(args)
    cfg.validate()
    out = Path(args.resume or args.out or f"runs/train-{time.strftime('%Y%m%d-%H%M%S')}")
    summary = train_run(out, cfg, resume=bool(args.resume), show_progress=not args.quiet, overwrite=args.overwrite)
    if summary:
        print(format_summary(read_json(summary)))
        print(f"adapter: {RunFolder(out).adapter}   log: {RunFolder(out).train_log}")
    return 0


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
    p.add_argument("--model", default=None, help="backbone (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--data", nargs="+", help="'default' (the bundled mix), .txt/.jsonl files, folders, or HF dataset "
                                             "ids (default: default)")
    for f in dataclasses.fields(TrainConfig):
        if f.name not in OWN_FLAGS:
            p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, default=None, metavar="V",
                           help=f"{f.metadata.get('help', '')} (default {f.default if f.default is not dataclasses.MISSING else f.default_factory()!r})".replace("%", "%%"))
    retrofit_flags(p)
    p.set_defaults(func=cmd_train)
