"""report.json -> report.md and report.html: what `reskip compress` made and how close it is to the original (reads
the report only). The page is self-contained (no script or file it loads) and says it rendered (`data-status`)."""

from __future__ import annotations

import html
import re

from ..html_tables import markdown_table

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


# What a user behind a chat endpoint should see of the compressed model: the goals its replies are read against
GOALS = {"same_sentence": 0.5, "first32": 1 / 3, "new_loop": 0.05}


def _share(x: dict, n: int) -> str:
    return f"{round(x['mean'] * n)} of {n} ({100 * x['mean']:.0f}% [{100 * x['lo']:.0f}, {100 * x['hi']:.0f}])"


def _cell(text: str, limit: int = 260) -> str:
    text = " ".join(text.replace("|", "\\|").split())
    return text if len(text) <= limit else text[:limit].rstrip() + " ..."


def chat_section(c: dict, side_by_side: int = 8) -> list[str]:
    """The verdict in words on the original's own chat replies, the goals, and prompts side by side."""
    row, n = c["methods"]["compressed"], c["prompts"]
    met = {"same_sentence": row["same_sentence"]["mean"] >= GOALS["same_sentence"],
           "first32": row["first32"]["mean"] >= GOALS["first32"], "new_loop": row["new_loop"]["mean"] <= GOALS["new_loop"]}
    verdict = ("It answers as the original does on most prompts." if all(met.values()) else
               "It does not yet answer as the original does: " + "; ".join(
                   what for key, what in (("same_sentence", "the first sentence differs too often"),
                                          ("first32", "the first 32 tokens differ too often"),
                                          ("new_loop", "it loops where the original does not")) if not met[key]) + ".")
    lines = ["## Does it answer as the original does?", "",
             f"On {n} held-out chat prompts (`{c['prompt_set']}` set, sha256 {c['sha256'][:12]}; the first sixteen "
             "written by hand, the rest requests the original wrote itself), each model answering greedily through "
             f"the chat template ({c['max_new_tokens']} new tokens, {c['dtype']}), the compressed model writes the "
             f"original's first sentence on {_share(row['same_sentence'], n)}, its first 32 tokens on "
             f"{_share(row['first32'], n)}, and the same reply throughout on {_share(row['identical'], n)}; it falls "
             f"into a loop the original's reply does not have on {_share(row['new_loop'], n)} (the original's own "
             f"replies loop on {c['original_loops']} of {n}). Per reply token, teacher-forced on the original's "
             f"replies, it is at KL {row['kl']['mean']:.3f} [{row['kl']['lo']:.3f}, {row['kl']['hi']:.3f}] from the "
             f"original with top-1 agreement {row['top1']['mean']:.3f}. {verdict}", "",
             "| goal | measured | met |", "| --- | --- | --- |",
             f"| the same first sentence on at least half of the prompts | {100 * row['same_sentence']['mean']:.0f}% | "
             f"{'yes' if met['same_sentence'] else 'no'} |",
             f"| the first 32 tokens equal on at least a third | {100 * row['first32']['mean']:.0f}% | "
             f"{'yes' if met['first32'] else 'no'} |",
             f"| no loop the original does not have on at least 95% | {100 * (1 - row['new_loop']['mean']):.0f}% | "
             f"{'yes' if met['new_loop'] else 'no'} |", "",
             "(95% bootstrap intervals over prompts; a loop is one unit of up to 32 tokens written three times or more "
             "in a row over at least 12 tokens: `evaluate.loops`.)", "",
             f"The first {side_by_side} prompts side by side:", "",
             "| prompt | the original | compressed |", "| --- | --- | --- |"]
    lines += [f"| {_cell(p, 80)} | {_cell(a)} | {_cell(b)} |" for p, a, b in
              list(zip(c["prompt_texts"], c["original_replies"], row["replies"]))[:side_by_side]]
    return lines + [""]


def markdown(r: dict) -> str:
    b, h, m = r["blocks"], r["healing"], r["measured"]
    kept = b["layers"] - len(b["layers_removed"])
    chosen = ("named with --blocks" if b.get("chosen_by") == "named"
              else f"the cheapest by {RANKED[b.get('chosen_by', 'ppl')]} on the calibration split")
    lines = [f"# {r['settings']['model'] or 'SmolLM2-135M-Instruct'}: {b['layers']} -> {kept} layers", "",
             f"Blocks {b['removed']} removed (layers {', '.join(map(str, b['layers_removed']))}), {chosen}; the rest "
             f"healed by a LoRA of {h['parameters']:,} parameters trained by `{h['objective']}` on {h['tokens']:,} "
             f"tokens ({h['train_wall_s'] / 60:.1f} min){_data_text(h)}, merged into a plain Hugging Face folder "
             "(`model/`).", "",
             *(chat_section(m["chat"]) if "chat" in m else
               [f"Chat replies: not measured ({m['chat_skipped']}).", ""] if "chat_skipped" in m else []),
             *_blocks_table(b), "",
             "## Fidelity to the original on raw text, perplexity beside it", "",
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
    if "generation" in m:  # reports written before the chat measure
        g = m["generation"]
        lines += ["", f"Greedy generation of {g['prompts']} fixed prompts (chat template): "
                      f"{g['prefix_share']:.3f} of each continuation equal to the original's before the first "
                      f"divergence, the same first sentence on {g['same_first_sentence']:.3f} of the prompts."]
    if "mmlu" in m:
        lines += ["", _mmlu_text(m["mmlu"])]
    if "speed" in r:
        sp = r["speed"]
        lines += ["", "## Speed in transformers (tokens per second, median of interleaved repeats)", "",
                  f"FLOP-ideal speed-up {sp['flop_ideal_speedup']:.3f}x (every layer's weights and the LM head per "
                  f"token); {sp['threads']} threads.", "",
                  "| case | original | compressed | speed-up | rounds (min / median / max) | share of the FLOP-ideal |",
                  "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {name} | {c['original_tokens_per_s']:.1f} | {c['compressed_tokens_per_s']:.1f} | "
                  f"{c['speedup']:.3f}x | {_rounds(c.get('speedup_rounds'))} | {c['share_of_ideal']:.3f} |"
                  for name, c in sp["cases"].items()]
        load = sp.get("load") or {}
        if load.get("load_before") is not None:
            lines += ["", f"Load average {load['load_before']:.2f} before and {load['load_after']:.2f} after, on "
                          f"{load['cores']} cores. " + (f"**Not readable:** {load['note']}." if not load["readable"]
                                                         else "The machine was otherwise quiet.")]
    lines += ["", "Validation during healing: KL to the original "
                  f"{_f((h['val_kl'] or {}).get('start'), '.4f')} -> {_f((h['val_kl'] or {}).get('end'), '.4f')}, "
                  f"perplexity {h['val_ppl']['start']:.3f} -> {h['val_ppl']['end']:.3f} (original {h['val_ppl_original']:.3f}).",
              "", "Load it anywhere: `AutoModelForCausalLM.from_pretrained(\"model\")`. Reproduce: `" + r["command"] + "`."]
    return "\n".join(lines) + "\n"


def _rounds(r: dict | None) -> str:
    return "-" if not r else f"{r['min']:.3f} / {r['median']:.3f} / {r['max']:.3f}"


def _data_text(h: dict) -> str:
    written = h.get("written") or {}
    if not written:
        return f" on {', '.join(h['data'])}" if h.get("data") else ""
    parts = [f"{w['conversations']:,} conversations the original wrote "
             + ("itself" if name == "self" else "in reply to your prompts") + f" ({w['tokens']:,} tokens)"
             for name, w in written.items()]
    text = [d for d in h.get("data", []) if d != "self" and not d.startswith("self:")]
    share = (f", {100 * sum(v for k, v in (h.get('data_weights') or {}).items() if k in written):.0f}% of the "
             f"sequences, beside {', '.join(text)}") if text else ""
    extra = f"; {h['on_policy']:g} of the steps on its own samples" if h.get("on_policy") else ""
    return f" on {' and '.join(parts)}{share}{extra}"


def _mmlu_text(mm: dict) -> str:
    mo = mm["original"]
    if "compressed" not in mm and "above_chance" in mm:
        return (f"MMLU ({mo['n']} questions, chance {mo['chance']:.2f}): the original scores {mo['acc']:.3f}, not "
                "above chance (by two standard errors), so what the compressed model keeps of it would read noise: "
                "not measured.")
    mc = mm["compressed"]
    return (f"MMLU ({mo['n']} questions, chance {mo['chance']:.2f}): original {mo['acc']:.3f}, compressed "
            f"{mc['acc']:.3f} (acc_norm {mo['acc_norm']:.3f} / {mc['acc_norm']:.3f}).")


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


def card_lines(r: dict) -> list[str]:
    """What the exported model's card says of its fidelity: the chat verdict's figures and the raw-text table."""
    m, lines = r["measured"], []
    if "chat" in m:
        c, n = m["chat"]["methods"]["compressed"], m["chat"]["prompts"]
        lines += [f"On {n} held-out chat prompts, answering greedily: the original's first sentence on "
                  f"{_share(c['same_sentence'], n)}, its first 32 tokens on {_share(c['first32'], n)}, a loop the "
                  f"original does not have on {_share(c['new_loop'], n)}; per reply token KL {c['kl']['mean']:.3f} "
                  f"to the original, top-1 agreement {c['top1']['mean']:.3f}.", ""]
    lines += ["| text | KL to the original | top-1 agreement | perplexity / original's |", "| --- | --- | --- | --- |"]
    lines += [f"| {name}{' (held out)' if name != 'test' else ''} | {s['compressed']['kl_to_backbone']:.4f} | "
              f"{s['compressed']['top1_agreement']:.4f} | {s['compressed']['ppl_ratio']:.3f} |"
              for name, s in m["splits"].items()]
    return lines
