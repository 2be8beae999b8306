"""`reskip report RUN`: one self-contained HTML file (inline images and script, no network) + PNGs.

Reads run files only (parity.json, train_log.jsonl, summary.json, policy.json,
eval/results.json, diagnostics.json, experiments/*/results.json). A run with missing stages renders what exists and
says what is missing. Every figure carries a caption: what it measures, and what it does
not prove.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from ...errors import ReskipError
from ...html_tables import fmt as _fmt
from ...html_tables import html_table as _table
from ...io_atomic import atomic_write, atomic_write_text
from ...run_folder import RunFolder
from ...run_folder.versions import read_run_file
from ...train.log import read_log
from .experiments import experiment_sections
from .figures import (
    fig_dilution,
    fig_frontier,
    fig_importance,
    fig_memory,
    fig_routing,
    fig_signal_test,
    fig_thresholds,
    fig_token_view,
    fig_training,
)
from .options import ReportOptions


def _load(path: Path):
    """A run file, or None when the stage has not run; the kinds with older versions are upgraded."""
    if not path.is_file():
        return None
    return read_run_file(path)


# ---- page ---------------------------------------------------------------------------------------
STYLE = """body{font-family:system-ui,sans-serif;max-width:1150px;margin:2em auto;padding:0 1em;color:#222}
figure{margin:1.5em 0}img{max-width:100%}figcaption{color:#555;font-size:.9em}
table{border-collapse:collapse;font-size:.85em;max-width:100%}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}
.missing{background:#fff4e5;border-left:4px solid #f0a030;padding:.5em 1em}.bad{color:#b00}"""
SCRIPT = """window.addEventListener('load',function(){var imgs=document.querySelectorAll('img');var ok=0;
imgs.forEach(function(i){if(i.complete&&i.naturalWidth>0){ok++}});
document.body.setAttribute('data-figures',ok+'/'+imgs.length);
document.body.setAttribute('data-status',ok===imgs.length?'rendered':'broken');});"""


class Page:
    """The report being built: its HTML sections in order, and every figure also written as OUT/NAME.png."""

    def __init__(self, out: Path):
        self.out, self.sections, self.figures = out, [], []

    def add(self, html_text: str) -> None:
        self.sections.append(html_text)

    def figure(self, made: tuple) -> None:
        title, png, caption = made
        name = title.lower().replace(" ", "_").replace("(", "").replace(")", "").replace("/", "")
        atomic_write(self.out / f"{name}.png", lambda tmp: Path(tmp).write_bytes(png))
        self.figures.append(name)
        b64 = base64.b64encode(png).decode()
        self.add(f"<h2>{html.escape(title)}</h2><figure><img alt='{html.escape(title)}' "
                 f"src='data:image/png;base64,{b64}'><figcaption>{html.escape(caption)}</figcaption></figure>")


def report_run(run_dir, options: ReportOptions = ReportOptions()) -> Path:
    """The run's files -> a self-contained HTML page (returned); reads run files only (no model)."""
    run_dir = Path(run_dir)
    run = RunFolder(run_dir)
    if not run_dir.is_dir():
        raise ReskipError(f"{run_dir} is not a run folder")
    stage_files = (run.parity, run.train_log, run.policy, run.diagnostics, run.results)
    if not any(p.is_file() for p in stage_files) and not run.experiments_dir.is_dir():
        raise ReskipError(f"{run_dir} holds no stage's files (parity.json, train_log.jsonl, policy.json, "
                          "diagnostics.json, eval/results.json) and no experiments/: name a run folder (reskip run, "
                          "train, or experiment --out)")
    page = Page(Path(options.out) if options.out else run.report_dir)
    missing = []
    for present, section, what in (
            (_load(run.parity), parity_section, "parity (reskip run, stage parity)"),
            (read_log(run.train_log), lambda pg, log: training_section(pg, log, _load(run.summary)),
             "training (reskip train)"),
            (_load(run.policy), policy_section, "calibration (reskip calibrate)"),
            (_load(run.diagnostics), diagnostics_section, "diagnostics (reskip diagnose)"),
            (_load(run.results), eval_section, "evaluation (reskip eval)")):
        if present:
            section(page, present)
        else:
            missing.append(what)
    for title, png, caption, body in experiment_sections(run.experiments_dir):
        page.add(body)
        if png is not None:
            page.figure((title, png, caption))
    notes = "".join(f"<li>{html.escape(m)}</li>" for m in missing)
    text = (f"<!doctype html><html><head><meta charset='utf-8'><title>reskip report: {html.escape(run_dir.name)}</title>"
            f"<style>{STYLE}</style></head><body><h1>reskip report: {html.escape(run_dir.name)}</h1>"
            + (f"<div class='missing'><b>Missing stages</b> (not rendered):<ul>{notes}</ul></div>" if missing else "")
            + "".join(page.sections) + f"<script>{SCRIPT}</script></body></html>")
    atomic_write_text(page.out / "report.html", text)
    return page.out / "report.html"


def parity_section(page: Page, p: dict) -> None:
    page.add("<h2>Parity and parameters</h2>" + _table(p["parity"], ["dtype", "max_abs_diff", "equal", "tokens", "padded_rows"])
             + "<p>" + html.escape(f"Side-channel: {p['params']['new_params']:,} parameters = "
                                   f"{p['params']['percent']:.3f}% of {p['params']['backbone_params']:,} "
                                   f"(rank {p['params']['rank']}, {p['params']['n_blocks']} blocks).") + "</p>"
             + "<p>Parity: at c = 0 the logits equal the backbone's bit for bit. It proves the retrofit starts "
               "from the backbone; it says nothing about the trained model.</p>")


def training_section(page: Page, log: list, s: dict | None) -> None:
    page.figure(fig_training(log))
    if s:
        page.add("<p>" + html.escape(
            f"Validation perplexity: backbone {s['ppl_backbone']:.3f}; retrofit {s['ppl_full']['start']:.3f} -> "
            f"{s['ppl_full']['end']:.3f} after {s['steps']} steps ({s['tokens_seen']:,} tokens).") + "</p>")


def policy_section(page: Page, pol: dict) -> None:
    page.figure(fig_routing(pol["mean_alpha"], len(pol["blocks"])))
    page.figure(fig_importance(pol))
    page.figure(fig_thresholds(pol))
    page.add(_table(pol["blocks"], ["block", "layers", "A", "I", "cos_in_out", "tau", "quantile", "eligible"]))
    budgets = pol.get("budgets")
    if not (budgets and budgets.get("frontier")):
        return
    rows = []
    for p in budgets["frontier"]:
        st = p["candidates"].get("static")
        rows.append({"budget": p["budget"], "chosen": p["chosen"], "mean_skipped": p["measured"]["mean_skipped"],
                     "ppl / full": p["measured"]["ppl_ratio"],
                     "static ppl / full": st["measured"]["ppl_ratio"] if st else None,
                     "blocks (share of steps skipped)": ", ".join(
                         f"{n}: {b['fraction']:.2f}" + ("" if b["tau"] is None else f" (tau {b['tau']:.4f})")
                         for n, b in p["blocks"].items())})
    page.add("<h3>Budget frontier (calibration split)</h3>" + _table(rows, list(rows[0]))
             + f"<p>Per target budget (blocks skipped per step on average, steps of "
               f"{budgets['chunk_size']} tokens), the allocation of lowest measured calibration loss: "
               "the greedy allocation by the signal, or static pruning at the same budget, each measured "
               "as reskip eval runs it. These are calibration figures: the test split is in the "
               "evaluation below.</p>")


def _blocks(ns: list) -> str:
    return ("block " if len(ns) == 1 else "blocks ") + ", ".join(map(str, ns))


def diagnostics_section(page: Page, diag: dict) -> None:
    if diag.get("sample_trace"):
        page.figure(fig_token_view(diag["sample_trace"]))
    page.figure(fig_dilution(diag["dilution"]))
    page.figure(fig_memory(diag["memory"]))
    page.add("<h3>What each granularity can no longer address</h3>"
             + _table(diag["memory"]["this_model"][0]["rows"], ["granularity", "states", "mib", "not_addressable", "cannot_ask"]))
    # the table names each status by its word; what each one found is said once below it
    health = diag["routing_health"]
    found = dict.fromkeys(r["status"] for r in health if ":" in r["status"])
    page.add("<h3>Routing health</h3>" + _table([{**r, "status": r["status"].split(":")[0]} for r in health], [
        "block", "entropy", "entropy_max", "entropy_ratio", "alpha_on_prev", "top_source", "alpha_prev_std",
        "w_recent_p05", "w_recent_p95", "w_recent_range", "status"])
        + "".join(f"<p class='note'>{_blocks([r['block'] for r in health if r['status'] == text])}: "
                  f"{html.escape(text)}</p>" for text in found)
        + "<p>Spread of alpha_{n-1->n} and w_recent(n) over the test tokens. FLAT, COLLAPSED (on h_{n-1} or an "
          "earlier state) and INPUT-INDEPENDENT (w_recent's 5-95% range under 0.02) are failures of the "
          "routing, not successes.</p>")
    st = diag.get("signal_test")
    if st:
        page.figure(fig_signal_test(st))
        rows = [{"block": r["block"], "A": r.get("A"), "I": r.get("I"), "p": r["p"],
                 **{f"ppl/full {c}": v for c, v in r["ppl_ratio"].items()},
                 "signal - random": r["signal_minus_random"]["mean"], "95% CI": [r["signal_minus_random"]["lo"],
                                                                                  r["signal_minus_random"]["hi"]],
                 **{f"captured by {c}": v for c, v in r.get("captured", {"signal": r["captured_share"]}).items()},
                 "verdict": r["verdict"]} for r in st["blocks"]]
        page.add(_table(rows, list(rows[0])) + "<p><b>What this licenses:</b> " + html.escape(st["sentence"]) + "</p>")
    rd = diag.get("reading_discipline")
    if rd:
        page.add("<h3>Reading discipline</h3><p>" + html.escape(
            f"Spearman rank correlation of I(n) and A(n): {_fmt(rd['spearman_I_vs_A'])}. {rd['note']}") + "</p>"
            + _table(rd["claims"], ["block", "claim", "refuting_ablation", "verdict"]))


def eval_section(page: Page, ev: dict) -> None:
    rows = [{"method": k, **v} for k, v in ev["methods"].items()]
    page.add("<h2>Evaluation</h2>" + _table(rows, ["method", "ppl", "ppl_ratio", "top1_agreement", "kl_to_backbone",
                                                   "mean_skipped", "flops_executed_share", "margin_holds_share",
                                                   "top1_change_rate_where_margin_holds"]))
    if ev.get("multiple_choice"):
        mc_rows = [{"method": m, "benchmark": b, **r} for m, bs in ev["multiple_choice"].items() for b, r in bs.items()]
        page.add("<h3>Multiple choice (log-likelihood)</h3>" + _table(mc_rows, ["method", "benchmark", "acc", "acc_norm", "chance", "n"]))
    held = ev.get("heldout")
    if held:
        rows = [{"method": k, "ppl": v["ppl"], "ppl_ratio": v["ppl_ratio"],
                 "in-domain ppl_ratio": ev["methods"].get(k, {}).get("ppl_ratio"), "mean_skipped": v["mean_skipped"],
                 "in-domain mean_skipped": ev["methods"].get(k, {}).get("mean_skipped")}
                for k, v in held["methods"].items()]
        page.add(f"<h3>Policy drift: the held-out source ({html.escape(', '.join(held['data']))})</h3>"
                 + _table(rows, list(rows[0]))
                 + "<p>The same methods on a source kept out of training and calibration, with the "
                   "thresholds calibrated on the run's data: a skip rate or a ratio that moves here is the "
                   "deployment-specific drift of the thresholds.</p>")
    page.figure(fig_frontier(ev))
