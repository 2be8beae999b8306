"""The signal test: does w_recent(n) tell when block n can be skipped?

The second source document's reading discipline applied to the first's claim. For an eligible block n and a skip rate p,
block n is replaced by identity at a fraction p of each sequence's positions, chosen

    signal   where w_recent(n) is highest (what ReSkip's rule w_recent > tau_n does),
    reverse  where it is lowest,
    random   uniformly (seeded),
    position the latest positions of each sequence (content-blind, as position-schedule methods skip),
    probe    where a probe fitted on the calibration split predicts the lowest cost from what exists
             before block n runs: h_{n-1}, w_recent(n), the position (`cost_probe`; when probes are given),
    oracle   where skipping n costs least, in hindsight (per-token NLL with block n as identity at
             every position, minus the full model's),

each in one cache-free pass with the position-skip reference mode (skipped positions keep their
input; their K/V are those of the unchanged input, as the exact cache gives at decode). The oracle
bounds what any per-token policy could gain over skipping at random; the gap between signal and
random is how much of it alpha captures, and the probe's share bounds what a reading of h_{n-1} could
capture. A bootstrap over sequences gives the interval of the difference signal - random; only a
difference outside it licenses "w_recent tells when to skip" (and of probe - signal: "a probe of h_{n-1}
finds cheaper positions than alpha").
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ...ar_retrofit.model import ReskipModel
from ...backbones.devices import model_device
from ...data.packing import Packed
from ...losses import ce_tokens
from ...skip.window import sliding_mean
from ...statistics import bootstrap_difference, verdict
from .cost_probe import Probe, block_costs, probe_features

CHOOSERS = ("signal", "reverse", "random", "position", "oracle")  # "probe" joins them when probes are given
CAPTURING = ("signal", "probe", "position")  # the choosers whose share of the oracle's headroom is reported
RATES = (0.25, 0.5)


def choose_positions(scores: torch.Tensor, k: int) -> torch.Tensor:
    """(B, T) scores -> (B, T) bool mask of the k highest-scoring positions of each row."""
    mask = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    if k > 0:
        mask.scatter_(1, scores.topk(k, dim=1).indices, True)
    return mask


@torch.no_grad()
def signal_test(model: ReskipModel, data: Packed, blocks: list[int], window: int, rates=RATES,
                batch_size: int = 4, seed: int = 0, n_boot: int = 1000, probes: dict[int, Probe] | None = None,
                progress: Callable[[int], None] | None = None) -> dict:
    """Per block in `blocks` (each n >= 2) and rate: perplexity ratio to the full model for each chooser.
    probes: block -> its fitted cost probe (`cost_probe.fit_probes` on the calibration split), one more chooser.
    progress: called with the number of sequences after each batch."""
    was_training = model.training
    model.eval()
    choosers = CHOOSERS + (("probe",) if probes else ())
    generator = torch.Generator().manual_seed(seed)
    full_nll, targets = [], []
    nll = {(n, p, c): [] for n in blocks for p in rates for c in choosers}
    for ids, labels in data.batches(batch_size, model_device(model)):
        full, cap, base, costs = block_costs(model, ids, labels, blocks)
        full_nll.append(base.sum(1))
        targets.append((labels[:, 1:] != -100).sum(1))
        later = torch.arange(ids.shape[1], dtype=torch.float32, device=ids.device).expand(ids.shape)  # (B, T): the latest score highest
        for n in blocks:
            w = sliding_mean(full.alphas[n][..., -1].float(), window)  # (B, T): w_recent(n) at each position
            scores = {"signal": w, "reverse": -w, "random": torch.rand(w.shape, generator=generator).to(w.device),
                      "position": later, "oracle": -costs[n]}
            if probes:
                scores["probe"] = -probes[n].predict(probe_features(cap, w, n).cpu()).to(w.device)  # fitted on the host
            for p in rates:
                k = round(p * ids.shape[1])
                for chooser in choosers:
                    mask = choose_positions(scores[chooser], k)
                    # Blocks before n are the full pass's own: start from its h_{n-1}.
                    with model.continuing(cap, n - 1), model.skipping_positions({n: mask}):
                        logits = model(input_ids=ids, use_cache=False).logits
                    nll[(n, p, chooser)].append(ce_tokens(logits, labels).sum(1))
        if progress is not None:
            progress(len(ids))
    model.train(was_training)

    full_s = torch.cat(full_nll).double().cpu().numpy()
    tgt = torch.cat(targets).double().cpu().numpy()
    ppl_full = math.exp(full_s.sum() / tgt.sum())
    rows = [_row(n, p, {c: torch.cat(nll[(n, p, c)]).double().cpu().numpy() for c in choosers}, full_s, tgt, n_boot, seed)
            for n in blocks for p in rates]
    out = {"window": window, "rates": list(rates), "sequences": len(data), "seq_len": int(data.input_ids.shape[1]),
           "ppl_full": ppl_full, "n_boot": n_boot, "choosers": list(choosers), "blocks": rows,
           "sentence": sentence(rows, max(rates))}
    if probes:
        out["probes"] = {str(n): {"kind": pr.kind, "held_out_cost": pr.held_out_cost} for n, pr in probes.items()}
    return out


def _row(n: int, p: float, per: dict, full_s, tgt, n_boot: int, seed: int) -> dict:
    """One block at one rate: every chooser's perplexity ratio, the bootstrap of signal - random (and of
    probe - signal), and the share of the oracle's headroom over random each capturing chooser takes."""
    ratio = {c: math.exp((nll.sum() - full_s.sum()) / tgt.sum()) for c, nll in per.items()}
    diff = bootstrap_difference(full_s, per["signal"], per["random"], tgt, n_boot, seed)
    headroom = ratio["random"] - ratio["oracle"]
    captured = {c: (ratio["random"] - ratio[c]) / headroom if headroom > 0 else None for c in CAPTURING if c in per}
    row = {"block": n, "p": p, "ppl_ratio": ratio, "signal_minus_random": diff, "verdict": verdict(diff),
           "captured_share": captured["signal"], "captured": captured}
    if "probe" in per:
        row["probe_minus_signal"] = bootstrap_difference(full_s, per["probe"], per["signal"], tgt, n_boot, seed)
    return row


def sentence(rows: list[dict], p: float) -> str:
    """What the test licenses at rate p, in one sentence (or the refutation)."""
    at = [r for r in rows if r["p"] == p]
    if not at:
        return "No eligible block was tested: the policy has nothing to skip, so the test says nothing."
    beats = [r["block"] for r in at if r["verdict"] == "signal beats random"]
    worse = [r["block"] for r in at if r["verdict"] == "signal worse than random"]
    rest = [r["block"] for r in at if r["verdict"] == "no difference"]
    if len(beats) == len(at):
        shares = [r["captured_share"] for r in at if r["captured_share"] is not None]
        got = f"; it captures {min(shares):.0%}-{max(shares):.0%} of the oracle's headroom over random" if shares else ""
        return (f"At p = {p}, positions chosen by w_recent are cheaper to skip than random ones for every tested "
                f"block ({beats}), outside the 95% bootstrap interval{got}.")
    if not beats:
        return (f"At p = {p} the test refutes 'w_recent tells when to skip' on this run: for no tested block are "
                f"the positions w_recent picks cheaper than random ones outside the 95% bootstrap interval"
                + (f" (worse than random: {worse})" if worse else "") + ".")
    return (f"At p = {p}, w_recent beats random for blocks {beats} only (outside the 95% bootstrap interval); "
            f"for {rest + worse} it does not" + (f" (worse than random: {worse})" if worse else "") + ".")
