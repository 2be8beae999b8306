"""`reskip calibrate` and `reskip generate`.

Library imports happen inside the handlers (marked `lazy:`) so that `reskip --help` loads no torch."""

from __future__ import annotations

from pathlib import Path

from ..errors import ReskipError
from ..research.calibrate.options import CalibrateOptions
from ..skip.generate_options import GenerateOptions
from .common import adapter_flag, examples
from .options import add_option_flags, options_from_args

CALIBRATE_CONVERTERS = {"budgets": lambda values: parse_budgets(values)}


def cmd_calibrate(args) -> int:
    from ..research.calibrate.run import format_policy  # lazy: torch
    from ..skip.policy_file import PolicyFile  # lazy: torch
    from ..stages.calibrate import calibrate  # lazy: torch

    path = calibrate(args.adapter, options_from_args(CalibrateOptions, args, CALIBRATE_CONVERTERS))
    print(format_policy(PolicyFile.load(path)))
    print(f"wrote {path}")
    return 0


def parse_budgets(values) -> tuple[float, ...]:
    """["0.5,1,2"] or ["0.5", "1", "2"] or [0.5, 1, 2] (a YAML list) -> (0.5, 1.0, 2.0); ["none"] or [] -> ()
    (no frontier)."""
    if isinstance(values, (str, int, float)):
        values = [values]
    items = [x for v in values for x in (v.split(",") if isinstance(v, str) else [v])]
    if [str(x).strip().lower() for x in items] in ([], ["none"]):
        return ()
    try:  # the values' range is checked with the other options (their declared range)
        return tuple(float(x) for x in items)
    except ValueError:
        raise ReskipError(f"takes numbers of blocks per step, e.g. 0.5,1,2 or 0.5 1 2 (or none); got "
                          f"{' '.join(map(str, values))!r}") from None


def cmd_generate(args) -> int:
    o = options_from_args(GenerateOptions, args, prompt=args.prompt)
    if o.top_p == 0 or o.temperature == 0:
        raise ReskipError("--temperature and --top-p must be > 0 (for greedy decoding leave out --sample)")
    if not o.prompt.strip():
        raise ReskipError("the prompt is empty: give the text to continue")
    try:
        o.prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise ReskipError("the prompt is not valid UTF-8 text (it holds undecodable bytes); pass it as UTF-8") from None
    from ..stages.generate import generate  # lazy: torch

    generate(Path(args.adapter), o)
    return 0


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="calibrate a ReSkip policy (policy.json) on the calibration split", **examples("calibrate"))
    adapter_flag(p)
    add_option_flags(p, CalibrateOptions, converters=CALIBRATE_CONVERTERS)
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("generate", help="generate with a skip policy; prints blocks skipped per token",
                       **examples("generate"))
    adapter_flag(p)  # RUN first: `reskip generate RUN "prompt"`, or `reskip generate "prompt" --adapter RUN`
    p.add_argument("prompt", help="the text to answer (through the model's chat template unless --raw)")
    add_option_flags(p, GenerateOptions, skip=("prompt",))
    p.set_defaults(func=cmd_generate)
