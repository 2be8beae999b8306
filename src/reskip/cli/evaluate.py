"""`reskip eval`. The library import happens inside the handler (`lazy:`): `reskip --help` loads no torch."""

from __future__ import annotations

import sys

from ..evaluate.options import DEFAULT_MC_METHODS, DEFAULT_METHODS, EvalOptions
from ..evaluate.tables import markdown
from ..skip.spec import METHOD_GRAMMAR, METHOD_KINDS, parse_specs
from .common import adapter_flag, model_flags


def eval_options(args) -> EvalOptions:
    return EvalOptions(methods=parse_specs(args.methods, METHOD_KINDS), benchmarks=[b for b in args.benchmarks or [] if b != "none"],
                       mc_methods=parse_specs(args.mc_methods, METHOD_KINDS), mc_limit=args.mc_limit,
                       sequences=args.sequences, seq_len=args.seq_len, chunk_size=args.chunk_size, window=args.window,
                       seed=args.seed, data=args.data, model=args.model, dtype=args.dtype,
                       trust_remote_code=args.trust_remote_code, out=args.out, quiet=args.quiet,
                       heldout=args.heldout or None)


def cmd_eval(args) -> int:
    options = eval_options(args)
    from ..evaluate.stage import evaluate_run, margin_violations  # lazy: torch

    results, folder = evaluate_run(args.adapter, options)
    print(markdown(results))
    print(f"wrote {folder / 'results.json'} and {folder / 'results.md'}")
    bad = margin_violations(results)
    if bad:
        print(f"BUG: top-1 changed where 2 eps < Delta for {bad}", file=sys.stderr)
        return 1
    return 0


def register(sub) -> None:
    d = EvalOptions()
    p = sub.add_parser("eval", help="evaluate backbone, retrofit and skip policies side by side (results.json + .md)")
    adapter_flag(p)
    p.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), help=METHOD_GRAMMAR)
    p.add_argument("--benchmarks", nargs="*", default=d.benchmarks,
                   help="mmlu and/or bigbench:TASK (e.g. bigbench:social_iqa); none (or nothing): skip multiple choice")
    p.add_argument("--mc-methods", nargs="+", default=list(DEFAULT_MC_METHODS))
    p.add_argument("--mc-limit", type=int, default=d.mc_limit, help="questions per benchmark (deterministic sample)")
    model_flags(p, dtype=True)
    p.add_argument("--data", nargs="+", help="data specs (default: the run's); the test split is used")
    p.add_argument("--heldout", nargs="+", help="data specs of a source kept out of training and calibration "
                                                "(e.g. kjv): every method on its test split too (policy drift)")
    p.add_argument("--sequences", type=int, default=d.sequences, help=f"test sequences (default {d.sequences})")
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--chunk-size", type=int, default=d.chunk_size,
                   help=f"tokens per step when scoring (default {d.chunk_size})")
    p.add_argument("--window", type=int, default=None, help="default: the policy's")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", help="folder for results.json / results.md (default RUN/eval)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_eval)
