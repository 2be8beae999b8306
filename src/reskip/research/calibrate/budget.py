"""Budgeted calibration: per target budget B (blocks skipped per step, on average), the per-block
thresholds that meet it at the lowest measured calibration loss.

The source design's rule reads one quantile of w_recent for every eligible block. A budget can instead be
spent where it costs least: block n is skipped at the share f_n of the steps where its step signal
(w_recent(n) at the step's last token, as the runtime reads it) is highest, with sum_n f_n = B.

1. Cost curves (reference mode, no cache): for every block with a router and every share f in
   `levels`, the calibration loss with block n as identity at the steps (chunks of `chunk_size`
   tokens) of its top share f of step signals, the rest of the model as it is. f = 1 is the whole
   block removed (its A(n)).
2. Allocation: a greedy walk from nothing skipped to everything; each move raises one block to the
   level of lowest added cost per added skipped block (over each block's remaining levels). A
   budget between two moves takes the last move in part (its share interpolated).
3. Joint measurement: costs are not additive (skipping block 2 changes what block 5 receives and
   what its router reads), so each budget's allocation, and static pruning at the same budget (the
   lowest-cost blocks whole; for a fractional budget the next block at the remaining share, chosen
   by its signal), runs as a policy exactly as `reskip eval` runs one (each sequence deciding from
   its own signal in chunks with the exact cache; whole blocks, which read no signal, in one pass).
   An allocation's thresholds are then re-read from the signals seen under that allocation and
   measured once more. The lower measured loss is stored, so on the
   calibration split the budgeted policy is never worse than static pruning at an integer budget.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from ...ar_retrofit.model import ReskipModel
from ...backbones.devices import model_device
from ...data.packing import Packed
from ...losses import ce_sum, kl_sum, teacher_targets
from ...skip.policies import plan
from ...skip.policy_file import policy_of_allocation
from ...skip.scoring import score_planned_whole, score_rows
from ...skip.window import sliding_mean

LEVELS = (0.25, 0.5, 0.75, 1.0)
ALWAYS = 1.0 - 1e-9  # a share at or above this: the block is skipped at every step (tau null)


def chunk_ends(length: int, chunk_size: int) -> torch.Tensor:
    """(S,) index of the last token of each step when a sequence of `length` is scored in chunks."""
    return (torch.arange(0, length, chunk_size) + chunk_size).clamp_max(length) - 1


def step_positions(step_mask: torch.Tensor, length: int, chunk_size: int) -> torch.Tensor:
    """(B, S) per-step decisions -> (B, T) per-position mask (every token of a skipped step)."""
    return step_mask.repeat_interleave(chunk_size, dim=1)[:, :length]


@dataclass
class Curves:
    """What step 1 measured. signals: block -> (N, S) step signals of the full model.
    points: block -> [(share, cost)] from (0, 0) up, cost in nats per target (`kl`: per position) over the full
    model."""

    ce_full: float  # nats per target (`kl`: the full model's KL to the backbone per position)
    signals: dict[int, torch.Tensor]
    points: dict[int, list[tuple[float, float]]]


def threshold(signals: torch.Tensor | list[float], share: float) -> float | None:
    """tau such that `signal > tau` at about `share` of the steps; None: every step."""
    if share >= ALWAYS:
        return None
    values = np.asarray(signals.flatten().cpu() if isinstance(signals, torch.Tensor) else signals, dtype=np.float64)
    return float(np.quantile(values, 1.0 - share))


OBJECTIVES = ("ppl", "kl")  # what the frontier minimises: the calibration loss, or KL to the backbone


class Loss:
    """The cost a frontier minimises, summed over a batch and normalised once: `ppl` is the next-token CE per
    labelled target (its exp the perplexity ratio); `kl` is KL(backbone || model) per position (fidelity to the
    backbone: the side-channel off is the backbone, bit for bit), whose teacher is one more pass per batch."""

    def __init__(self, model: ReskipModel, objective: str):
        if objective not in OBJECTIVES:
            raise ValueError(f"budget objective {objective!r}: one of {', '.join(OBJECTIVES)}")
        self.model, self.objective = model, objective

    def teacher(self, ids):
        if self.objective != "kl":
            return None
        with self.model.side_channel_disabled():
            return self.model(input_ids=ids, use_cache=False).logits  # (B, T, V): the backbone's

    def __call__(self, logits, labels, teacher) -> float:
        return ce_sum(logits, labels).item() if teacher is None else kl_sum(teacher, logits).item()

    def count(self, data: Packed) -> int:
        return int((data.labels[:, 1:] != -100).sum()) if self.objective == "ppl" else data.input_ids.numel()


@torch.no_grad()
def cost_curves(model: ReskipModel, data: Packed, window: int, chunk_size: int, levels=LEVELS,
                batch_size: int = 4, objective: str = "ppl") -> Curves:
    n_blocks, length = model.n_blocks, data.input_ids.shape[1]
    ends = chunk_ends(length, chunk_size)
    loss = Loss(model, objective)
    ce_full, cost_full, n_targets = 0.0, 0.0, int((data.labels[:, 1:] != -100).sum())
    signals: dict[int, list[torch.Tensor]] = {n: [] for n in range(2, n_blocks + 1)}
    batches = list(data.batches(batch_size, model_device(model)))
    for ids, labels in batches:
        out = model(input_ids=ids, use_cache=False, output_alphas=True)
        ce_full += ce_sum(out.logits, labels).item()
        cost_full += loss(out.logits, labels, loss.teacher(ids))
        for n, alpha in out.alphas.items():  # (B, T, n)
            signals[n].append(sliding_mean(alpha[..., -1].float(), window)[:, ends])  # (B, S)
    stacked = {n: torch.cat(s) for n, s in signals.items()}
    taus = {n: {f: threshold(s, f) for f in levels} for n, s in stacked.items()}
    ce = {(n, f): 0.0 for n in stacked for f in levels}
    share = {(n, f): 0.0 for n in stacked for f in levels}
    row = 0
    # A second full pass per batch, to capture its states: the thresholds are quantiles over the whole
    # split, known only after the first loop, and keeping every batch's states instead would hold
    # N x T x d x (2N_blocks) floats (some 300 MB at the standard preset).
    for ids, labels in batches:
        teacher = loss.teacher(ids)
        teacher = None if teacher is None else teacher_targets(teacher)  # once per batch, for every (block, share)
        with model.capturing() as captured:
            model(input_ids=ids, use_cache=False)
            cap = captured()
        for n in stacked:
            sig = stacked[n][row : row + len(ids)]
            for f in levels:
                tau = taus[n][f]
                steps = torch.ones_like(sig, dtype=torch.bool) if tau is None else sig > tau
                share[n, f] += float(steps.float().sum())
                # blocks 1..n-1 are not rerun: the stream starts from the captured h_{n-1}
                with model.continuing(cap, n - 1), model.skipping_positions({n: step_positions(steps, length, chunk_size)}):
                    ce[n, f] += loss(model(input_ids=ids, use_cache=False).logits, labels, teacher)
        row += len(ids)
    total_steps = len(data) * len(ends)
    per = loss.count(data)  # the objective's normaliser: targets (ppl) or positions (kl)
    points = {n: [(0.0, 0.0)] + [(share[n, f] / total_steps, (ce[n, f] - cost_full) / per) for f in levels]
              for n in stacked}
    return Curves(ce_full / n_targets, stacked, points)


def greedy_path(points: dict[int, list[tuple[float, float]]]) -> list[tuple[dict[int, float], float]]:
    """Allocations from nothing skipped to every level taken: [(block -> share, predicted cost)]."""
    level = {n: 0 for n in points}
    path = [({n: 0.0 for n in points}, 0.0)]
    while True:
        best = None
        for n, pts in points.items():
            s0, c0 = pts[level[n]]
            for j in range(level[n] + 1, len(pts)):
                s1, c1 = pts[j]
                if s1 > s0 + 1e-12:
                    slope = (c1 - c0) / (s1 - s0)
                    if best is None or slope < best[0]:
                        best = (slope, n, j)
        if best is None:
            return path
        _, n, j = best
        level[n] = j
        shares = dict(path[-1][0])
        shares[n] = points[n][j][0]
        path.append((shares, sum(points[m][level[m]][1] for m in points)))


def allocation_at(path, budget: float) -> tuple[dict[int, float], float] | None:
    """The path's allocation at `budget` (the crossing move taken in part); None if out of reach."""
    for (a, cost_a), (b, cost_b) in zip(path, path[1:]):
        lo, hi = sum(a.values()), sum(b.values())
        if lo - 1e-9 <= budget <= hi + 1e-9:
            t = 0.0 if hi == lo else (budget - lo) / (hi - lo)
            shares = {n: a[n] + t * (b[n] - a[n]) for n in a}
            return shares, cost_a + t * (cost_b - cost_a)
    if path and abs(sum(path[0][0].values()) - budget) < 1e-9:
        return path[0]
    return None


def static_at(points: dict[int, list[tuple[float, float]]], budget: float) -> dict[int, float] | None:
    """Static pruning at `budget`: the blocks of lowest whole-block cost, whole; the next at the
    remaining share. None if there are not enough blocks."""
    ranked = sorted(points, key=lambda n: points[n][-1][1])
    whole = int(math.floor(budget + 1e-9))
    rest = budget - whole
    if whole > len(ranked) or (rest > 1e-9 and whole >= len(ranked)):
        return None
    shares = {n: 1.0 if i < whole else 0.0 for i, n in enumerate(ranked)}
    if rest > 1e-9:
        shares[ranked[whole]] = rest
    return shares


def blocks_of(shares: dict[int, float], signals: dict[int, torch.Tensor | list[float]]) -> dict[str, dict]:
    return {str(n): {"fraction": s, "tau": threshold(signals[n], s)} for n, s in sorted(shares.items()) if s > 1e-9}


@torch.no_grad()
def measure(model: ReskipModel, data: Packed, blocks: dict[str, dict], window: int, chunk_size: int,
            batch_size: int = 4, objective: str = "ppl") -> dict:
    """Run an allocation as `reskip eval` runs a policy (`batch_size` sequences per batch, each row making
    its own decisions in chunks with the exact cache, `scoring.score_rows`; an allocation of whole blocks
    reads no signal and runs as one cache-free pass, `scoring.score_planned_whole`): its loss, mean skips
    per step and the step signals it saw.

    (A batched emulation in the cache-free reference mode, deciding block by block in order since
    w_recent(n) depends only on the blocks before n, gave the same frontier to every printed digit on
    the bundled model but cost 1.4x the CPU time of scoring one sequence at a time in chunks: it needs
    one pass per signal-read block, this one pass in all. In bfloat16, with each decision pass stopped
    after its block, it took as long as the batched chunks, which cost about two whole passes.)"""
    policy = policy_of_allocation(blocks, "budget")
    loss = Loss(model, objective)
    ce, cost, skipped, steps = 0.0, 0.0, 0, 0
    seen: dict[int, list[float]] = {n: [] for n in policy.eligible if n not in policy.always}
    planned = plan(policy, model.n_blocks, len(chunk_ends(data.input_ids.shape[1], chunk_size)))
    for ids, labels in data.batches(batch_size, model_device(model)):
        if planned is not None:  # whole blocks, no signal read: one cache-free pass (what the chunks compute)
            logits, traces = score_planned_whole(model, ids, [planned] * len(ids), chunk_size)
        else:
            logits, traces = score_rows(model, ids, policy, window, chunk_size)
        teacher = loss.teacher(ids)
        for b, trace in enumerate(traces):  # in sequence order, so the signals are listed as one at a time
            ce += ce_sum(logits[b : b + 1], labels[b : b + 1]).item()
            cost += loss(logits[b : b + 1], labels[b : b + 1], teacher[b : b + 1]) if teacher is not None else 0.0
            skipped += sum(len(t.skipped) for t in trace)
            steps += len(trace)
            for t in trace:
                for n, w in t.w_recent.items():
                    seen[n].append(w)
    n_targets = int((data.labels[:, 1:] != -100).sum())
    out = {"ce": ce / n_targets, "mean_skipped": skipped / steps, "signals": seen}
    out["cost"] = out["ce"] if objective == "ppl" else cost / loss.count(data)
    return out


def _measure_refit(model, data, blocks: dict, window: int, chunk_size: int, batch_size: int, objective: str
                   ) -> tuple[dict, dict]:
    """Measure an allocation; if it reads any signal, re-read its thresholds from the signals seen under
    it (skipping earlier blocks moves later routers' alpha) and measure again. (blocks, measurement)."""
    first = measure(model, data, blocks, window, chunk_size, batch_size, objective)
    if all(blk["tau"] is None for blk in blocks.values()):
        return blocks, first
    refit = {n: {"fraction": blk["fraction"],
                 "tau": None if blk["tau"] is None else threshold(first["signals"][int(n)], blk["fraction"])}
             for n, blk in blocks.items()}
    return refit, measure(model, data, refit, window, chunk_size, batch_size, objective)


def _measured(m: dict, ce_full: float, objective: str) -> dict:
    """A frontier point's measurement: its CE (nats per target) and perplexity / the full model's, and with `kl`
    its KL to the backbone per position (`cost`: the one it minimised)."""
    return {"ce": m["ce"], "ppl_ratio": math.exp(m["ce"] - ce_full), "mean_skipped": m["mean_skipped"],
            "cost": m["cost"], **({"kl_to_backbone": m["cost"]} if objective == "kl" else {})}


def calibrate_budgets(model: ReskipModel, data: Packed, budgets, window: int, chunk_size: int, levels=LEVELS,
                      batch_size: int = 4, progress=None, objective: str = "ppl") -> dict:
    """The `budgets` section of policy.json: the cost curves and one frontier point per reachable budget, each
    minimising `objective` (`OBJECTIVES`: perplexity, or KL to the backbone)."""
    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    curves = cost_curves(model, data, window, chunk_size, levels, batch_size, objective)
    curves_s = time.perf_counter() - t0
    path = greedy_path(curves.points)
    frontier, unreachable = [], []
    for b in sorted(set(float(x) for x in budgets)):
        found = allocation_at(path, b)
        if found is None:  # more blocks per step than there are blocks with a router
            unreachable.append(b)
            continue
        shares, predicted = found
        t0 = time.perf_counter()
        signal_blocks, measured = _measure_refit(model, data, blocks_of(shares, curves.signals), window, chunk_size,
                                                 batch_size, objective)
        candidates = {"signal": {"blocks": signal_blocks, "predicted_cost": predicted,
                                 "measured": _measured(measured, curves.ce_full, objective)}}
        static = static_at(curves.points, b)
        if static is not None:
            static_blocks, measured = _measure_refit(model, data, blocks_of(static, curves.signals), window,
                                                     chunk_size, batch_size, objective)
            candidates["static"] = {"blocks": static_blocks, "measured": _measured(measured, curves.ce_full, objective)}
        chosen = min(candidates, key=lambda k: candidates[k]["measured"]["cost"])
        frontier.append({"budget": b, "chosen": chosen, "blocks": candidates[chosen]["blocks"],
                         "measured": candidates[chosen]["measured"], "candidates": candidates,
                         "wall_s": time.perf_counter() - t0})
        if progress is not None:
            progress(b)
    model.train(was_training)
    return {
        "chunk_size": chunk_size,
        "window": window,
        "objective": objective,
        "levels": list(levels),
        "sequences": len(data),
        "ce_full": curves.ce_full,
        "curves": {str(n): [{"share": s, "cost": c} for s, c in pts] for n, pts in curves.points.items()},
        "curves_wall_s": curves_s,
        "frontier": frontier,
        "unreachable": unreachable,
    }
