"""`reskip experiment mix`: the training mix against each single part of it. The first source document
warns that a narrow mix pushes alpha toward near-one-hot routing: "the loss is fine, but the routing
signal becomes vestigial". Every arm trains on the same data specs with `data_weights` keeping one part
only, and is measured on the same (whole-mix) validation, calibration and test sequences: entropy per
block (as a share of its maximum, log n), alpha's weight on h_{n-1}, w_recent's spread, the signal test.

"Held" for a narrow part: its mean entropy share over the middle blocks is below the whole mix's and its
median w_recent spread is no larger (the routing closer to one-hot and less input-dependent)."""

from __future__ import annotations

from statistics import median

from ...data.sources import load_splits
from ...errors import ReskipError
from .arm_set import ArmSet, run_arms
from .arms import Arm, beats_random, middle_blocks
from .record import claim

WHOLE = "whole mix"


def arms_for(parts: list[str]) -> list[Arm]:
    """The whole mix, then one arm per part of the training split (its sources)."""
    return [Arm(WHOLE, note="every part at its default weight")] + [
        Arm(f"{p} only", train={"data_weights": {p: 1.0}}, note=f"training sequences from {p} only") for p in parts]


def routing_summary(arm: dict) -> dict:
    mids = middle_blocks(arm)
    ent = [b["entropy_ratio"] for b in mids if b["entropy_ratio"] is not None]
    spread = [b["w_recent_range"] for b in mids if b["w_recent_range"] is not None]
    return {"entropy_share": sum(ent) / len(ent) if ent else None, "spread": median(spread) if spread else None,
            "beats": beats_random(arm)}


def claims(arms: dict) -> list[dict]:
    whole = routing_summary(arms[WHOLE])
    out = []
    for name, arm in arms.items():
        if name == WHOLE:
            continue
        s = routing_summary(arm)
        held = None
        if s["entropy_share"] is not None and whole["entropy_share"] is not None:
            held = bool(s["entropy_share"] < whole["entropy_share"] and s["spread"] <= whole["spread"])
        out.append(claim(
            f"A narrow mix ({name}) makes the routing vestigial (near one-hot, less input-dependent)",
            f"mean entropy share of the middle blocks {s['entropy_share']:.3f} vs {whole['entropy_share']:.3f} "
            f"(whole mix); median w_recent 5-95% range {s['spread']:.4f} vs {whole['spread']:.4f}; signal beats random "
            f"on blocks {s['beats'] or 'none'} vs {whole['beats'] or 'none'}; val ppl {arm['final_ppl']:.3f} vs "
            f"{arms[WHOLE]['final_ppl']:.3f}",
            held))
    return out


def entropy_table(arms: dict) -> list[str]:
    """Entropy share per block, one column per arm."""
    names = list(arms)
    blocks = sorted(int(n) for n in arms[names[0]]["blocks"] if int(n) > 1)
    out = ["| block | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for n in blocks:
        cells = []
        for a in names:
            r = arms[a]["blocks"][str(n)]["entropy_ratio"]
            cells.append("-" if r is None else f"{r:.3f}")
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    return out


def _arms(options, base) -> list[Arm]:
    _, record = load_splits(base.data)
    parts = sorted(record["splits"]["train"]["by_source"])
    if len(parts) < 2:
        raise ReskipError(f"the data {base.data} has one part ({parts}): `mix` needs a mix of sources")
    return arms_for(parts)


def run(options, folder, show=print) -> dict | None:
    """The whole mix and each of its parts, trained side by side (`arm_set.run_arms`)."""
    def tables(results):
        return {"Entropy share per block (H / log n, last validation)": entropy_table(results)}

    return run_arms(ArmSet(arms=_arms, claims=claims, tables=tables), options, folder, show)
