"""What `reskip experiment baselines` says of its rows: the intervals of the differences the verdict reads, the
claims, the tables and the verdict. Reads the result dict only (`baselines.run` builds it).

Row keys name rows, nothing parses them: the recipe run's rows by their eval method name (`retrofit`,
`reskip:budget=1`, `static:1`, ...), a recipe variant's as `<variant> / <method>`, the baselines' by their method
(`lora`, `healed:1`, `healed:1:kd`, `pruned:1`) and `backbone`; each row carries its kind and arguments
(as the eval typed them) and `arm`, the swept method whose chosen arm it comes from. Fidelity to the backbone (KL per position, top-1 agreement) is read
first, perplexity beside it: below the backbone's on the mix's own test split, perplexity is fine-tuning on the mix,
not quality."""

from __future__ import annotations

import numpy as np

from ...statistics import bootstrap_difference, bootstrap_mean_difference
from .record import claim, interval_text

SPLITS = ("test", "kjv")
SKIPPING_KINDS = ("reskip", "static", "sequence")  # the recipe's rows that skip blocks of the trained model
RECIPE_ROWS = {"retrofit": "retrofit", "reskip:budget=1": "ReSkip, budget 1", "reskip:budget=1:held": "ReSkip, budget 1, held",
               "sequence:1": "per-sequence selection, 1 block", "reskip:budget=2": "ReSkip, budget 2",
               "reskip:budget=2:held": "ReSkip, budget 2, held", "sequence:2": "per-sequence selection, 2 blocks",
               "static:1": "static:1 (learned shortcut)", "static:2": "static:2 (learned shortcut)"}
# the variants' rows the table and the verdict read (their full eval is in recipe-eval/<arm>/)
VARIANT_ROWS = ("retrofit", "reskip:budget=1", "static:1", "reskip:budget=2", "static:2")
BASE_COMPARISONS = (("retrofit", "lora"), ("reskip:budget=1", "healed:1"),
                    ("reskip:budget=1:held", "healed:1"), ("sequence:1", "healed:1"),
                    ("sequence:2", "healed:2"), ("static:1", "healed:1"),
                    ("reskip:budget=2", "healed:2"), ("static:2", "healed:2"),
                    ("healed:1", "backbone"), ("lora", "backbone"))


def variant_row(variant: str, key: str) -> str:
    return f"{variant} / {key}"


def healed_key(k: int, objective: str) -> str:
    return f"healed:{k}" + ("" if objective == "ce" else f":{objective}")


def comparisons(variants, heal=("ce",)) -> list[tuple[str, str]]:
    """The pairs whose difference the verdict reads: the recipe's against the baselines, each variant's
    nothing-skipped row against the LoRA and its one- and two-block rows against healed pruning, and each healing
    objective against cross-entropy's, the unhealed pruning and the recipe's skipping at the same blocks."""
    out = list(BASE_COMPARISONS)
    for k in (1, 2):
        out.append((f"healed:{k}", f"pruned:{k}"))
        for h in heal:
            if h != "ce":
                out += [(healed_key(k, h), f"healed:{k}"), (healed_key(k, h), f"pruned:{k}"),
                        (f"static:{k}", healed_key(k, h)), (f"reskip:budget={k}", healed_key(k, h))]
    for v in variants:
        out += [(variant_row(v, "retrofit"), "lora"), (variant_row(v, "retrofit"), "retrofit")]
        for k in (1, 2):
            out += [(variant_row(v, f"{kind}"), f"healed:{k}") for kind in (f"reskip:budget={k}", f"static:{k}")]
    return out


def fidelity_intervals(rows: dict, variants=(), heal=("ce",)) -> dict:
    """a - b of KL to the backbone (per position) and of top-1 agreement with it, for each comparison the verdict
    reads, per split, with their 95% bootstrap intervals over sequences (rows scored with per-sequence KL)."""
    out = {"kl": {}, "top1": {}}
    for a, b in comparisons(variants, heal):
        if a not in rows or b not in rows:
            continue
        for s in SPLITS:
            pa, pb = rows[a]["per_sequence"][s], rows[b]["per_sequence"][s]
            if "kl" not in pa or "kl" not in pb:
                continue
            counts = np.array(pa["positions"], float)
            for key, field in (("kl", "kl"), ("top1", "agree")):
                out[key][f"{a} - {b} ({s})"] = bootstrap_mean_difference(
                    np.array(pa[field], float), np.array(pb[field], float), counts)
    return out


def intervals(rows: dict, variants=(), heal=("ce",)) -> dict:
    """a - b of perplexity / backbone for each comparison the verdict reads, per split, with its 95% bootstrap
    interval over sequences."""
    out = {}
    for a, b in comparisons(variants, heal):
        if a not in rows or b not in rows:  # a budget out of this model's reach
            continue
        for s in SPLITS:
            back = rows["backbone"]["per_sequence"][s]
            full, targets = np.array(back["nll"], float), np.array(back["targets"], float)
            d = bootstrap_difference(full, np.array(rows[a]["per_sequence"][s]["nll"], float),
                                     np.array(rows[b]["per_sequence"][s]["nll"], float), targets)
            out[f"{a} - {b} ({s})"] = d
    return out


def claims(r: dict) -> list[dict]:
    iv = r["intervals"]
    out = fidelity_claims(r)
    subjects = [("retrofit", "the side-channel")] + [(variant_row(v, "retrofit"), v) for v in r.get("variants", [])]
    for key, label in subjects:
        for s in SPLITS:
            d = iv[f"{key} - lora ({s})"]
            out.append(claim(f"nothing skipped, {label} beats a parameter-matched LoRA beyond the interval ({s})",
                             f"{key} - lora = {interval_text(d)}", d["hi"] < 0))
    for k in (1, 2):
        skipping = [(f"reskip:budget={k}", "ReSkip"), (f"sequence:{k}", "per-sequence selection")]
        skipping += [(variant_row(v, f"reskip:budget={k}"), f"{v}, ReSkip") for v in r.get("variants", [])]
        for key, label in skipping:
            for s in SPLITS:
                d = iv.get(f"{key} - healed:{k} ({s})")
                text = f"at {k} block(s) per step {label} beats LoRA-healed pruning beyond the interval ({s})"
                if d is None:
                    out.append(claim(text, f"no {key} on this model", None))
                    continue
                skips = r["rows"][key]["blocks_skipped"][s]
                out.append(claim(text, f"{label} - healed = {interval_text(d)} ({label} skips {skips:.2f} blocks per step)",
                                 d["hi"] < 0))
    return out


def fidelity_claims(r: dict) -> list[dict]:
    """Healing by distillation against cross-entropy, on KL to the backbone (lower is closer)."""
    fid = r.get("fidelity_intervals", {}).get("kl", {})
    out = []
    for h in r.get("heal", ["ce"]):
        for k in (1, 2) if h != "ce" else ():
            for split in SPLITS:
                d = fid.get(f"{healed_key(k, h)} - healed:{k} ({split})")
                if d is not None:
                    out.append(claim(f"at {k} block(s) removed, healing by {h} is closer to the backbone than by ce "
                                     f"beyond the interval ({split})", f"KL {h} - ce = {interval_text(d)}", d["hi"] < 0))
    return out


def _labels(variants, heal=("ce",)) -> dict:
    names = {"backbone": "backbone", **RECIPE_ROWS}
    for v in variants:
        names.update({variant_row(v, k): f"{v}: {RECIPE_ROWS[k]}" for k in VARIANT_ROWS})
    names["lora"] = "LoRA"
    for k in (1, 2):
        names[f"pruned:{k}"] = f"pruned:{k} (no healing)"
        names.update({healed_key(k, h): f"healed:{k}, healed by {h}" for h in heal})
    return names


def _fidelity(row: dict, split: str) -> str:
    kl, top1 = row.get("kl_to_backbone"), row.get("top1_agreement")
    return "- | -" if kl is None else f"{kl[split]:.4f} | {top1[split]:.4f}"


def _main_table(r: dict) -> list[str]:
    rows, sweep = r["rows"], r["sweep"]
    chosen = {m: sweep[n] for m, n in r["chosen"].items()}
    main = ["| method | blocks skipped / step (test, kjv) | layer FLOPs executed | trainable params | lr | "
            "kjv KL to backbone | kjv top-1 agreement | kjv ppl / backbone | test KL to backbone | test top-1 agreement "
            "| test ppl / backbone | val ppl / backbone | training wall (min) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key, label in _labels(r.get("variants", []), r.get("heal", ["ce"])).items():
        if key not in rows:
            continue
        row = rows[key]
        m = chosen.get(row["arm"]) if row.get("arm") else None
        # validation perplexity is the trained model's: a row that skips blocks of it is not that model
        val = "-" if m is None or row["kind"] in SKIPPING_KINDS else f"{m['val_ppl'] / m['val_ppl_backbone']:.4f}"
        if key == "backbone":
            val = "1.0000"
        main.append(f"| {label} | {row['blocks_skipped']['test']:.2f}, {row['blocks_skipped']['kjv']:.2f} "
                    f"| {row['flops_executed_share']['test']:.3f} | {'-' if m is None else format(m['params'], ',')} "
                    f"| {'-' if m is None else format(m['lr'], 'g')} | {_fidelity(row, 'kjv')} "
                    f"| {row['ppl_ratio']['kjv']:.4f} | {_fidelity(row, 'test')} | {row['ppl_ratio']['test']:.4f} "
                    f"| {val} | {'-' if m is None else format(m['train_wall_s'] / 60, '.1f')} |")
    return main


def tables(r: dict) -> dict:
    sweep = r["sweep"]
    sw = ["| arm | lr | trainable params | final val ppl | val ppl / backbone | training wall (min) |",
          "| --- | --- | --- | --- | --- | --- |"]
    sw += [f"| {n}{' (chosen)' if n in r['chosen'].values() else ''} | {a['lr']:g} | {a['params']:,} | "
           f"{a['val_ppl']:.3f} | {a['val_ppl'] / a['val_ppl_backbone']:.4f} | {a['train_wall_s'] / 60:.1f} |"
           for n, a in sweep.items()]
    fid = r.get("fidelity_intervals", {"kl": {}, "top1": {}})
    iv = ["| difference | KL to backbone [95% CI] | top-1 agreement [95% CI] | ppl / backbone [95% CI] |",
          "| --- | --- | --- | --- |"]
    iv += [f"| {k} | {interval_text(fid['kl'][k]) if k in fid['kl'] else '-'} | {interval_text(fid['top1'][k]) if k in fid['top1'] else '-'} "
           f"| {interval_text(d)} |" for k, d in r["intervals"].items()]
    bb = r["backbone_blocks"]
    blocks = ["| block | layers | A(n) on the backbone | cos(in, out) |", "| --- | --- | --- | --- |"]
    blocks += [f"| {n} | {layers[0]}-{layers[-1]} | {bb['A'][str(n)]:.3f} | {bb['cos_in_out'][str(n)]:.4f} |"
               for n, layers in enumerate(bb["blocks"], start=1)]
    for k in ("1", "2"):
        blocks.append(f"| drop {k} | by A(n): blocks {bb['dropped'][k]} | by influence (ShortGPT): blocks "
                      f"{bb['influence_would_drop'][k]} | |")
    spent = ["| split | method | blocks skipped / step there | ppl / backbone | static at those skips | "
             "method - static [95% CI] |", "| --- | --- | --- | --- | --- | --- |"]
    spent += [f"| {sp} | {x['method']} | {x['skipped']:.2f} | {x['ppl_ratio']:.4f} | "
              f"{'-' if x['static_ppl_ratio'] is None else format(x['static_ppl_ratio'], '.4f')} ({x['static']}) | "
              f"{interval_text(x['minus_static']) if 'minus_static' in x else '-'} |"
              for sp in SPLITS for x in r["at_spent_compute"][sp]]
    return {"Every method at 0, 1 and 2 blocks per step: fidelity to the backbone first (KL per position, top-1 "
            "agreement), perplexity / the backbone's beside it": _main_table(r),
            "At the compute each input-dependent method spends (static matched on that split)": spent,
            "The learning-rate sweep (chosen on validation)": sw,
            "Differences the verdict reads": iv,
            "The backbone's blocks (calibration split): what static pruning drops": blocks}


def closest(r: dict, k: int, split: str) -> list[tuple[str, dict]]:
    """The rows that spend k blocks per step on `split` (within 0.05), closest to the backbone first (KL)."""
    rows = r["rows"]
    near = [(key, row) for key, row in rows.items() if row.get("kl_to_backbone") is not None
            and abs(row["blocks_skipped"][split] - k) <= 0.05]
    return sorted(near, key=lambda kr: kr[1]["kl_to_backbone"][split])


def fidelity_verdict(r: dict) -> str:
    """Which method is closest to the backbone at one and two blocks per step, on kjv (no stage saw it) and on the
    test split, with KL, top-1 agreement and perplexity; and healing by distillation against cross-entropy."""
    parts = []
    for k, w in ((1, "one block"), (2, "two blocks")):
        for split in ("kjv", "test"):
            ranked = closest(r, k, split)
            if not ranked:
                continue
            text = ", then ".join(f"{key} (KL {row['kl_to_backbone'][split]:.3f}, top-1 "
                                  f"{row['top1_agreement'][split]:.3f}, ppl {row['ppl_ratio'][split]:.3f}x)"
                                  for key, row in ranked[:3])
            parts.append(f"At {w} per step on {split}, closest to the backbone: {text}.")
    fid = r.get("fidelity_intervals", {}).get("kl", {})
    for h in r.get("heal", ["ce"]):
        for k in (1, 2) if h != "ce" else ():
            for split in SPLITS:
                d = fid.get(f"{healed_key(k, h)} - healed:{k} ({split})")
                if d is not None:
                    parts.append(f"KL of healing by {h} minus by ce at {k} block(s), {split}: {interval_text(d)}.")
    return " ".join(parts)


def verdict(r: dict) -> str:
    iv = r["intervals"]

    def said(subject: str, a: str, b: str, other: str) -> str:
        parts = []
        for s in SPLITS:
            d = iv.get(f"{a} - {b} ({s})")
            if d is None:
                return f"{subject}: {a} not measured on this model."
            how = "beats" if d["hi"] < 0 else "loses to" if d["lo"] > 0 else "is not separated from"
            parts.append(f"{how} {other} on {s} ({interval_text(d)})")
        return f"{subject}, {a} " + " and ".join(parts) + "."

    variants = r.get("variants", [])
    return " ".join([fidelity_verdict(r), "Differences of perplexity / backbone with 95% intervals.",
                     said("Nothing skipped", "retrofit", "lora", "a LoRA of the same trainable parameters"),
                     *(said("Nothing skipped", variant_row(v, "retrofit"), "lora", "the LoRA") for v in variants),
                     *(said(f"At {w} per step", m, f"healed:{k}", "LoRA-healed pruning")
                       for k, w in ((1, "one block"), (2, "two blocks"))
                       for m in (f"reskip:budget={k}", f"sequence:{k}",
                                 *(variant_row(v, f"reskip:budget={k}") for v in variants)))])
