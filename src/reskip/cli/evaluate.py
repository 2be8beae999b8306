"""`reskip eval`. The library import happens inside the handler (`lazy:`): `reskip --help` loads no torch."""

from __future__ import annotations

import sys

from ..evaluate.options import EvalOptions
from ..evaluate.tables import markdown
from ..reading import read_json
from ..skip.spec import METHOD_KINDS, parse_specs
from .common import adapter_flag, examples
from .options import add_option_flags, options_from_args

EVAL_CONVERTERS = {
    "methods": lambda texts: parse_specs(list(texts), METHOD_KINDS),
    "mc_methods": lambda texts: parse_specs(list(texts), METHOD_KINDS),
    "benchmarks": lambda names: [b for b in names or [] if b != "none"],
    "heldout": lambda specs: list(specs) or None,
}


def cmd_eval(args) -> int:
    options = options_from_args(EvalOptions, args, EVAL_CONVERTERS)
    from ..evaluate.run import margin_violations  # lazy: torch
    from ..stages.evaluate import evaluate  # lazy: torch

    path = evaluate(args.adapter, options)
    results = read_json(path)
    print(markdown(results))
    print(f"wrote {path} and {path.with_suffix('.md')}")
    bad = margin_violations(results)
    if bad:
        print(f"BUG: top-1 changed where 2 eps < Delta for {bad}", file=sys.stderr)
        return 1
    return 0


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate backbone, retrofit and skip policies side by side (results.json + .md)", **examples("eval"))
    adapter_flag(p)
    add_option_flags(p, EvalOptions, converters=EVAL_CONVERTERS)
    p.set_defaults(func=cmd_eval)
