"""`reskip diagnose` and `reskip report`. `report` reads run files only and imports no torch;
`diagnose` runs the model. Both library imports happen inside the handlers (`lazy:`), so that
`reskip --help` loads neither torch nor matplotlib."""

from __future__ import annotations

from ..reading import read_json
from ..research.report.options import DiagnoseOptions, ReportOptions
from .common import examples
from .options import add_option_flags, options_from_args


def cmd_diagnose(args) -> int:
    from ..stages.diagnose import diagnose  # lazy: torch

    path = diagnose(args.run, options_from_args(DiagnoseOptions, args))
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
    from ..stages.report import report  # lazy: matplotlib

    print(f"wrote {report(args.run, options_from_args(ReportOptions, args))}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("diagnose", help="depth diagnostics of a run -> RUN/diagnostics.json", **examples("diagnose"))
    p.add_argument("run", help="a trained run folder (calibrated: the reading discipline, the trace, the signal test)")
    add_option_flags(p, DiagnoseOptions)
    p.set_defaults(func=cmd_diagnose)

    p = sub.add_parser("report", help="self-contained HTML report of a run (reads run files only)", **examples("report"))
    p.add_argument("run", help="a run folder: reskip run, train, or experiment --out")
    add_option_flags(p, ReportOptions, config_file=False)
    p.set_defaults(func=cmd_report)
