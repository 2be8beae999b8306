"""`reskip` command line: a package with one module per command group, each registering its own
subcommands. Only this package parses strings into objects; it calls the library with typed values,
and the library never imports it. Building the parser imports no torch (`reskip --help`, `reskip report`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from ..errors import ReskipError
from . import backbone, compress, evaluate, experiment, export, lab, report, run, skip, train
from .common import Parser, resolve_run

# `reskip --help` lists the product first (compress, export, eval), then the research layer
COMMAND_GROUPS = (compress, export, evaluate, skip, run, train, report, experiment, backbone, lab)


def build_parser() -> Parser:
    parser = Parser(prog="reskip", description="Your model, smaller: `reskip compress` removes the blocks of layers it "
                                               "misses least, heals the rest by distillation from it and exports a "
                                               "plain Hugging Face folder with its fidelity and speed measured. The "
                                               "research layer: AR-Retrofit and ReSkip on a frozen pretrained LLM.")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.register(sub)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so every `finally` runs (an atomic folder's temporary is removed, the
    run lock let go) as on Ctrl-C."""


def _terminate(signum, frame):
    raise Terminated()


# what a stopped command offers, by command (the others write whole files or folders, or nothing)
AFTER_STOP = {"train": "a training run resumes from its last checkpoint with --resume RUN",
              "run": "the pipeline resumes with reskip run --resume RUN",
              "experiment": "rerun the same command: finished arms are read back and a stopped one resumes",
              "compress": "rerun the same command: it resumes where it stopped"}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = _on_sigterm(_terminate)
    try:
        resolve_run(args)
        check_out(args)
        use_threads(getattr(args, "threads", None))
        return args.func(args)
    except ReskipError as e:
        print(f"reskip: error: {bounded(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, a read-only folder, a path through a file: one line naming the path
        where = f" ({e.filename})" if e.filename else ""
        print(f"reskip: error: {e.strerror or e}{where}; the files written before it are intact", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        what = "terminated" if isinstance(e, Terminated) else "interrupted"
        after = AFTER_STOP.get(args.command, "nothing half-written was left; run the command again")
        print(f"reskip: {what}; {after}", file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130
    finally:
        _on_sigterm(previous)


def use_threads(threads: int | None) -> None:
    """`--threads N`: torch computes on N CPU threads (on a loaded 2-core machine one thread per process can be
    several times faster per step than two fighting for the cores)."""
    if threads:
        import torch  # lazy: only when asked, so that `reskip --help` loads no torch

        torch.set_num_threads(threads)


def _on_sigterm(handler):
    """Install `handler` for SIGTERM (in the main thread only, where Python runs handlers); returns the one before."""
    if threading.current_thread() is not threading.main_thread() or handler is None:
        return None
    return signal.signal(signal.SIGTERM, handler)


MESSAGE_LIMIT = 1000  # characters of an error message printed: one that quotes a huge value stays readable


def bounded(message: str) -> str:
    if len(message) <= MESSAGE_LIMIT:
        return message
    return f"{message[:MESSAGE_LIMIT]}... ({len(message) - MESSAGE_LIMIT:,} more characters)"


FILE_OUTS = ("calibrate", "diagnose")  # commands whose --out is a file; every other --out is a folder


def check_out(args) -> None:
    """An --out of the wrong kind (a file where a folder is written, or a folder where a file is) is refused
    before any work."""
    out = getattr(args, "out", None)
    if not out:
        return
    path = Path(out)
    for parent in path.parents:  # the first ancestor that exists must be a folder this process can write into
        if parent.exists():
            if not parent.is_dir():
                raise ReskipError(f"--out {path}: {parent} is a file, not a folder")
            if not os.access(parent, os.W_OK):
                raise ReskipError(f"--out {path}: cannot write into {parent} (permission denied)")
            break
    if args.command in FILE_OUTS and path.is_dir():
        raise ReskipError(f"--out {path} is a folder: give a file's path (e.g. {path / 'policy.json'})")
    if args.command not in FILE_OUTS and path.exists() and not path.is_dir():
        raise ReskipError(f"--out {path} is a file: give a folder to write into")
