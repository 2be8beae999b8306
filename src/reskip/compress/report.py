"""report.json -> report.md and report.html: what `reskip compress` made and how close it is to the original (reads
the report only). The page is self-contained (no script or file it loads) and says it rendered (`data-status`)."""

from __future__ import annotations

import html
import re

from ..report.tables import markdown_table

STYLE = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.45}"
         "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}"
         "th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}code{background:#f3f3f3;padding:0 .2em}")


def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


RANKED = {"ppl": "the model's own ablation cost A(n)", "kl": "the ablation's KL to the model",
          "influence": "ShortGPT's block influence"}


def _blocks_table(b: dict) -> list[str]:
    """Each block's costs of removal as measured (what the ranking read)."""
    kl = b.get("kl") or {}
    rows = ["| block | layers | A(n) | KL to the model | cos(input, output) | removed |", "| --- | --- | --- | --- | --- | --- |"]
    for n, layers in enumerate(b["blocks"], start=1):
        k = str(n)
        rows.append(f"| {n} | {layers[0]}-{layers[-1]} | {b['A'][k]:.3f} | {_f(kl.get(k), '.3f')} | "
                    f"{b['cos_in_out'][k]:.4f} | {'yes' if n in b['removed'] else ''} |")
    return ["", *rows]


def markdown(r: dict) -> str:
    b, h, m = r["blocks"], r["healing"], r["measured"]
    kept = b["layers"] - len(b["layers_removed"])
    lines = [f"# {r['settings']['model'] or 'SmolLM2-135M-Instruct'}: {b['layers']} -> {kept} layers", "",
             f"Blocks {b['removed']} removed (layers {', '.join(map(str, b['layers_removed']))}), the cheapest by "
             f"{RANKED[b.get('chosen_by', 'ppl')]} on the calibration split; the rest healed by a LoRA of "
             f"{h['parameters']:,} parameters trained by `{h['objective']}` on {h['tokens']:,} tokens "
             f"({h['train_wall_s'] / 60:.1f} min), merged into a plain Hugging Face folder (`model/`).", "",
             *_blocks_table(b), "",
             "## Fidelity to the original, perplexity beside it", "",
             "KL(original || compressed) per position and top-1 agreement with the original: how close the "
             "compressed model's next-token distribution stays to the model you deploy. Perplexity below the "
             "original's on the healing data's own test split would be fine-tuning on that data, not quality; the "
             "held-out text was seen by no stage.", "",
             "| text | KL to the original | top-1 agreement | perplexity | original's perplexity | ratio |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, s in m["splits"].items():
        c, o = s["compressed"], s["backbone"]
        lines.append(f"| {name}{' (held out)' if name != 'test' else ''} | {c['kl_to_backbone']:.4f} | "
                     f"{c['top1_agreement']:.4f} | {c['ppl']:.3f} | {o['ppl']:.3f} | {c['ppl_ratio']:.3f} |")
    lines += ["", f"{m['sequences']} sequences of {m['seq_len']} tokens per text, in {m['dtype']} on {m['device']}."]
    if "generation" in m:
        g = m["generation"]
        lines += ["", f"Greedy generation of {g['prompts']} fixed prompts (`evaluate.generation.PROMPTS`, chat template): "
                      f"{g['prefix_share']:.3f} of each continuation equal to the original's before the first "
                      f"divergence, the same first sentence on {g['same_first_sentence']:.3f} of the prompts."]
    if "mmlu" in m:
        mo, mc = m["mmlu"]["original"], m["mmlu"]["compressed"]
        lines += ["", f"MMLU ({mo['n']} questions, chance {mo['chance']:.2f}): original {mo['acc']:.3f}, compressed "
                      f"{mc['acc']:.3f} (acc_norm {mo['acc_norm']:.3f} / {mc['acc_norm']:.3f})."]
    if "speed" in r:
        sp = r["speed"]
        lines += ["", "## Speed in transformers (tokens per second, median of interleaved repeats)", "",
                  f"FLOP-ideal speed-up {sp['flop_ideal_speedup']:.3f}x (every layer's weights and the LM head per "
                  f"token); {sp['threads']} threads.", "",
                  "| case | original | compressed | speed-up | share of the FLOP-ideal |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {name} | {c['original_tokens_per_s']:.1f} | {c['compressed_tokens_per_s']:.1f} | "
                  f"{c['speedup']:.3f}x | {c['share_of_ideal']:.3f} |" for name, c in sp["cases"].items()]
    lines += ["", "Validation during healing: KL to the original "
                  f"{_f((h['val_kl'] or {}).get('start'), '.4f')} -> {_f((h['val_kl'] or {}).get('end'), '.4f')}, "
                  f"perplexity {h['val_ppl']['start']:.3f} -> {h['val_ppl']['end']:.3f} (original {h['val_ppl_original']:.3f}).",
              "", "Load it anywhere: `AutoModelForCausalLM.from_pretrained(\"model\")`. Reproduce: `" + r["command"] + "`."]
    return "\n".join(lines) + "\n"


def html_page(md: str) -> str:
    """report.md as one HTML page: headings, tables and paragraphs, every text escaped (`code` kept as code)."""
    parts, table, para = [], [], []

    def inline(text: str) -> str:
        return re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(text))

    def flush() -> None:
        if table:
            parts.append(markdown_table(table))
            table.clear()
        if para:
            parts.append(f"<p>{inline(' '.join(para))}</p>")
            para.clear()

    for line in md.splitlines():
        if line.startswith("|"):
            if para:
                flush()
            table.append(line)
            continue
        if table:
            flush()
        if line.startswith("#"):
            flush()
            level = len(line) - len(line.lstrip("#"))
            parts.append(f"<h{level}>{inline(line.lstrip('#').strip())}</h{level}>")
        elif line.strip():
            para.append(line.strip())
        else:
            flush()
    flush()
    title = html.escape(md.splitlines()[0].lstrip("# ")) if md else "reskip compress"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{STYLE}</style></head>"
            f"<body data-status='rendered'>{''.join(parts)}</body></html>\n")
