"""The report's experiment sections: one per RUN/experiments/NAME/results.json (`reskip experiment`),
read from the files only: the claims with their verdicts, the arms side by side, and every arm's
validation perplexity curve (placement: its placements and reconstruction test)."""

from __future__ import annotations

import html
from pathlib import Path

from ...html_tables import html_table, markdown_table
from ..experiments.results_file import read_results
from .figures import fig_baselines, fig_experiment_curves, fig_scale


def experiment_sections(folder: Path) -> list[tuple]:
    """(figure title, png or None, caption, html body) per experiment found under `folder`, by name."""
    out = []
    for path in sorted(Path(folder).glob("*/results.json")):
        r = read_results(path, "experiment", "preset", "claims")  # names from before a rename read as today's
        title = f"Experiment: {r['experiment']} (preset {r['preset']})"
        body = (f"<h2>{html.escape(title)}</h2>"
                + html_table(r["claims"], ["claim", "measured", "verdict"]))
        if r.get("arms"):
            rows = [{"arm": n, "params": a["params"], "worst val ppl": a["worst_ppl"], "at step": a["worst_step"],
                     "final val ppl": a["final_ppl"], "KL to backbone": a["final_kl"],
                     "backbone ppl": a["ppl_backbone"]} for n, a in r["arms"].items()]
            body += html_table(rows, list(rows[0]))
        if r.get("settings"):
            rows = [{"setting": label, "k": s["k"], "placement": name, "kept": p["kept"],
                     "cannot address": p["not_addressable"], "mean R^2 (fit)": p["mean_r2_fit"],
                     "mean R^2 (copy)": p["mean_r2_copy"]}
                    for label, s in r["settings"].items() for name, p in s["placements"].items()]
            body += html_table(rows, list(rows[0]))
        for heading, rows in r.get("tables", {}).items() if r.get("scale_arms") or r.get("rows") else ():
            body += f"<h3>{html.escape(heading)}</h3>" + markdown_table(rows)
        if r.get("verdict"):
            body += f"<p><b>Verdict:</b> {html.escape(r['verdict'])}</p>"
        body += f"<p>Files: {html.escape(str(path.parent))} (results.json, results.md).</p>"
        if r.get("scale_arms"):
            out.append((*fig_scale(r), body))
        elif r.get("rows"):  # baselines
            out.append((*fig_baselines(r), body))
        elif r.get("arms"):
            fig_title, png, caption = fig_experiment_curves(r)
            out.append((fig_title, png, caption, body))
        else:
            out.append((None, None, None, body))
    return out
