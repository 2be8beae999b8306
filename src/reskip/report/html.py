"""`reskip report RUN`: one self-contained HTML file (inline images and script, no network) + PNGs.

Reads run files only (parity.json, train_log.jsonl, summary.json, policy.json,
eval/results.json, diagnostics.json, experiments/*/results.json). A run with missing stages renders what exists and
says what is missing. Every figure carries a caption: what it measures, and what it does
not prove.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from ..io_atomic import atomic_write, atomic_write_text
from ..runs import RunFolder
from ..train.log import read_log
from .experiments import experiment_sections
from .tables import html_table as _table
from .tables import fmt as _fmt
from .figures import (fig_dilution, fig_frontier, fig_importance, fig_memory, fig_routing, fig_signal_test,
                      fig_thresholds, fig_token_view, fig_training)


def _load(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


# ---- page ---------------------------------------------------------------------------------------
STYLE = """body{font-family:system-ui,sans-serif;max-width:1150px;margin:2em auto;padding:0 1em;color:#222}
figure{margin:1.5em 0}img{max-width:100%}figcaption{color:#555;font-size:.9em}
table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}
.missing{background:#fff4e5;border-left:4px solid #f0a030;padding:.5em 1em}.bad{color:#b00}"""
SCRIPT = """window.addEventListener('load',function(){var imgs=document.querySelectorAll('img');var ok=0;
imgs.forEach(function(i){if(i.complete&&i.naturalWidth>0){ok++}});
document.body.setAttribute('data-figures',ok+'/'+imgs.length);
document.body.setAttribute('data-status',ok===imgs.length?'rendered':'broken');});"""


def build_report(run_dir: Path, out: Path | None = None) -> Path:
    run_dir = Path(run_dir)
    run = RunFolder(run_dir)
    out = Path(out) if out else run.report_dir
    files = {"parity.json": _load(run.parity), "train_log.jsonl": read_log(run.train_log),
             "summary.json": _load(run.summary), "policy.json": _load(run.policy),
             "diagnostics.json": _load(run.diagnostics), "eval": _load(run.results)}
    sections, missing, figures = [], [], []

    def add_figure(made):
        title, png, caption = made
        name = title.lower().replace(" ", "_").replace("(", "").replace(")", "").replace("/", "")
        atomic_write(out / f"{name}.png", lambda tmp: Path(tmp).write_bytes(png))
        figures.append(name)
        b64 = base64.b64encode(png).decode()
        sections.append(f"<h2>{html.escape(title)}</h2><figure><img alt='{html.escape(title)}' "
                        f"src='data:image/png;base64,{b64}'><figcaption>{html.escape(caption)}</figcaption></figure>")

    p = files["parity.json"]
    if p:
        sections.append("<h2>Parity and parameters</h2>" + _table(p["parity"], ["dtype", "max_abs_diff", "equal", "tokens", "padded_rows"])
                        + "<p>" + html.escape(f"Side-channel: {p['params']['new_params']:,} parameters = "
                                              f"{p['params']['percent']:.3f}% of {p['params']['backbone_params']:,} "
                                              f"(rank {p['params']['rank']}, {p['params']['n_blocks']} blocks).") + "</p>"
                        + "<p>Parity: at c = 0 the logits equal the backbone's bit for bit. It proves the retrofit starts "
                          "from the backbone; it says nothing about the trained model.</p>")
    else:
        missing.append("parity (reskip run, stage parity)")
    log = files["train_log.jsonl"]
    if log:
        add_figure(fig_training(log))
        s = files["summary.json"]
        if s:
            sections.append("<p>" + html.escape(
                f"Validation perplexity: backbone {s['ppl_backbone']:.3f}; retrofit {s['ppl_full']['start']:.3f} -> "
                f"{s['ppl_full']['end']:.3f} after {s['steps']} steps ({s['tokens_seen']:,} tokens).") + "</p>")
    else:
        missing.append("training (reskip train)")
    pol = files["policy.json"]
    if pol:
        add_figure(fig_routing(pol["mean_alpha"], len(pol["blocks"])))
        add_figure(fig_importance(pol))
        add_figure(fig_thresholds(pol))
        sections.append(_table(pol["blocks"], ["block", "layers", "A", "I", "cos_in_out", "tau", "quantile", "eligible"]))
        budgets = pol.get("budgets")
        if budgets and budgets.get("frontier"):
            rows = []
            for p in budgets["frontier"]:
                st = p["candidates"].get("static")
                rows.append({"budget": p["budget"], "chosen": p["chosen"], "mean_skipped": p["measured"]["mean_skipped"],
                             "ppl / full": p["measured"]["ppl_ratio"],
                             "static ppl / full": st["measured"]["ppl_ratio"] if st else None,
                             "blocks (share of steps skipped)": ", ".join(
                                 f"{n}: {b['fraction']:.2f}" + ("" if b["tau"] is None else f" (tau {b['tau']:.4f})")
                                 for n, b in p["blocks"].items())})
            sections.append("<h3>Budget frontier (calibration split)</h3>" + _table(rows, list(rows[0]))
                            + f"<p>Per target budget (blocks skipped per step on average, steps of "
                              f"{budgets['chunk_size']} tokens), the allocation of lowest measured calibration loss: "
                              "the greedy allocation by the signal, or static pruning at the same budget, each measured "
                              "as reskip eval runs it. These are calibration figures: the test split is in the "
                              "evaluation below.</p>")
    else:
        missing.append("calibration (reskip calibrate)")
    diag = files["diagnostics.json"]
    if diag:
        if diag.get("sample_trace"):
            add_figure(fig_token_view(diag["sample_trace"]))
        add_figure(fig_dilution(diag["dilution"]))
        add_figure(fig_memory(diag["memory"]))
        sections.append("<h3>What each granularity can no longer address</h3>"
                        + _table(diag["memory"]["this_model"][0]["rows"], ["granularity", "states", "mib", "not_addressable", "cannot_ask"]))
        sections.append("<h3>Routing health</h3>" + _table(diag["routing_health"], [
            "block", "entropy", "entropy_max", "entropy_ratio", "alpha_on_prev", "top_source", "alpha_prev_std",
            "w_recent_p05", "w_recent_p95", "w_recent_range", "status"])
            + "<p>Spread of alpha_{n-1->n} and w_recent(n) over the test tokens. FLAT, COLLAPSED (on h_{n-1} or an "
              "earlier state) and INPUT-INDEPENDENT (w_recent's 5-95% range under 0.02) are failures of the "
              "routing, not successes.</p>")
        st = diag.get("signal_test")
        if st:
            add_figure(fig_signal_test(st))
            rows = [{"block": r["block"], "A": r.get("A"), "I": r.get("I"), "p": r["p"],
                     **{f"ppl/full {c}": v for c, v in r["ppl_ratio"].items()},
                     "signal - random": r["signal_minus_random"]["mean"], "95% CI": [r["signal_minus_random"]["lo"],
                                                                                      r["signal_minus_random"]["hi"]],
                     **{f"captured by {c}": v for c, v in r.get("captured", {"signal": r["captured_share"]}).items()},
                     "verdict": r["verdict"]} for r in st["blocks"]]
            sections.append(_table(rows, list(rows[0])) + "<p><b>What this licenses:</b> "
                            + html.escape(st["sentence"]) + "</p>")
        rd = diag.get("reading_discipline")
        if rd:
            sections.append("<h3>Reading discipline</h3><p>" + html.escape(
                f"Spearman rank correlation of I(n) and A(n): {_fmt(rd['spearman_I_vs_A'])}. {rd['note']}") + "</p>"
                + _table(rd["claims"], ["block", "claim", "refuting_ablation", "verdict"]))
    else:
        missing.append("diagnostics (reskip diagnose)")
    ev = files["eval"]
    if ev:
        rows = [{"method": k, **v} for k, v in ev["methods"].items()]
        sections.append("<h2>Evaluation</h2>" + _table(rows, ["method", "ppl", "ppl_ratio", "top1_agreement", "kl_to_backbone",
                                                              "mean_skipped", "flops_executed_share", "margin_holds_share",
                                                              "top1_change_rate_where_margin_holds"]))
        if ev.get("multiple_choice"):
            mc_rows = [{"method": m, "benchmark": b, **r} for m, bs in ev["multiple_choice"].items() for b, r in bs.items()]
            sections.append("<h3>Multiple choice (log-likelihood)</h3>" + _table(mc_rows, ["method", "benchmark", "acc", "acc_norm", "chance", "n"]))
        held = ev.get("heldout")
        if held:
            rows = [{"method": k, "ppl": v["ppl"], "ppl_ratio": v["ppl_ratio"],
                     "in-domain ppl_ratio": ev["methods"].get(k, {}).get("ppl_ratio"), "mean_skipped": v["mean_skipped"],
                     "in-domain mean_skipped": ev["methods"].get(k, {}).get("mean_skipped")}
                    for k, v in held["methods"].items()]
            sections.append(f"<h3>Policy drift: the held-out source ({html.escape(', '.join(held['data']))})</h3>"
                            + _table(rows, list(rows[0]))
                            + "<p>The same methods on a source kept out of training and calibration, with the "
                              "thresholds calibrated on the run's data: a skip rate or a ratio that moves here is the "
                              "deployment-specific drift of the thresholds.</p>")
        add_figure(fig_frontier(ev))
    else:
        missing.append("evaluation (reskip eval)")
    for title, png, caption, body in experiment_sections(run.experiments_dir):
        sections.append(body)
        if png is not None:
            add_figure((title, png, caption))
    notes = "".join(f"<li>{html.escape(m)}</li>" for m in missing)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>reskip report: {html.escape(run_dir.name)}</title>"
            f"<style>{STYLE}</style></head><body><h1>reskip report: {html.escape(run_dir.name)}</h1>"
            + (f"<div class='missing'><b>Missing stages</b> (not rendered):<ul>{notes}</ul></div>" if missing else "")
            + "".join(sections) + f"<script>{SCRIPT}</script></body></html>")
    atomic_write_text(out / "report.html", page)
    return out / "report.html"
