"""`reskip lab RUN`: the causal lab in a browser, on the loopback interface. The library import happens
inside the handler (`lazy:`), so `reskip --help` loads no torch."""

from __future__ import annotations

from ..errors import check_range
from .common import dtype_flag, examples


def cmd_lab(args) -> int:
    from ..lab.app import check_port, serve  # lazy: torch, starlette
    from ..lab.session import LabSession

    check_range("port", args.port, 1, 65535)
    check_port(args.port)  # before the model loads and before any URL is printed
    serve(LabSession(args.run, model=args.model, dtype=args.dtype), args.port)
    return 0


def register(sub) -> None:
    p = sub.add_parser("lab", help="the causal lab: predict, change one variable, run, explain the delta (a local web page)",
                       **examples("lab"))
    p.add_argument("run", help="a trained and calibrated run folder (e.g. the output of scripts/run.sh)")
    p.add_argument("--port", type=int, default=7860, help="port on 127.0.0.1 (default: 7860)")
    p.add_argument("--model", default=None, help="backbone (default: the run's)")
    dtype_flag(p)
    p.set_defaults(func=cmd_lab)
