"""The report's figures: each `fig_*` takes run-file content and returns (title, PNG bytes, caption).

The caption says what the figure measures and what it does not prove. Rendered with matplotlib's
Agg backend (no display, no network).
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from ...train.log import records  # noqa: E402


def _legend_below(ax, ncol: int = 4, handles=None, labels=None) -> None:
    """A legend under the axes, off the data (the saved figure's bounds take it in)."""
    args = (handles, labels) if handles is not None else ()
    ax.legend(*args, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol, fontsize=8, frameon=False)


def _legend_right(ax, handles=None, labels=None, ncol: int = 1) -> None:
    """A legend right of the axes, off the data."""
    args = (handles, labels) if handles is not None else ()
    ax.legend(*args, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False, ncol=ncol)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


# ---- figures: each returns (title, png bytes, caption) ------------------------------------------
def fig_training(log):
    trains, evals = records(log, "train"), records(log, "eval")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), constrained_layout=True)
    steps = [r["step"] for r in trains]
    for key in ("loss", "ce", "kl", "entropy"):
        axes[0].plot(steps, [r[key] for r in trains], label=key)
    axes[0].set_xlabel("step"); axes[0].set_title("loss terms (train batches)"); _legend_below(axes[0])
    ax2 = axes[1]
    ax2.plot(steps, [r["c"] for r in trains], color="tab:orange", label="c(t)")
    ax2.plot(steps, [r["lr"] / max(r2["lr"] for r2 in trains) for r in trains], color="tab:gray", label="lr / max lr")
    ax2.set_xlabel("step"); ax2.set_title("gate curriculum c(t) and learning rate"); _legend_below(ax2)
    if evals:
        blocks = sorted(evals[-1]["entropy"], key=int)
        for n in blocks:
            line, = axes[2].plot([e["step"] for e in evals], [e["entropy"][n] for e in evals], marker="o", label=f"block {n}")
            axes[2].axhline(evals[-1]["entropy_max"][n], color=line.get_color(), ls=":", lw=0.8)
        axes[2].set_xlabel("step"); axes[2].set_title("alpha entropy per block (dotted: log n)")
        _legend_below(axes[2], ncol=4)
    caption = ("Training loss terms per step, the gate curriculum c(t), and the validation entropy of each router's alpha "
               "against its maximum log n. Measures optimisation progress on this run's data; a falling loss does not "
               "show that blocks became skippable (see A(n)) or that routing is meaningful (see the ablations).")
    return "Training curves", _png(fig), caption


def fig_routing(mean_alpha, n_blocks):
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
    (h1, l1), (h2, l2) = ax.get_legend_handles_labels(), ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="lower center", bbox_to_anchor=(0.5, 1.02), ncol=3, fontsize=8, frameon=False)
    caption = ("Ablation cost A(n) beside routing importance I(n), per block, on the calibration split. A(n) is the test "
               "that can refute 'block n matters'; I(n) alone cannot (a low-routing block may still carry load through "
               "the residual path). Blocks under the dashed line are eligible for skipping.")
    return "I(n) vs A(n)", _png(fig), caption


def fig_thresholds(policy):
    routed = [b for b in policy["blocks"] if b.get("histogram")]
    cols = min(4, len(routed))
    rows = -(-len(routed) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.8 * rows), squeeze=False, constrained_layout=True)
    grid = np.linspace(0, 1, 101)
    for ax, b in zip(axes.flat, routed):
        # the distribution as its quantile curve (101 stored quantiles), on an axis fitted to this block's values:
        # w_recent spans a few hundredths, so a 0-1 axis would show a single spike
        q = np.asarray(b["w_recent_quantiles"], dtype=float)
        ax.plot(q, grid, color="tab:blue" if b["eligible"] else "tab:gray", lw=1.5)
        ax.axvline(b["tau"], color="tab:orange", lw=1.5)
        pad = max(1e-4, 0.1 * (q[-1] - q[0]))
        ax.set_xlim(q[0] - pad, q[-1] + pad); ax.set_ylim(0, 1)
        ax.tick_params(axis="x", labelsize=7, labelrotation=30)
        ax.set_title(f"block {b['block']} ({'eligible' if b['eligible'] else 'not eligible'}), "
                     f"width {q[-1] - q[0]:.3f}", fontsize=9)
    for ax in list(axes.flat)[len(routed):]:
        ax.axis("off")
    fig.supxlabel(f"w_recent(n): mean alpha_(n-1 -> n) over the last {policy['window']} tokens; orange: tau_n "
                  f"(quantile {policy['quantile']})", fontsize=9)
    fig.supylabel("share of steps with w_recent(n) <= x", fontsize=9)
    caption = ("Calibration distribution of w_recent(n) per block (the share of steps at or below each value; each axis "
               "spans that block's own values, its width in the title) and the threshold tau_n read off it. A step skips block n "
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
    fig, (ax0, ax1) = plt.subplots(2, 1, figsize=(14, 5.2), gridspec_kw={"height_ratios": [1, 1.3], "hspace": 0.45})
    ax0.plot(range(len(w)), w, color="k", lw=1)
    ax0.scatter(range(len(w)), w, c=["tab:orange" if n in s["skipped"] else "k" for s in steps], s=14, zorder=3)
    ax0.axhline(trace["tau"][str(n)], ls="--", color="tab:orange", label=f"tau_{n}")
    ax0.set_ylabel(f"w_recent({n})"); _legend_right(ax0); ax0.set_xlim(-0.5, len(w) - 0.5)
    # The whole range of a routing weight, with the spread printed: a zoomed axis makes noise look like a signal.
    ax0.set_ylim(0, 1)
    seen = [v for v in w if v is not None]
    if seen:
        lo, hi = min(seen), max(seen)
        ax0.text(0.01, 0.92, f"axis 0-1; on this text w_recent({n}) spans {lo:.4f}-{hi:.4f} (width {hi - lo:.4f})",
                 transform=ax0.transAxes, fontsize=8, va="top")
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
    ax.set_yscale("log"); ax.set_xlabel("layer l"); ax.set_ylabel("share of h0"); _legend_right(ax)
    caption = ("Share of the embedding state h0 in each later residual state of the frozen backbone (mean over test "
               "tokens, first token excluded), beside the source document's toy model (orthogonal contributions of norm "
               "0.5). Dotted lines: block boundaries. Measures how diluted h0 is; says nothing about whether later "
               "layers need it.")
    return "Dilution of h0", _png(fig), caption


def fig_memory(mem):
    fig, axes = plt.subplots(1, 2, figsize=(13, 3.6), gridspec_kw={"wspace": 0.75})
    for ax, table, title in ((axes[0], mem["this_model"][0], "this model"), (axes[1], mem["source_instance"], "48 layers, d=4096 (source design)")):
        names = [r["granularity"] for r in table["rows"]]
        ax.barh(names, [r["mib"] for r in table["rows"]], color="tab:green")
        for i, r in enumerate(table["rows"]):
            ax.text(r["mib"], i, f" {r['mib']:.1f} MiB ({r['states']} states)", va="center", fontsize=8)
        # room right of the longest bar for its label (a log axis: a factor, not a sum)
        ax.set_xscale("log")
        ax.set_xlim(min(r["mib"] for r in table["rows"]) / 3, max(r["mib"] for r in table["rows"]) * 12)
        ax.set_xlabel("MiB"); ax.set_title(f"{title}: {table['context']} tokens, {table['dtype_bytes']} bytes/value", fontsize=9)
    caption = ("Memory of keeping depth states (context x d x bytes per state) at each granularity, computed for this model "
               "and for the source document's 48-layer instance. Coarser granularity costs less and can no longer address "
               "the states between kept ones (see the table below).")
    return "Depth-state memory", _png(fig), caption


def _family(row: dict) -> str:
    """A method's family from its typed row (its kind and arguments), as the legend groups them."""
    if row["kind"] == "reskip":
        return "reskip (budget)" if "budget" in row.get("arguments", {}) else "reskip (quantile)"
    return row["kind"]


def fig_frontier(results):
    """Every method's point, in-domain (filled) and on the held-out source (hollow) when there is one."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    tables = [("", results["frontier"], results["methods"], "-", "o")]
    if results.get("heldout"):
        held = results["heldout"]
        tables.append((f" ({', '.join(held['data'])})", held["frontier"], held["methods"], ":", "s"))
    colors = {}
    for suffix, frontier, rows, ls, marker in tables:
        groups = {}
        for f in frontier:
            groups.setdefault(_family(rows[f["method"]]), []).append(f)
        for kind, pts in groups.items():
            pts = sorted(pts, key=lambda p: p["flops_executed_share"])
            color = colors.setdefault(kind, f"C{len(colors)}")
            ax.plot([p["flops_executed_share"] for p in pts], [p["ppl_ratio"] for p in pts], marker=marker, color=color,
                    ls=ls if kind != "backbone" and kind != "retrofit" else "", label=kind + suffix,
                    mfc="none" if suffix else color)
    ax.set_xlabel("share of layer FLOPs executed"); ax.set_ylabel("perplexity / backbone")
    ax.axhline(1.0, color="k", lw=0.5)
    ax.invert_xaxis(); _legend_right(ax, ncol=2 if len(tables) > 1 else 1)
    caption = ("Quality against compute on the test split: each point a method or operating point (static, influence "
               "and random at each ReSkip point's measured mean skips; a fractional count mixes k and k + 1 blocks "
               "across steps). Lower-left is better. Hollow markers: the same methods on the held-out source with the "
               "thresholds calibrated on the run's data. FLOPs are not wall-clock (see benchmarks/speed.py); the "
               "test split is small, so differences of a few percent are within noise.")
    return "Quality vs compute, in and out of domain", _png(fig), caption


def fig_signal_test(st):
    rows = [r for r in st["blocks"] if r["p"] == max(st["rates"])]
    # a run without cost probes has no probe chooser
    choosers = [c for c in ("signal", "probe", "reverse", "position", "random", "oracle") if c in rows[0]["ppl_ratio"]]
    colors = {"signal": "tab:blue", "probe": "tab:orange", "reverse": "tab:purple", "position": "tab:brown",
              "random": "tab:gray", "oracle": "tab:green"}
    fig, ax = plt.subplots(figsize=(8, 3.8))
    width = 0.8 / len(choosers)
    for j, c in enumerate(choosers):
        xs = [i + (j - (len(choosers) - 1) / 2) * width for i in range(len(rows))]
        ax.bar(xs, [r["ppl_ratio"][c] for r in rows], width=width, label=c, color=colors[c])
    for i, r in enumerate(rows):
        d = r["signal_minus_random"]
        ax.text(i, max(r["ppl_ratio"].values()), f"{d['mean']:+.3f}\n[{d['lo']:+.3f}, {d['hi']:+.3f}]",
                ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(rows)), [f"block {r['block']}" for r in rows])
    ax.axhline(1.0, color="k", lw=0.6)
    # the axis fitted to the bars (with 1.0 in view) and room above the tallest for its interval label
    values = [v for r in rows for v in r["ppl_ratio"].values()] + [1.0]
    lo, hi = min(values), max(values)
    ax.set_ylim(lo - 0.1 * (hi - lo), hi + 0.3 * (hi - lo))
    ax.set_ylabel("perplexity / full model"); _legend_right(ax)
    ax.set_title(f"block n as identity at {max(st['rates']):.0%} of positions (labels: signal - random, 95% CI)",
                 fontsize=9)
    caption = ("The signal test on the test split: block n replaced by identity at a fraction p of each sequence's "
               "positions, chosen where w_recent(n) is highest (signal), lowest (reverse), at the latest positions "
               "(position, content-blind), at random, where a probe of h_{n-1} fitted on the calibration split "
               "predicts the lowest cost (probe, when measured), or where skipping costs least in hindsight (oracle), "
               "each in one cache-free pass. Only a signal - random difference whose bootstrap interval excludes 0 "
               "shows that w_recent tells when to skip; the oracle bounds what any per-token policy could gain, the "
               "probe what a fitted reading of the state before block n could. It measures positions of these "
               "texts, not another domain's.")
    return "The signal test", _png(fig), caption


def fig_experiment_curves(result: dict):
    """Every arm's validation perplexity over training, the backbone's as a dotted line."""
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for name, arm in result["arms"].items():
        ax.plot([e["step"] for e in arm["curve"]], [e["ppl"] for e in arm["curve"]], marker="o", label=name)
    first = next(iter(result["arms"].values()))
    ax.axhline(first["ppl_backbone"], color="gray", ls=":", lw=1, label="backbone")
    ax.set_xlabel("step"); ax.set_ylabel("validation perplexity"); ax.legend(fontsize=8)
    ax.set_title(f"{result['experiment']}: validation perplexity of every arm")
    caption = ("Each arm's validation perplexity at every logged step (the same validation sequences, seed and token "
               "budget for every arm). The damage on the way is the curve's peak, not its end; one seed, so a gap of "
               "a few tenths of a percent is within what a second seed could move.")
    return f"Experiment {result['experiment']} curves", _png(fig), caption


def fig_scale(result: dict):
    """The scale experiment: perplexity / backbone at one and two blocks per step against training tokens, per
    method, on the test split and kjv (colour: method, line: budget, marker: backbone); and the headroom each
    chooser captured per block."""
    arms = result["scale_arms"]
    colors = {"reskip": "tab:blue", "static": "tab:red", "influence": "tab:olive", "random": "tab:gray"}
    models = sorted({a["model"] for a in arms.values()})
    markers = dict(zip(models, "osD^v"))
    budgets = {1.0: "-", 2.0: "--"}
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.6))
    for ax, split in zip(axes[:2], ("test", "kjv")):
        for model in models:
            mine = sorted((a for a in arms.values() if a["model"] == model), key=lambda a: a["tokens"])
            for budget, ls in budgets.items():
                for method, color in colors.items():
                    pts = [(a["tokens"], r[method]) for a in mine for r in (a["frontier"].get(split) or [])
                           if r["budget"] == budget and r.get(method) is not None]
                    if pts:
                        ax.plot(*zip(*pts), ls=ls, color=color, marker=markers[model], ms=5)
        ax.set_xscale("log"); ax.set_xlabel("training tokens"); ax.set_ylabel("perplexity / backbone")
        # the arms' own token counts as the only ticks (the log axis's minor labels overlap at these spans)
        ticks = sorted({a["tokens"] for a in arms.values()})
        ax.set_xticks(ticks, [f"{t / 1e6:.1f}M" for t in ticks]); ax.xaxis.set_minor_formatter(NullFormatter())
        ax.axhline(1.0, color="k", lw=0.5); ax.set_title(f"{split}: ReSkip and its baselines at matched skips", fontsize=9)
    handles = ([Line2D([], [], color=c, label=m) for m, c in colors.items()]
               + [Line2D([], [], color="k", ls=ls, label=f"{b:g} block{'s' if b > 1 else ''} per step")
                  for b, ls in budgets.items()]
               + [Line2D([], [], color="k", ls="", marker=mk, label=m) for m, mk in markers.items()])
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7, frameon=False)
    ax = axes[2]
    labels, xs = [], 0
    for name, a in arms.items():
        for blk, h in (a["headroom"] or {}).items():
            for j, (c, color) in enumerate((("signal", "tab:blue"), ("probe", "tab:orange"), ("position", "tab:brown"))):
                if h.get(c) is not None:
                    ax.bar(xs + (j - 1) * 0.27, h[c], width=0.27, color=color, label=c if xs == 0 else None)
            labels.append(f"{name}\nblock {blk}")
            xs += 1
    ax.set_xticks(range(len(labels)), labels, fontsize=5, rotation=90)
    ax.axhline(0.0, color="k", lw=0.5); ax.set_ylabel("share of the oracle's headroom over random")
    ax.set_title("captured per block (signal test)", fontsize=9); ax.legend(fontsize=7)
    fig.subplots_adjust(bottom=0.32)
    caption = ("ReSkip's budget frontier against static, influence and random at matched skips, as training tokens grow "
               "(log scale), on the test split and on the held-out kjv; and, per arm and eligible block, the share of the "
               "hindsight oracle's headroom over random captured by alpha (signal), by a probe fitted on what exists "
               "before the block runs, and by skipping the latest positions. One seed per arm.")
    return "Experiment scale", _png(fig), caption


def fig_baselines(result: dict):
    """`reskip experiment baselines`: perplexity / backbone against blocks skipped per step, every method, on the
    test split and kjv."""
    rows = result["rows"]
    curves = {  # label: (rows in order of compute, colour, marker)
        "retrofit + ReSkip budgets": (("retrofit", "reskip:budget=1", "reskip:budget=2"), "tab:blue", "D"),
        "ReSkip budgets, held": (("reskip:budget=1:held", "reskip:budget=2:held"), "tab:cyan", "d"),
        "per-sequence selection": (("sequence:1", "sequence:2"), "tab:purple", "s"),
        "retrofit + static (learned shortcut)": (("retrofit", "static:1", "static:2"), "tab:orange", "^"),
        "LoRA, then healed pruning": (("lora", "healed:1", "healed:2"), "tab:green", "v"),
        "backbone, then pruned (no healing)": (("backbone", "pruned:1", "pruned:2"), "tab:gray", "x"),
    }
    for v, color in zip(result.get("variants", []), ("tab:brown", "tab:pink", "tab:olive")):
        # a variant's rows are named "<variant> / <method>" (`experiments.baselines_tables.variant_row`)
        curves[f"{v} + ReSkip budgets"] = (tuple(f"{v} / {k}" for k in ("retrofit", "reskip:budget=1",
                                                                       "reskip:budget=2")), color, "o")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, split in zip(axes, ("test", "kjv")):
        for label, (names, color, marker) in curves.items():
            pts = [(rows[n]["blocks_skipped"][split], rows[n]["ppl_ratio"][split]) for n in names if n in rows]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, label=label)
        ax.axhline(1.0, color="black", lw=0.6, ls=":")
        ax.set_xlabel("blocks skipped per step (measured)")
        ax.set_ylabel("perplexity / backbone (log scale)")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.2g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%.2g"))
        ax.set_title(f"{split}: quality against compute")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, bbox_to_anchor=(0.5, -0.13), frameon=False)
    caption = ("Perplexity against the backbone's (log scale) at the blocks each method skips per step, measured on "
               "the test split and on kjv (no stage trained or calibrated on it): the retrofit and its ReSkip budgets "
               "(fixed and held thresholds), per-sequence selection (K blocks chosen from each sequence's first step) "
               "and static pruning with the learned shortcut, a LoRA of the same trainable parameters, the cheapest "
               "blocks removed without healing (pruned) and healed by that LoRA. One seed, 16 sequences per split: "
               "the intervals of the differences are in the table, not in the figure.")
    return "Baselines: quality against compute", _png(fig), caption


def _family_of_name(name: str) -> str:
    # a frontier written before its points carried their family: the name's first word, as it was written
    return name.split(":")[0].split(" ")[0]


def fig_fidelity_frontier(result: dict):
    """KL to the backbone against layer FLOPs, one panel per split: the static healed models joined by their
    per-sequence mixtures (a line), and every other point by its family."""
    splits = list(result["splits"])
    fig, axes = plt.subplots(1, len(splits), figsize=(6.5 * len(splits), 4.5), constrained_layout=True)
    styles = {"nested": ("tab:green", "s"), "nested-sum": ("tab:olive", "s"), "backbone-teacher": ("tab:purple", "^"),
              "stacked": ("tab:red", "D"), "stacked-backbone-teacher": ("tab:brown", "D")}
    for ax, split in zip(np.atleast_1d(axes), splits):
        points = result["splits"][split]
        static = sorted((p["flops_executed_share"], p["kl_to_backbone"], n) for n, p in points.items()
                        if p["kind"] == "static")
        ax.plot([s for s, _, _ in static], [k for _, k, _ in static], color="black", marker="o",
                label="static kd-healed (and mixtures)")
        for s, k, n in static:
            ax.annotate(n, (s, k), textcoords="offset points", xytext=(4, 4), fontsize=7)
        for family, (color, marker) in styles.items():
            mine = [(p["flops_executed_share"], p["kl_to_backbone"]) for n, p in points.items()
                    if p["kind"] == "dynamic" and p.get("family", _family_of_name(n)) == family]
            if mine:
                ax.scatter(*zip(*mine), color=color, marker=marker, label=family, zorder=3)
        ax.set_xlabel("share of the backbone's layer FLOPs executed")
        ax.set_ylabel("KL(backbone || model) per position")
        ax.set_title(split)
        ax.invert_xaxis()
        _legend_below(ax, ncol=2)
    caption = ("Fidelity to the backbone against the compute spent. The black line joins the separately kd-healed "
               "static models: a point on it is their per-sequence mixture. A point below the line is closer to the "
               "backbone than what a user with static models gets at that compute; the intervals are in the table.")
    return "Fidelity against compute", _png(fig), caption
