"""`reskip lab RUN`: the causal lab in a browser, on the loopback interface. The library import happens
inside the handler (`lazy:`), so `reskip --help` loads no torch."""

from __future__ import annotations

from ..research.lab.options import LabOptions
from .common import examples
from .options import add_option_flags, options_from_args


def cmd_lab(args) -> int:
    from ..research.lab.app import check_port, serve  # lazy: torch, starlette
    from ..research.lab.session import LabSession

    o = options_from_args(LabOptions, args)
    check_port(o.port)  # before the model loads and before any URL is printed
    serve(LabSession(args.run, model=o.model, dtype=o.dtype, device=o.device, trust_remote_code=o.trust_remote_code),
          o.port)
    return 0


def register(sub) -> None:
    p = sub.add_parser("lab", help="the causal lab: predict, change one variable, run, explain the delta (a local web page)",
                       **examples("lab"))
    p.add_argument("run", help="a trained and calibrated run folder (e.g. the output of scripts/run.sh)")
    add_option_flags(p, LabOptions, config_file=False)
    p.set_defaults(func=cmd_lab)
