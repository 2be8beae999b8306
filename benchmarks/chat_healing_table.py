"""Compressed models side by side, fidelity to the original where it is used first: every arm (a `reskip compress`
folder, or any exported model folder) scored in one run against the same references: on the original's own greedy
replies to a held-out chat prompt set (teacher-forced KL and top-1 on the reply tokens, greedy agreement, reply
loops; float32) and on raw text (KL, top-1 agreement, perplexity: the bundled mix's test or validation split and the
held-out King James Bible). Differences against a baseline arm with 95% bootstrap intervals (over prompts, over
sequences). Prints one JSON line and writes OUT/results.json and OUT/table.md.

    python benchmarks/chat_healing_table.py --arms A=runs/chat/A-default C=runs/chat/C-mix --baseline A \\
        --prompt-set val --text-split val --out runs/chat/eval-val

`--prompt-set val --text-split val` is where settings are chosen (the held-out chat prompt set `val`, the text's
validation split; kjv is not read); `--prompt-set test --text-split test` gives the final figures (kjv included).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from reskip.chat.prompt_sets import prompt_set
from reskip.errors import ReskipError
from reskip.evaluate.against_backbone import Reference
from reskip.io_atomic import atomic_write_json, atomic_write_text
from reskip.research.experiments.record import interval_text
from reskip.skip.spec import Spec
from reskip.statistics import bootstrap_mean_difference

CHAT_SHARES = ("prefix", "first32", "same_sentence", "identical", "new_loop")


def arm_folders(texts: list[str]) -> dict[str, Path]:
    """NAME=FOLDER pairs -> the exported model folder of each (a compress folder's model/, or the folder itself)."""
    out = {}
    for t in texts:
        name, _, folder = t.partition("=")
        path = Path(folder)
        model = path / "model" if (path / "model" / "config.json").is_file() else path
        if not name or not (model / "config.json").is_file():
            raise ReskipError(f"--arms {t}: give NAME=FOLDER, a compress folder or an exported model folder")
        out[name] = model
    return out


def arm_cost(model_folder: Path) -> dict:
    """What the arm cost, from its compress folder's files (the healing's summary, the conversations' summaries),
    where it has them."""
    folder = model_folder.parent
    summary = folder / "heal" / "summary.json"
    if not summary.is_file():
        return {}
    h = json.loads(summary.read_text())
    written = [json.loads(p.read_text()) for p in sorted(folder.glob("*-data/summary.json"))]
    return {"train_wall_s": h.get("train_wall_s"), "tokens": h.get("tokens_seen"),
            "data_wall_s": sum(w.get("wall_s", 0.0) for w in written),
            "conversations": sum(w.get("conversations", 0) for w in written)}


def chat_differences(rows: dict, baseline: str) -> dict:
    base = rows[baseline]["per_prompt"]
    out = {}
    for name, r in rows.items():
        if name in (baseline, "backbone"):
            continue
        pp, n = r["per_prompt"], len(base["kl"])
        out[name] = {"kl": bootstrap_mean_difference(np.array(pp["kl"]), np.array(base["kl"]),
                                                     np.array(base["positions"], float)),
                     **{k: bootstrap_mean_difference(np.array(pp[k]), np.array(base[k]), np.ones(n))
                        for k in CHAT_SHARES}}
    return out


def text_differences(rows: dict, baseline: str) -> dict:
    base = rows[baseline]["per_sequence"]
    return {name: bootstrap_mean_difference(np.array(r["per_sequence"]["kl"]), np.array(base["kl"]),
                                            np.array(base["positions"], float))
            for name, r in rows.items() if name not in (baseline, "backbone")}


def markdown(result: dict) -> str:
    chat, text, costs = result["chat"], result["text"], result["costs"]
    splits = list(text)
    head = ("| arm | chat KL | chat top-1 | reply before divergence | first 32 equal | same first sentence | new loops | "
            + " | ".join(f"{s}: KL | {s}: top-1 | {s}: ppl / original" for s in splits) + " | data + healing (s) |")
    lines = [f"Chat: {chat['prompts']} prompts of the `{chat['prompt_set']}` set (sha256 {chat['sha256'][:12]}), the "
             f"original's greedy replies ({chat['max_new_tokens']} new tokens; {chat['original_loops']} of them loop), "
             f"{chat['dtype']}. Text: {result['sequences']} sequences of {result['seq_len']} tokens per source "
             f"({result['text_split']} split of the mix; kjv held out).", "", head,
             "| " + " | ".join(["---"] * (8 + 3 * len(splits))) + " |"]
    for name in chat["methods"]:
        c = chat["methods"][name]
        cells = [f"{c['kl']['mean']:.3f}", f"{c['top1']['mean']:.3f}", f"{c['prefix']['mean']:.3f}",
                 f"{c['first32']['mean']:.3f}", f"{c['same_sentence']['mean']:.3f}", f"{c['new_loop']['mean']:.3f}"]
        for s in splits:
            r = text[s]["rows"][name]
            cells += [f"{r['kl_to_backbone']:.3f}", f"{r['top1_agreement']:.3f}", f"{r['ppl_ratio']:.3f}"]
        cost = costs.get(name) or {}
        spent = (cost.get("data_wall_s") or 0) + (cost.get("train_wall_s") or 0)
        cells.append(f"{spent:.0f}" if cost else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", f"Differences from `{result['baseline']}` (95% bootstrap intervals; chat over prompts, text over "
                  "sequences):", "",
              "| arm | chat KL | same first sentence | first 32 equal | new loops | "
              + " | ".join(f"{s}: KL" for s in splits) + " |", "| " + " | ".join(["---"] * (5 + len(splits))) + " |"]
    for name, d in result["chat_differences"].items():
        cells = [interval_text(d[k]) for k in ("kl", "same_sentence", "first32", "new_loop")]
        cells += [interval_text(result["text_differences"][s][name]) for s in splits]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", nargs="+", required=True, help="NAME=FOLDER (a compress folder or an exported model)")
    ap.add_argument("--baseline", required=True, help="the arm the differences are taken from")
    ap.add_argument("--model", default=None, help="the original (default: the bundled SmolLM2-135M-Instruct)")
    ap.add_argument("--prompt-set", choices=("val", "test"), default="val")
    ap.add_argument("--prompts", type=int, default=None, help="the set's first N prompts (default: all)")
    ap.add_argument("--text-split", choices=("val", "test"), default="val")
    ap.add_argument("--text", nargs="+", default=["default"], help="the raw text's data specs")
    ap.add_argument("--sequences", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    arms = arm_folders(args.arms)
    if args.baseline not in arms:
        raise SystemExit(f"--baseline {args.baseline}: not among the arms {', '.join(arms)}")
    t0 = time.time()
    specs = {name: Spec("export", name, run=str(folder)) for name, folder in arms.items()}
    ref32 = Reference.load(args.model, "float32", "cpu", False, 4)
    chat = ref32.chat(ref32.methods(specs), prompt_set(args.prompt_set).first(args.prompts))
    del ref32
    ref = Reference.load(args.model, "auto", "cpu", False, 4)
    sources = {"text": list(args.text), **({"kjv": ["kjv"]} if args.text_split == "test" else {})}
    text = ref.score(ref.methods(specs), sources, args.sequences, args.seq_len, split=args.text_split)
    result = {"arms": {k: str(v) for k, v in arms.items()}, "baseline": args.baseline, "model": args.model,
              "prompt_set": args.prompt_set, "text_split": args.text_split, "sequences": args.sequences,
              "seq_len": args.seq_len, "chat": chat, "text": text,
              "chat_differences": chat_differences(chat["methods"], args.baseline),
              "text_differences": {s: text_differences(text[s]["rows"], args.baseline) for s in text},
              "costs": {name: arm_cost(folder) for name, folder in arms.items()}, "wall_s": round(time.time() - t0)}
    out = Path(args.out)
    atomic_write_json(out / "results.json", result)
    atomic_write_text(out / "table.md", markdown(result))
    print(json.dumps({"out": str(out), "wall_s": result["wall_s"],
                      "chat_kl": {k: round(v["kl"]["mean"], 4) for k, v in chat["methods"].items()}}))


if __name__ == "__main__":
    main()
