"""One eval's rows as the healing table: per method, on every split the eval scored (test and each held-out
source), KL to the backbone per position, top-1 agreement with it and perplexity / the backbone's, and the
differences asked for (a - b of KL and of top-1 agreement, with 95% bootstrap intervals over the same sequences).
Reads the results.json `reskip eval` wrote; prints one JSON line and writes OUT (JSON) and OUT with .md.

    python benchmarks/healing_table.py runs/capacity/eval-all/results.json --out docs/results/healing/table.json \\
        --diff "healed:A=healed:B" ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from reskip.research.experiments.record import interval_text
from reskip.statistics import bootstrap_mean_difference


def splits_of(results: dict) -> dict[str, dict]:
    out = {"test": results["methods"]}
    if results.get("heldout"):
        out[",".join(results["heldout"]["data"])] = results["heldout"]["methods"]
    return out


def difference(rows_a: dict, rows_b: dict) -> dict:
    """a - b of KL and top-1 agreement per position, paired over the sequences both were scored on."""
    pa, pb = rows_a["per_sequence"], rows_b["per_sequence"]
    counts = np.array(pa["positions"], float)
    return {key: bootstrap_mean_difference(np.array(pa[field], float), np.array(pb[field], float), counts)
            for key, field in (("kl", "kl"), ("top1", "agree"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results")
    ap.add_argument("--out", required=True)
    ap.add_argument("--diff", nargs="*", default=[], help="A=B: the difference A - B (method names of the eval)")
    ap.add_argument("--labels", nargs="*", default=[], help="NAME=LABEL: the table's name for a method, in order; "
                                                             "with labels, only the labelled methods are tabled")
    args = ap.parse_args()
    results = json.loads(Path(args.results).read_text())
    splits = splits_of(results)
    labels = dict(x.split("=", 1) for x in args.labels) or {name: name for name in results["methods"]}
    rows = {name: {split: {k: m[name][k] for k in ("kl_to_backbone", "top1_agreement", "ppl_ratio",
                                                      "flops_executed_share")}
                   for split, m in splits.items()} for name in labels}
    pairs = {pair: pair.split("=", 1) for pair in args.diff}  # "A=B" -> (A, B)
    diffs = {pair: {split: difference(m[a], m[b]) for split, m in splits.items()} for pair, (a, b) in pairs.items()}
    out = {"results": args.results, "labels": labels, "rows": rows, "differences": diffs}
    name_of = {**labels, **{pair: f"{labels.get(a, a)} - {labels.get(b, b)}" for pair, (a, b) in pairs.items()}}
    md = ["| method | " + " | ".join(f"{s}: KL | {s}: top-1 | {s}: ppl / backbone" for s in splits) + " |",
          "| --- |" + " --- | --- | --- |" * len(splits)]
    md += [f"| {name_of[name]} | " + " | ".join(f"{r[s]['kl_to_backbone']:.4f} | {r[s]['top1_agreement']:.4f} | "
                                       f"{r[s]['ppl_ratio']:.4f}" for s in splits) + " |" for name, r in rows.items()]
    md += ["", "| difference | split | KL [95% CI] | top-1 [95% CI] |", "| --- | --- | --- | --- |"]
    md += [f"| {name_of[pair]} | {s} | {interval_text(d['kl'])} | {interval_text(d['top1'])} |"
           for pair, per in diffs.items() for s, d in per.items()]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    Path(args.out).with_suffix(".md").write_text("\n".join(md) + "\n")
    print(json.dumps({"rows": rows, "differences": {p: {s: {k: v["mean"] for k, v in d.items()}
                                                       for s, d in per.items()} for p, per in diffs.items()}}))


if __name__ == "__main__":
    main()
