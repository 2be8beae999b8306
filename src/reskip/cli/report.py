"""`reskip diagnose` and `reskip report`. `report` reads run files only and imports no torch;
`diagnose` runs the model. Both library imports happen inside the handlers (`lazy:`), so that
`reskip --help` loads neither torch nor matplotlib."""

from __future__ import annotations

from pathlib import Path

from .common import dtype_flag
from ..reading import read_json
from ..report.options import DiagnoseOptions
from ..errors import ReskipError
from ..runs import RunFolder


def cmd_diagnose(args) -> int:
    from ..report.diagnose import diagnose  # lazy: torch

    path = diagnose(args.run, DiagnoseOptions(context=args.context, sequences=args.sequences,
                                              sample_tokens=args.sample_tokens, signal_sequences=args.signal_sequences,
                                              probe_sequences=args.probe_sequences,
                                              model=args.model, dtype=args.dtype, out=args.out))
    d = read_json(path)
    print("routing health:")
    for r in d["routing_health"]:
        ratio = "-" if r["entropy_ratio"] is None else f"{r['entropy_ratio']:.2f}"
        spread = (f", w_recent 5-95% {r['w_recent_p05']:.3f}-{r['w_recent_p95']:.3f}" if "w_recent_p05" in r else "")
        print(f"  block {r['block']}: H/log n = {ratio}, alpha on h_(n-1) = {r['alpha_on_prev']:.2f}{spread}  {r['status']}")
    dil = d["dilution"]
    print(f"dilution: cos^2(h0, h_L) = {dil['cos2'][-1]:.4f}, |h0|^2/|h_L|^2 = {dil['energy_ratio'][-1]:.4f} "
          f"(toy model {dil['toy_model'][-1]:.4f})")
    if "reading_discipline" in d:
        print(f"Spearman(I, A) = {d['reading_discipline']['spearman_I_vs_A']}")
    if "signal_test" in d:
        st = d["signal_test"]
        print(f"signal test ({st['sequences']} test sequences; perplexity / full, block n skipped at a fraction p of positions):")
        print("  block  p     signal  reverse random  oracle  signal-random [95% CI]      verdict")
        for r in st["blocks"]:
            q, diff = r["ppl_ratio"], r["signal_minus_random"]
            print(f"  {r['block']:>5}  {r['p']:<4}  {q['signal']:.3f}   {q['reverse']:.3f}   {q['random']:.3f}   "
                  f"{q['oracle']:.3f}   {diff['mean']:+.3f} [{diff['lo']:+.3f}, {diff['hi']:+.3f}]   {r['verdict']}")
        print(f"  {st['sentence']}")
    print(f"wrote {path}")
    return 0


def cmd_report(args) -> int:
    from ..report.html import build_report  # lazy: matplotlib

    run = Path(args.run)
    if not run.is_dir():
        raise ReskipError(f"{run} is not a run folder")
    files = RunFolder(run)
    stage_files = (files.parity, files.train_log, files.policy, files.diagnostics, files.results)
    if not any(p.is_file() for p in stage_files) and not files.experiments_dir.is_dir():
        raise ReskipError(f"{run} holds no stage's files (parity.json, train_log.jsonl, policy.json, diagnostics.json, "
                          "eval/results.json) and no experiments/: name a run folder (reskip run, train, or "
                          "experiment --out)")
    path = build_report(run, Path(args.out) if args.out else None)
    print(f"wrote {path}")
    return 0


def register(sub) -> None:
    d = DiagnoseOptions()
    p = sub.add_parser("diagnose", help="depth diagnostics of a run -> RUN/diagnostics.json")
    p.add_argument("run")
    p.add_argument("--model", default=None)
    dtype_flag(p)
    p.add_argument("--context", type=int, default=d.context, help="context length for the memory table")
    p.add_argument("--sequences", type=int, default=d.sequences, help="test sequences for dilution")
    p.add_argument("--sample-tokens", type=int, default=d.sample_tokens, help="tokens of the per-token skip trace")
    p.add_argument("--signal-sequences", type=int, default=d.signal_sequences,
                   help=f"test sequences of the signal test (0: skip it; default {d.signal_sequences})")
    p.add_argument("--probe-sequences", type=int, default=d.probe_sequences,
                   help="calibration sequences the signal test's cost probes (a ridge and an MLP on h_{n-1}) are "
                        f"fitted on (0: no probe chooser; default {d.probe_sequences})")
    p.add_argument("--out", help="the diagnostics file (default RUN/diagnostics.json)")
    p.set_defaults(func=cmd_diagnose)

    p = sub.add_parser("report", help="self-contained HTML report of a run (reads run files only)")
    p.add_argument("run")
    p.add_argument("--out", help="folder (default RUN/report)")
    p.set_defaults(func=cmd_report)
