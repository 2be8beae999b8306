"""What a user with static models does between their depths: serve a share f of the sequences with the deeper cut
and the rest with the shallower one, so that the mean layer FLOPs meet a target. Fidelity of that mixture, per
sequence (so a dynamic method scored on the same sequences is compared with it pair by pair), and the difference
with its 95% bootstrap interval."""

from __future__ import annotations

import numpy as np

from ...errors import ReskipError
from ...statistics import bootstrap_mean_difference

FIELDS = ("kl", "agree")  # per-sequence sums the mixture mixes (KL to the backbone, top-1 agreements)


def same_sequences(a: dict, b: dict) -> None:
    """Two rows scored the same sequences: equal per-sequence positions."""
    if a["per_sequence"]["positions"] != b["per_sequence"]["positions"]:
        raise ReskipError("two evaluations did not score the same sequences: rerun them with the same data, preset "
                          "and sequences")


def neighbours(static: dict[str, dict], share: float) -> tuple[str, str, float] | None:
    """The two static rows around `share` of the layer FLOPs (name, name, the deeper one's share f of the
    sequences); None beyond the static points' range."""
    ranked = sorted(static, key=lambda n: -static[n]["flops_executed_share"])  # the whole model first
    for hi, lo in zip(ranked, ranked[1:]):
        s_hi, s_lo = static[hi]["flops_executed_share"], static[lo]["flops_executed_share"]
        if s_lo - 1e-9 <= share <= s_hi + 1e-9:
            return hi, lo, 0.0 if s_hi == s_lo else min(max((s_hi - share) / (s_hi - s_lo), 0.0), 1.0)
    return None


def mixture(static: dict[str, dict], share: float) -> dict | None:
    """The per-sequence mixture of the static rows around `share`: {between, share_deeper, per_sequence, kl,
    top1}."""
    around = neighbours(static, share)
    if around is None:
        return None
    hi, lo, f = around
    a, b = static[hi]["per_sequence"], static[lo]["per_sequence"]
    per = {m: ((1 - f) * np.array(a[m], float) + f * np.array(b[m], float)).tolist() for m in FIELDS}
    positions = float(np.sum(a["positions"]))
    return {"between": [hi, lo], "share_deeper": f, "per_sequence": {**per, "positions": a["positions"]},
            "kl": sum(per["kl"]) / positions, "top1": sum(per["agree"]) / positions}


def minus_mixture(row: dict, mix: dict) -> dict:
    """row - mixture of KL and top-1 agreement, each with its 95% interval over sequences."""
    counts = np.array(mix["per_sequence"]["positions"], float)
    return {m: bootstrap_mean_difference(np.array(row["per_sequence"][f], float),
                                         np.array(mix["per_sequence"][f], float), counts)
            for m, f in (("kl", "kl"), ("top1", "agree"))}


def backbone_row(like: dict) -> dict:
    """The backbone as a static point: all its layers, KL 0, every top-1 its own (per-sequence sums to match)."""
    positions = like["per_sequence"]["positions"]
    return {"flops_executed_share": 1.0, "kl_to_backbone": 0.0, "top1_agreement": 1.0, "ppl_ratio": 1.0,
            "per_sequence": {"kl": [0.0] * len(positions), "agree": [float(p) for p in positions],
                             "positions": positions}}
