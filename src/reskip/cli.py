"""`reskip` command line. Only this module parses strings into objects."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .errors import ReskipError

DTYPES = ("float32", "bfloat16")


def _dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def _retrofit_config(args):
    from .config import RetrofitConfig

    boundaries = None
    if getattr(args, "boundaries", None):
        try:
            boundaries = [int(x) for x in args.boundaries.split(",")]
        except ValueError:
            raise ReskipError(f"--boundaries takes comma-separated layer indices, got {args.boundaries!r}")
    try:
        return RetrofitConfig(block_size=args.block_size, rank=args.rank, boundaries=boundaries)
    except ValueError as e:
        raise ReskipError(str(e)) from e


def _emit(result: dict, as_json: bool, lines: list[str]) -> None:
    if as_json:
        print(json.dumps(result))
    else:
        print("\n".join(lines))


def cmd_parity(args) -> int:
    from .backbones import DEFAULT_BACKBONE, load_backbone
    from .parity import check_parity, tokenize_batch

    config = _retrofit_config(args)
    model, tokenizer = load_backbone(args.model, _dtype(args.dtype), args.trust_remote_code)
    result = {"model": args.model or DEFAULT_BACKBONE, "dtype": args.dtype}
    result.update(check_parity(model, tokenize_batch(tokenizer), config))
    _emit(
        result,
        args.json,
        [
            f"parity of {result['model']} ({args.dtype}) at c = 0 over {result['tokens']} tokens "
            f"({result['padded_rows']} padded rows), {result['n_blocks']} blocks, rank {result['rank']}:",
            f"  max |logit diff| = {result['max_abs_diff']:.3g}  ->  {'EXACT' if result['equal'] else 'NOT EXACT'}",
        ],
    )
    return 0 if result["max_abs_diff"] == 0 and result["equal"] else 1


def cmd_params(args) -> int:
    from .accounting import architecture_config, count_params

    retrofit_config = _retrofit_config(args)
    report = count_params(architecture_config(args.backbone), retrofit_config, args.backbone).to_dict()
    _emit(
        report,
        args.json,
        [
            f"{report['backbone']} ({report['family']}): {report['backbone_params']:,} backbone parameters",
            f"  side-channel at rank {report['rank']}, {report['n_blocks']} blocks: "
            f"{report['new_params']:,} new parameters = {report['percent']:.3f}%",
        ],
    )
    return 0


def cmd_run(args) -> int:
    """The main job. At this stage: parity (fp32, bf16) and parameter accounting on one model."""
    from .io_atomic import atomic_write_text
    from .backbones import DEFAULT_BACKBONE, load_backbone
    from .parity import check_parity, tokenize_batch
    from .accounting import count_params

    config = _retrofit_config(args)
    out = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    name = args.model or DEFAULT_BACKBONE
    results = {"model": name, "parity": []}
    for dtype in DTYPES:
        print(f"[parity] {name} {dtype} ...", flush=True)
        model, tokenizer = load_backbone(args.model, _dtype(dtype), args.trust_remote_code)
        r = check_parity(model, tokenize_batch(tokenizer), config)
        results["parity"].append({"dtype": dtype, **r})
        print(f"[parity] {dtype}: max |diff| = {r['max_abs_diff']} ({'exact' if r['equal'] else 'NOT exact'})")
    results["params"] = count_params(model.config, config, name).to_dict()
    p = results["params"]
    print(f"[params] {p['new_params']:,} new / {p['backbone_params']:,} backbone = {p['percent']:.3f}% (rank {p['rank']})")
    atomic_write_text(out / "parity.json", json.dumps(results, indent=2))
    print(f"wrote {out / 'parity.json'}")
    return 0 if all(r["equal"] for r in results["parity"]) else 1


RETROFIT_FLAGS = ("block_size", "rank", "boundaries")


def _train_config(args):
    """YAML file (or the run folder's resolved config on --resume) + flags -> TrainConfig."""
    import dataclasses

    import yaml

    from .train_config import TrainConfig

    overrides, retrofit = {}, {}
    for f in dataclasses.fields(TrainConfig):
        raw = getattr(args, f.name, None)
        if f.name == "retrofit" or raw is None:
            continue
        if f.name == "data":
            overrides["data"] = raw
            continue
        try:
            overrides[f.name] = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ReskipError(f"--{f.name.replace('_', '-')}: cannot read {raw!r}")
    for name in RETROFIT_FLAGS:
        raw = getattr(args, name, None)
        if raw is not None:
            retrofit[name] = [int(x) for x in str(raw).split(",")] if name == "boundaries" else raw
    source = None
    if args.resume:
        source = Path(args.resume) / "config.yaml"
        if not source.is_file():
            raise ReskipError(f"{args.resume} is not a run folder (no config.yaml)")
    elif args.config:
        source = Path(args.config)
        if not source.is_file():
            raise ReskipError(f"config file {args.config} does not exist")
    cfg = TrainConfig.from_yaml(source.read_text() if source else "", overrides)
    cfg.retrofit = {**cfg.retrofit, **retrofit}
    return cfg


def cmd_train(args) -> int:
    from .training import format_summary, train

    cfg = _train_config(args)
    cfg.validate()
    out = Path(args.resume or args.out or f"runs/train-{time.strftime('%Y%m%d-%H%M%S')}")
    summary = train(cfg, out, resume=bool(args.resume), show_progress=not args.quiet)
    if summary:
        print(format_summary(summary))
        print(f"adapter: {out / 'adapter'}   log: {out / 'train_log.jsonl'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reskip", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def retrofit_flags(p):
        p.add_argument("--block-size", type=int, default=4, help="layers per block (default 4)")
        p.add_argument("--boundaries", help="explicit block starts, e.g. 4,8,12 (overrides --block-size)")
        p.add_argument("--rank", type=int, default=None, help="adapter rank (default: 256 if d >= 1024, else 64)")

    def model_flags(p):
        p.add_argument("--model", default=None, help="HF id, local folder or .gguf; default: bundled SmolLM2-135M-Instruct")
        p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own Python code to run")

    p = sub.add_parser("parity", help="check bit-exact parity with the backbone at c = 0")
    model_flags(p)
    retrofit_flags(p)
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_parity)

    p = sub.add_parser("params", help="count side-channel vs backbone parameters without loading weights")
    p.add_argument("--backbone", required=True, help="shipped name (e.g. Qwen3-4B), config.json or model folder")
    retrofit_flags(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_params)

    p = sub.add_parser("train", help="train the side-channel (three-term loss) on a frozen backbone")
    p.add_argument("--config", help="YAML file with training keys (flags override it)")
    p.add_argument("--out", help="run folder (default runs/train-<timestamp>)")
    p.add_argument("--resume", metavar="RUN", help="continue RUN exactly from its last checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--model", default=None, help="backbone; default: bundled SmolLM2-135M-Instruct")
    p.add_argument("--data", nargs="+", help="'default' (bundled mix), .txt/.jsonl files, folders, or HF dataset ids")
    from .train_config import TrainConfig
    import dataclasses

    for f in dataclasses.fields(TrainConfig):
        if f.name not in ("model", "data", "retrofit"):
            p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, default=None, metavar="V")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--boundaries", default=None)
    p.add_argument("--rank", type=int, default=None)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("run", help="the main job on the default model")
    model_flags(p)
    retrofit_flags(p)
    p.add_argument("--out", help="run folder (default runs/<timestamp>)")
    p.set_defaults(func=cmd_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ReskipError as e:
        print(f"reskip: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
