"""`reskip` command line: a package with one module per command group, each registering its own
subcommands. Only this package parses strings into objects; it calls the library with typed values,
and the library never imports it. Building the parser imports no torch (`reskip --help`, `reskip report`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import ReskipError
from . import backbone, evaluate, experiment, lab, report, run, skip, train
from .common import Parser

COMMAND_GROUPS = (backbone, train, skip, evaluate, report, run, experiment, lab)


def build_parser() -> Parser:
    parser = Parser(prog="reskip", description="AR-Retrofit and ReSkip on a frozen pretrained LLM.")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_out(args)
        return args.func(args)
    except ReskipError as e:
        print(f"reskip: error: {e}", file=sys.stderr)
        return 2


FILE_OUTS = ("calibrate", "diagnose")  # commands whose --out is a file; every other --out is a folder


def check_out(args) -> None:
    """An --out of the wrong kind (a file where a folder is written, or a folder where a file is) is refused
    before any work."""
    out = getattr(args, "out", None)
    if not out:
        return
    path = Path(out)
    if args.command in FILE_OUTS and path.is_dir():
        raise ReskipError(f"--out {path} is a folder: give a file's path (e.g. {path / 'policy.json'})")
    if args.command not in FILE_OUTS and path.exists() and not path.is_dir():
        raise ReskipError(f"--out {path} is a file: give a folder to write into")
