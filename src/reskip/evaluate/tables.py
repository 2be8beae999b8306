"""results.json -> a Markdown table (reads the results only)."""

from __future__ import annotations


def _f(x, fmt):
    return "-" if x is None else format(x, fmt)


def _ci(x: dict, fmt: str) -> str:
    return f"{format(x['mean'], fmt)} [{format(x['lo'], fmt)}, {format(x['hi'], fmt)}]"


def markdown(results: dict) -> str:
    methods = results["methods"]
    mc_names = sorted({b for r in results.get("multiple_choice", {}).values() for b in r})
    head = ["method", "ppl", "ppl / backbone", "top-1 agree", "KL to backbone", "blocks skipped / step",
            "layer FLOPs executed", "2 eps < Delta", "top-1 change where it holds"]
    head += [f"{b} acc (chance)" for b in mc_names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in methods.items():
        row = [name + (" (matched)" if r.get("matched") else ""), _f(r["ppl"], ".3f"), _f(r["ppl_ratio"], ".4f"),
               _f(r["top1_agreement"], ".4f"), _f(r["kl_to_backbone"], ".4f"), _f(r["mean_skipped"], ".2f"),
               _f(r["flops_executed_share"], ".3f"), _f(r["margin_holds_share"], ".3f"),
               _f(r["top1_change_rate_where_margin_holds"], ".4f")]
        for b in mc_names:
            m = results.get("multiple_choice", {}).get(name, {}).get(b)
            row.append("-" if m is None else f"{m['acc']:.3f} ({m['chance']:.2f})")
        lines.append("| " + " | ".join(row) + " |")
    meta = results["meta"]
    lines.append("")
    lines.append(f"Test split: {meta['sequences']} sequences x {meta['seq_len']} tokens, each making its own skip "
                 f"decisions in chunks of {meta['chunk_size']} tokens (one step per chunk), window W = {meta['window']}. "
                 "eps = max |logit change| from skipping vs the retrofit without skipping; Delta = its top-1 minus "
                 "top-2 logit. Multiple choice: log-likelihood, one step per scored sequence.")
    gen = results.get("generation")
    if gen:
        lines += ["", f"Greedy generation of {gen['prompts']} fixed chat prompts ({gen['max_new_tokens']} new tokens) "
                      "beside the backbone's:", "",
                  "| method | share of tokens before the first divergence | same first sentence |", "|---|---|---|"]
        lines += [f"| {name} | {g['prefix_share']:.3f} | {g['same_first_sentence']:.3f} |"
                  for name, g in gen["methods"].items()]
    chat = results.get("chat")
    if chat:
        lines += ["", f"Chat fidelity: {chat['prompts']} held-out chat prompts (`{chat['prompt_set']}` set), on the "
                      f"original's own greedy replies ({chat['max_new_tokens']} new tokens, {chat['dtype']}; "
                      f"{chat['original_loops']} of them loop); 95% intervals over prompts:", "",
                  "| method | reply KL | reply top-1 | reply before divergence | first 32 equal | same first sentence | "
                  "new loops |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {name} | {_ci(c['kl'], '.4f')} | {_ci(c['top1'], '.4f')} | {c['prefix']['mean']:.3f} | "
                  f"{c['first32']['mean']:.3f} | {c['same_sentence']['mean']:.3f} | {c['new_loop']['mean']:.3f} |"
                  for name, c in chat["methods"].items()]
    held = results.get("heldout")
    if held:
        lines += ["", f"Held-out source ({', '.join(held['data'])}: kept out of training and calibration; the policy as "
                      f"calibrated on the run's data), {held['sequences']} sequences of its test split:", "",
                  "| method | ppl | ppl / backbone | in-domain ppl / backbone | blocks skipped / step | "
                  "in-domain blocks skipped / step | top-1 agree |", "|---|---|---|---|---|---|---|"]
        for name, r in held["methods"].items():
            own = methods.get(name, {})
            lines.append(f"| {name}{' (matched)' if r.get('matched') else ''} | {_f(r['ppl'], '.3f')} | "
                         f"{_f(r['ppl_ratio'], '.4f')} | {_f(own.get('ppl_ratio'), '.4f')} | {_f(r['mean_skipped'], '.2f')} | "
                         f"{_f(own.get('mean_skipped'), '.2f')} | {_f(r['top1_agreement'], '.4f')} |")
    return "\n".join(lines) + "\n"
