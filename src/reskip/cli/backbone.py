"""`reskip parity`, `reskip params` and the pipeline's `reskip run-parity` stage.

Library imports happen inside the handlers (marked `lazy:`) so that building the parser for
`reskip --help` loads no torch."""

from __future__ import annotations

import json
from pathlib import Path

from ..options import ParityOptions
from ..reading import read_json
from ..run_folder import RunFolder
from .common import dtype_flag, examples, retrofit_config, retrofit_flags
from .options import add_option_flags, options_from_args


def _emit(result: dict, as_json: bool, lines: list[str]) -> None:
    print(json.dumps(result) if as_json else "\n".join(lines))


def parity_options(args) -> ParityOptions:
    return options_from_args(ParityOptions, args, retrofit=retrofit_config(args))


def cmd_parity(args) -> int:
    from ..backbones.dtypes import describe  # lazy: torch
    from ..backbones.loading import DEFAULT_BACKBONE  # lazy: torch
    from ..research.parity import parity_of  # lazy: torch

    o = parity_options(args)
    r, _ = parity_of(o.model, args.dtype, o.retrofit, o.trust_remote_code, o.device)
    result = {"model": o.model or DEFAULT_BACKBONE, "dtype": describe(args.dtype, r["device"]), **r}
    _emit(result, args.json, [
        f"parity of {result['model']} ({result['dtype']}) at c = 0 over {result['tokens']} tokens "
        f"({result['padded_rows']} padded rows), {result['n_blocks']} blocks, rank {result['rank']}:",
        f"  max |logit diff| = {result['max_abs_diff']:.3g}  ->  {'EXACT' if result['equal'] else 'NOT EXACT'}",
    ])
    return 0 if result["max_abs_diff"] == 0 and result["equal"] else 1


def cmd_params(args) -> int:
    from ..ar_retrofit.accounting import count_params  # lazy: torch
    from ..backbones.architectures import architecture_config  # lazy: torch

    config = retrofit_config(args)
    report = count_params(architecture_config(args.backbone), config, args.backbone).to_dict()
    _emit(report, args.json, [
        f"{report['backbone']} ({report['family']}): {report['backbone_params']:,} backbone parameters",
        f"  side-channel at rank {report['rank']}, {report['n_blocks']} blocks: "
        f"{report['new_params']:,} new parameters = {report['percent']:.3f}%"
        + (f" (of which {report['shortcut_params']:,} in the rank-{report['shortcut_rank']} skip shortcuts)"
           if report["shortcut_params"] else ""),
    ])
    return 0


def cmd_run_parity(args) -> int:
    from ..stages.parity import parity  # lazy: torch

    result = read_json(parity(Path(args.out), parity_options(args)))
    print(f"wrote {RunFolder(args.out).parity}")
    return 0 if all(r["equal"] for r in result["parity"]) else 1


def register(sub) -> None:
    p = sub.add_parser("parity", help="check bit-exact parity with the backbone at c = 0", **examples("parity"))
    add_option_flags(p, ParityOptions, skip=("retrofit",), config_file=False)
    retrofit_flags(p)
    dtype_flag(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_parity)

    p = sub.add_parser("params", help="count side-channel vs backbone parameters without loading weights",
                       **examples("params"))
    p.add_argument("--backbone", required=True, help="shipped name (e.g. Qwen3-4B), config.json or model folder")
    retrofit_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_params)

    p = sub.add_parser("run-parity", help="pipeline stage: parity in fp32 + bf16 and parameters -> OUT/parity.json",
                       **examples("run-parity"))
    add_option_flags(p, ParityOptions, skip=("retrofit",), config_file=False)
    retrofit_flags(p)
    p.add_argument("--out", required=True, help="the run folder parity.json is written into (required)")
    p.set_defaults(func=cmd_run_parity)
