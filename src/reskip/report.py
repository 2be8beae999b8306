"""`reskip report RUN`: one self-contained HTML file (inline images and script, no network) + PNGs.

Reads run files only (parity.json, train_log.jsonl, summary.json, policy.json,
eval/results.json, diagnostics.json). A run with missing stages renders what exists and
says what is missing. Every figure carries a caption: what it measures, and what it does
not prove.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .io_atomic import atomic_write, atomic_write_text  # noqa: E402


def _load(path: Path):
    if not path.is_file():
        return None
    if path.suffix == ".jsonl":
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return json.loads(path.read_text())


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


# ---- figures: each returns (title, png bytes, caption) ------------------------------------------
def fig_training(log):
    trains = [r for r in log if r["kind"] == "train"]
    evals = [r for r in log if r["kind"] == "eval"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    steps = [r["step"] for r in trains]
    for key in ("loss", "ce", "kl", "entropy"):
        axes[0].plot(steps, [r[key] for r in trains], label=key)
    axes[0].set_xlabel("step"); axes[0].set_title("loss terms (train batches)"); axes[0].legend()
    ax2 = axes[1]
    ax2.plot(steps, [r["c"] for r in trains], color="tab:orange", label="c(t)")
    ax2.plot(steps, [r["lr"] / max(r2["lr"] for r2 in trains) for r in trains], color="tab:gray", label="lr / max lr")
    ax2.set_xlabel("step"); ax2.set_title("gate curriculum c(t) and learning rate"); ax2.legend()
    if evals:
        blocks = sorted(evals[-1]["entropy"], key=int)
        for n in blocks:
            line, = axes[2].plot([e["step"] for e in evals], [e["entropy"][n] for e in evals], marker="o", label=f"block {n}")
            axes[2].axhline(evals[-1]["entropy_max"][n], color=line.get_color(), ls=":", lw=0.8)
        axes[2].set_xlabel("step"); axes[2].set_title("alpha entropy per block (dotted: log n)"); axes[2].legend(fontsize=7)
    caption = ("Training loss terms per step, the gate curriculum c(t), and the validation entropy of each router's alpha "
               "against its maximum log n. Measures optimisation progress on this run's data; a falling loss does not "
               "show that blocks became skippable (see A(n)) or that routing is meaningful (see the ablations).")
    return "Training curves", _png(fig), caption


def fig_routing(mean_alpha, n_blocks):
    import numpy as np

    m = np.full((n_blocks - 1, n_blocks), np.nan)
    for n, row in mean_alpha.items():
        m[int(n) - 2, : len(row)] = row
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    im = ax.imshow(m, cmap="viridis", vmin=0, vmax=1)
    ax.set_xticks(range(n_blocks), [f"h{i}" for i in range(n_blocks)])
    ax.set_yticks(range(n_blocks - 1), [f"block {n}" for n in range(2, n_blocks + 1)])
    ax.set_xlabel("source state"); ax.set_ylabel("target block (router)")
    for (i, j), v in np.ndenumerate(m):
        if not np.isnan(v):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="w" if v < 0.5 else "k")
    fig.colorbar(im, ax=ax, label="mean alpha")
    caption = ("Mean routing weight alpha_{i->n} (source h_i, target block n) on the calibration split. It measures each "
               "source's influence inside one router, for these tokens; it does not say what a block computes, and the "
               "residual path carries h_{n-1} whatever alpha says.")
    return "Routing heatmap", _png(fig), caption


def fig_importance(policy):
    blocks = policy["blocks"]
    ns = [b["block"] for b in blocks]
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    ax.bar([n - 0.2 for n in ns], [b["A"] for b in blocks], width=0.4, label="A(n) ablation cost", color="tab:red")
    ax.axhline(1 + policy["delta"], color="tab:red", ls="--", lw=0.8, label=f"1 + delta = {1 + policy['delta']:.2f}")
    ax.set_yscale("log"); ax.set_xlabel("block"); ax.set_ylabel("A(n) = PPL(block n -> identity) / PPL(full)")
    ax2 = ax.twinx()
    ax2.bar([n + 0.2 for n in ns], [b["I"] or 0 for b in blocks], width=0.4, label="I(n) routing importance", color="tab:blue")
    ax2.set_ylim(0, 1); ax2.set_ylabel("I(n) = max_l E[alpha_{n->l}]")
    ax.legend(loc="upper left", fontsize=8); ax2.legend(loc="upper right", fontsize=8)
    caption = ("Ablation cost A(n) beside routing importance I(n), per block, on the calibration split. A(n) is the test "
               "that can refute 'block n matters'; I(n) alone cannot (a low-routing block may still carry load through "
               "the residual path). Blocks under the dashed line are eligible for skipping.")
    return "I(n) vs A(n)", _png(fig), caption


def fig_thresholds(policy):
    import numpy as np

    routed = [b for b in policy["blocks"] if b.get("histogram")]
    cols = min(4, len(routed))
    rows = -(-len(routed) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.6 * rows), squeeze=False)
    edges = np.linspace(0, 1, 21)
    for ax, b in zip(axes.flat, routed):
        ax.bar(edges[:-1], b["histogram"], width=0.05, align="edge", color="tab:blue" if b["eligible"] else "tab:gray")
        ax.axvline(b["tau"], color="tab:orange", lw=1.5)
        ax.set_title(f"block {b['block']} ({'eligible' if b['eligible'] else 'not eligible'})", fontsize=9)
        ax.set_xlim(0, 1)
    for ax in list(axes.flat)[len(routed):]:
        ax.axis("off")
    fig.supxlabel(f"w_recent(n): mean alpha_(n-1 -> n) over the last {policy['window']} tokens; orange: tau_n "
                  f"(quantile {policy['quantile']})", fontsize=9)
    caption = ("Calibration distribution of w_recent(n) per block and the threshold tau_n read off it. A step skips block n "
               "when w_recent(n) > tau_n, n is eligible and fewer than max_skips blocks were skipped. The distribution is "
               "a property of the calibration text; other text (another domain or modality) needs recalibration.")
    return "Thresholds and w_recent distributions", _png(fig), caption


def fig_token_view(trace):
    steps = trace["steps"]
    tokens = trace["tokens"]
    eligible = trace["eligible"] or sorted({int(n) for n in trace["tau"]})
    n = eligible[0] if eligible else int(sorted(trace["tau"], key=int)[len(trace["tau"]) // 2])
    w = [s["w_recent"].get(str(n)) for s in steps]
    skipped = [len(s["skipped"]) for s in steps]
    fig, (ax0, ax1) = plt.subplots(2, 1, figsize=(14, 4.8), gridspec_kw={"height_ratios": [1, 1.3]})
    ax0.plot(range(len(w)), w, color="k", lw=1)
    ax0.scatter(range(len(w)), w, c=["tab:orange" if n in s["skipped"] else "k" for s in steps], s=14, zorder=3)
    ax0.axhline(trace["tau"][str(n)], ls="--", color="tab:orange", label=f"tau_{n}")
    ax0.set_ylabel(f"w_recent({n})"); ax0.legend(fontsize=8); ax0.set_xlim(-0.5, len(w) - 0.5)
    cmap = plt.get_cmap("Oranges")
    top = max(1, max(skipped))
    x = 0.0
    for tok_text, k in zip(tokens, skipped):
        label = tok_text.replace("\n", "\\n") or " "
        width = max(0.6, 0.13 * len(label))
        if x + width > 60:
            break
        ax1.add_patch(plt.Rectangle((x, 0), width, 1, color=cmap(0.15 + 0.8 * k / top)))
        ax1.text(x + width / 2, 0.5, label, ha="center", va="center", fontsize=6, rotation=90)
        x += width
    ax1.set_xlim(0, max(x, 1)); ax1.set_ylim(0, 1); ax1.axis("off")
    ax1.set_title("tokens coloured by blocks skipped at their step (darker: more)", fontsize=9)
    caption = (f"A sample test text decoded one token per step with the ReSkip policy: top, w_recent of block {n} against "
               f"its threshold (orange dots: steps that skipped it); bottom, each token coloured by how many blocks its "
               "step skipped. One text, one policy: an illustration of the rule at work, not evidence that skipped "
               "tokens are 'easy' (the evaluation table measures the cost).")
    return "Per-token skip view", _png(fig), caption


def fig_dilution(d):
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    ax.plot(d["layers"], d["energy_ratio"], marker=".", label="|h0|^2 / |h_l|^2 (measured)")
    ax.plot(d["layers"], d["cos2"], marker=".", label="cos^2(h0, h_l) (measured)")
    ax.plot(d["layers"], d["toy_model"], ls="--", color="k", label="toy model 1 / (1 + 0.25 l)")
    for e in d["block_ends"]:
        ax.axvline(e, color="gray", lw=0.5, ls=":")
    ax.set_yscale("log"); ax.set_xlabel("layer l"); ax.set_ylabel("share of h0"); ax.legend(fontsize=8)
    caption = ("Share of the embedding state h0 in each later residual state of the frozen backbone (mean over test "
               "tokens, first token excluded), beside the source document's toy model (orthogonal contributions of norm "
               "0.5). Dotted lines: block boundaries. Measures how diluted h0 is; says nothing about whether later "
               "layers need it.")
    return "Dilution of h0", _png(fig), caption


def fig_memory(mem):
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
    for ax, table, title in ((axes[0], mem["this_model"][0], "this model"), (axes[1], mem["seed_instance"], "48 layers, d=4096 (seed)")):
        names = [r["granularity"] for r in table["rows"]]
        ax.barh(names, [r["mib"] for r in table["rows"]], color="tab:green")
        for i, r in enumerate(table["rows"]):
            ax.text(r["mib"], i, f" {r['mib']:.1f} MiB ({r['states']} states)", va="center", fontsize=8)
        ax.set_xscale("log"); ax.set_title(f"{title}: {table['context']} tokens, {table['dtype_bytes']} bytes/value", fontsize=9)
    caption = ("Memory of keeping depth states (context x d x bytes per state) at each granularity, computed for this model "
               "and for the source document's 48-layer instance. Coarser granularity costs less and can no longer address "
               "the states between kept ones (see the table below).")
    return "Depth-state memory", _png(fig), caption


def fig_frontier(results):
    fig, ax = plt.subplots(figsize=(7.5, 4))
    groups = {}
    for f in results["frontier"]:
        kind = f["method"].split(":")[0]
        groups.setdefault(kind, []).append(f)
    for kind, pts in groups.items():
        pts = sorted(pts, key=lambda p: p["flops_executed_share"])
        ax.plot([p["flops_executed_share"] for p in pts], [p["ppl_ratio"] for p in pts], marker="o",
                ls="-" if kind == "reskip" else "", label=kind)
    ax.set_xlabel("share of layer FLOPs executed"); ax.set_ylabel("perplexity / backbone")
    ax.invert_xaxis(); ax.legend(fontsize=8)
    caption = ("Quality against compute on the test split: each point a method or operating point. Lower-left is better. "
               "FLOPs are not wall-clock (see benchmarks/speed.py); the test split is small, so differences of a few "
               "percent are within noise.")
    return "Quality vs blocks executed", _png(fig), caption


# ---- page ---------------------------------------------------------------------------------------
STYLE = """body{font-family:system-ui,sans-serif;max-width:1150px;margin:2em auto;padding:0 1em;color:#222}
figure{margin:1.5em 0}img{max-width:100%}figcaption{color:#555;font-size:.9em}
table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}
.missing{background:#fff4e5;border-left:4px solid #f0a030;padding:.5em 1em}.bad{color:#b00}"""
SCRIPT = """window.addEventListener('load',function(){var imgs=document.querySelectorAll('img');var ok=0;
imgs.forEach(function(i){if(i.complete&&i.naturalWidth>0){ok++}});
document.body.setAttribute('data-figures',ok+'/'+imgs.length);
document.body.setAttribute('data-status',ok===imgs.length?'rendered':'broken');});"""


def _table(rows: list[dict], cols: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return ", ".join(_fmt(x) for x in v[:12]) + (" ..." if len(v) > 12 else "")
    return "-" if v is None else str(v)


def build_report(run_dir: Path, out: Path | None = None) -> Path:
    run_dir = Path(run_dir)
    out = Path(out) if out else run_dir / "report"
    files = {name: _load(run_dir / name) for name in
             ("parity.json", "train_log.jsonl", "summary.json", "policy.json", "diagnostics.json")}
    files["eval"] = _load(run_dir / "eval" / "results.json")
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
        sections.append("<h3>Routing health</h3>" + _table(diag["routing_health"], ["block", "entropy", "entropy_max", "entropy_ratio", "alpha_on_prev", "status"]))
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
        add_figure(fig_frontier(ev))
    else:
        missing.append("evaluation (reskip eval)")
    notes = "".join(f"<li>{html.escape(m)}</li>" for m in missing)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>reskip report: {html.escape(run_dir.name)}</title>"
            f"<style>{STYLE}</style></head><body><h1>reskip report: {html.escape(run_dir.name)}</h1>"
            + (f"<div class='missing'><b>Missing stages</b> (not rendered):<ul>{notes}</ul></div>" if missing else "")
            + "".join(sections) + f"<script>{SCRIPT}</script></body></html>")
    atomic_write_text(out / "report.html", page)
    return out / "report.html"
