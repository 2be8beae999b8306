"""Wall time of the calibrate and eval stages of a trained run in float32 and in the `auto` dtype, in one process.

Each stage runs with the pipeline preset's options (`reskip run --preset P`), once per dtype, writing into a
temporary folder (the run's own policy.json and eval/ are left alone; eval reads the run's policy.json in
both dtypes). A short untimed calibration first warms up the process (compiling the fused metrics). Prints one JSON line:
seconds per stage and dtype, the ratios, and the quality figures both dtypes give (A(n) per block, the
frontier's perplexity ratio at each budget, test perplexity of the backbone and the retrofit) with their
relative differences.

    python benchmarks/stage_speed.py RUN [--preset standard] [--dtypes float32 auto]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from reskip.backbones.dtypes import resolve_dtype_name
from reskip.evaluate.run import evaluate_run
from reskip.machine_load import load_average, load_report
from reskip.research.calibrate.run import calibrate_run
from reskip.research.pipeline import PipelineConfig
from reskip.skip.policy_file import PolicyFile


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--preset", default="standard", choices=["quick", "medium", "standard"])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "auto"], choices=["float32", "bfloat16", "auto"])
    args = ap.parse_args(argv)
    load_before = load_average()
    pc = PipelineConfig(preset=args.preset)
    tmp = Path(tempfile.mkdtemp(prefix="stage-speed-"))
    report = {"run": args.run, "preset": args.preset, "dtypes": {d: resolve_dtype_name(d) for d in args.dtypes}}
    quality = {}
    calibrate_run(args.run, dataclasses.replace(pc.calibrate_options(), dtype=args.dtypes[0], sequences=2,
                                                budgets=(), out=str(tmp / "warmup.json")))
    for d in args.dtypes:
        t = time.perf_counter()
        policy = PolicyFile.load(calibrate_run(args.run, dataclasses.replace(pc.calibrate_options(), dtype=d,
                                                                             out=str(tmp / f"policy-{d}.json"))))
        report[f"calibrate_s_{d}"] = time.perf_counter() - t
        t = time.perf_counter()  # eval reads the run's own policy.json in both dtypes: the same thresholds
        results = json.loads(evaluate_run(args.run, dataclasses.replace(pc.eval_options(), dtype=d,
                                                                       out=str(tmp / f"eval-{d}"))).read_text())
        report[f"eval_s_{d}"] = time.perf_counter() - t
        quality[d] = {
            "A": {str(b["block"]): b["A"] for b in policy.data["blocks"]},
            "frontier_ppl_ratio": {f"{p['budget']:g}": p["measured"]["ppl_ratio"]
                                   for p in (policy.data.get("budgets") or {}).get("frontier", [])},
            "test_ppl": {m: results["methods"][m]["ppl"] for m in ("backbone", "retrofit")},
        }
    report["quality"] = quality
    if "float32" in args.dtypes:
        for d in args.dtypes:
            if d == "float32":
                continue
            for stage in ("calibrate", "eval"):
                report[f"{stage}_speedup_{d}_vs_float32"] = report[f"{stage}_s_float32"] / report[f"{stage}_s_{d}"]
            report[f"max_rel_diff_{d}_vs_float32"] = {
                key: max(abs(quality[d][key][k] / quality["float32"][key][k] - 1) for k in quality["float32"][key])
                for key in ("A", "frontier_ppl_ratio", "test_ppl") if quality["float32"][key]}
        report["target_min_speedup"] = 3.0
    report["load"] = load_report(load_before, load_average(), torch.get_num_threads())
    if report["load"]["note"]:
        print(f"note: {report['load']['note']}", file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
