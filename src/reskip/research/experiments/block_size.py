"""`reskip experiment block-size`: blocks of 2, 3, 4 and 6 layers (and explicit boundaries, when given),
the same rank, budget and data. The first source document picks blocks of about 4 layers; Kimi's
from-scratch Attention Residuals found sizes 2, 4 and 8 all work. Each arm is measured in its
parameters, perplexity, A(n), routing spread, and its skip frontier in *layers* skipped per step, so
sizes compare at the same compute: the budget frontier is calibrated at the budgets (in blocks) that
skip 2, 4 and 8 layers on average for that size (blocks x mean layers per block).

"All sizes work" holds when every size ends below the backbone's validation perplexity; "about 4 is the
right size" holds when size 4 is within 1% of the best final perplexity and of the best frontier point
at 4 layers skipped."""

from __future__ import annotations

from .arm_set import ArmSet, run_arms
from .arms import Arm, Measure
from .record import claim

SIZES = (2, 3, 4, 6)
LAYER_TARGETS = (2, 4, 8)
NEAR_BEST = 1.01


def arms_for(boundaries: list[int] | None) -> list[Arm]:
    out = [Arm(f"{s} layers", retrofit={"block_size": s, "boundaries": None}) for s in SIZES]
    if boundaries:
        out.append(Arm("boundaries " + ",".join(map(str, boundaries)), retrofit={"boundaries": list(boundaries)}))
    return out


def budgets_for(n_layers: int, n_blocks: int) -> tuple[float, ...]:
    """Budgets in blocks per step that skip about LAYER_TARGETS layers, below the routed blocks' count."""
    per_block = n_layers / n_blocks
    return tuple(round(t / per_block, 2) for t in LAYER_TARGETS if t / per_block <= n_blocks - 2)


def layer_frontier(arm: dict) -> dict[int, float]:
    """Layers skipped per step (rounded) -> ppl ratio to the retrofit without skipping, on calibration."""
    per_block = sum(arm["layers_per_block"]) / arm["n_blocks"]
    return {round(p["measured"]["mean_skipped"] * per_block): p["measured"]["ppl_ratio"]
            for p in arm.get("frontier") or []}


def claims(arms: dict) -> list[dict]:
    finals = {n: a["final_ppl"] for n, a in arms.items()}
    backbone = next(iter(arms.values()))["ppl_backbone"]
    out = [claim("Every block size works (Kimi: 2, 4 and 8 all work from scratch)",
                 "final val ppl " + ", ".join(f"{n}: {v:.3f}" for n, v in finals.items()) + f" (backbone {backbone:.3f})",
                 all(v < backbone for v in finals.values()))]
    four = "4 layers"
    if four in arms:
        best = min(finals.values())
        at4 = {n: layer_frontier(a).get(4) for n, a in arms.items()}
        at4 = {n: v for n, v in at4.items() if v is not None}
        best4 = min(at4.values()) if at4 else None
        held = finals[four] <= NEAR_BEST * best and (best4 is None or at4.get(four, float("inf")) <= NEAR_BEST * best4)
        out.append(claim("Blocks of about 4 layers are the right size (first source document)",
                         f"final val ppl of 4 layers {finals[four]:.3f}, best {best:.3f}; ppl ratio at 4 layers skipped "
                         + (", ".join(f"{n}: {v:.3f}" for n, v in at4.items()) if at4 else "not measured"),
                         bool(held)))
    return out


def frontier_table(arms: dict) -> list[str]:
    targets = sorted({k for a in arms.values() for k in layer_frontier(a)})
    out = ["| arm | blocks | params | " + " | ".join(f"{t} layers skipped" for t in targets) + " |",
           "| --- | --- | --- |" + " --- |" * len(targets)]
    for n, a in arms.items():
        f = layer_frontier(a)
        out.append(f"| {n} | {a['n_blocks']} | {a['params']:,} | "
                   + " | ".join("-" if t not in f else f"{f[t]:.3f}" for t in targets) + " |")
    return out


def _left_out(n_layers: int, n_blocks: int) -> str | None:
    if n_blocks < 3:  # a size this model is too shallow for
        return f"{n_blocks} blocks of {n_layers} layers: no middle block to skip or route"
    return None


def _measure(calib: int, test: int, n_layers: int, n_blocks: int) -> Measure:
    """The frontier at the budgets that skip LAYER_TARGETS layers; no signal test (sizes compare on compute)."""
    return Measure(calib, test, budgets=budgets_for(n_layers, n_blocks), signal=False)


def run(options, folder, show=print) -> dict | None:
    """Every size (and the given boundaries), trained side by side (`arm_set.run_arms`)."""
    def tables(results):
        return {"Skip frontier in layers (ppl / retrofit, calibration split)": frontier_table(results)}

    # given boundaries are one more arm here (every arm sets its own partition), not an override of every arm
    boundaries = options.boundaries or options.overrides.get("boundaries")
    arm_set = ArmSet(arms=lambda options, base: arms_for(boundaries), claims=claims, tables=tables,
                     measure=_measure, left_out=_left_out)
    return run_arms(arm_set, options, folder, show)
