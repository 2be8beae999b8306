"""Offline calibration of a ReSkip policy on the calibration split.

Per block n: ablation cost A(n) = PPL(block n as identity) / PPL(full retrofitted model),
routing importance I(n) = max_{l > n} E[alpha_{n -> l}], ShortGPT's cosine similarity
between block input x_n and output h_n, and the distribution of w_recent(n) (the mean of
alpha_{n-1 -> n} over the last W tokens, as the runtime computes it at every decode step)
from which tau_n is read at the chosen quantile. Eligible: A(n) < 1 + delta, for blocks
with a router (n >= 2).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from ...ar_retrofit.adapter_io import fingerprint
from ...ar_retrofit.blocks import inclusive_ranges
from ...ar_retrofit.model import ReskipModel
from ...data.packing import Packed
from ...skip.ablation import BlockSums, measure_blocks
from ...skip.policy_file import FORMAT_VERSION, PolicyFile, forward_config, side_channel_digest
from ..analysis.signal_health import signal_health

GRID = 101  # w_recent quantiles stored per block: 0%, 1%, ..., 100%


@torch.no_grad()
def calibrate(model: ReskipModel, data: Packed, delta: float = 0.2, quantile: float = 0.5, window: int = 1,
              max_skips: int = 2, batch_size: int = 4, data_record: dict | None = None, progress=None) -> PolicyFile:
    if window < 1:
        raise ValueError("window must be >= 1")
    t0 = time.perf_counter()
    m = measure_blocks(model, data, window, batch_size, progress)
    ppl_full = math.exp(m.ce_full / m.n_targets)
    mean_alpha = {n: (s / m.positions).tolist() for n, s in m.alpha_sum.items()}
    blocks = [block_entry(n, layers, m, ppl_full, mean_alpha, delta, quantile)
              for n, layers in zip(range(1, model.n_blocks + 1), inclusive_ranges(model.blocks))]
    policy = {
        "format_version": FORMAT_VERSION,
        "kind": "reskip-policy",
        "backbone": fingerprint(model.base_model),
        "adapter": {"side_channel_digest": side_channel_digest(model), "legacy_tensor_names": False,
                    "forward_config": forward_config(model),
                    "rank": model.rank, "blocks": inclusive_ranges(model.blocks)},
        "delta": delta,
        "quantile": quantile,
        "window": window,
        "max_skips": max_skips,
        "calibration": {"data": data_record or {}, "sequences": len(data), "seq_len": int(data.input_ids.shape[1]),
                        "tokens": m.positions, "labelled_targets": m.n_targets,
                        "wall_s": time.perf_counter() - t0},  # the blocks' ablation passes (the frontier: `budgets`)
        "ppl_full": ppl_full,
        "I_source0": max(v[0] for v in mean_alpha.values()) if mean_alpha else None,
        "mean_alpha": {str(n): v for n, v in mean_alpha.items()},
        "blocks": blocks,
    }
    pf = PolicyFile(policy)
    pf.validate(model.n_blocks)
    return pf


def block_entry(n: int, layers, m: BlockSums, ppl_full: float, mean_alpha: dict, delta: float, quantile: float
                ) -> dict:
    """policy.json's entry of block n: A(n), I(n), cos(x, h), and for a block with a router its threshold, the
    w_recent distribution it came from, the signal's health and eligibility."""
    a = math.exp(m.ce_skip[n] / m.n_targets) / ppl_full
    later = [mean_alpha[l][n] for l in range(n + 1, len(mean_alpha) + 2)]
    entry = {"block": n, "layers": layers, "A": a, "I": max(later) if later else None,
             "cos_in_out": m.cos_sum[n] / m.positions, "router": n >= 2}
    if n < 2:  # block 1 has a single source and no router: no signal, never eligible
        return {**entry, "tau": None, "quantile": None, "eligible": False}
    w = torch.cat(m.w_values[n]).cpu().numpy()
    return {**entry, "tau": float(np.quantile(w, quantile)), "quantile": quantile,
            "w_recent_quantiles": np.quantile(w, np.linspace(0, 1, GRID)).tolist(), "w_recent_mean": float(w.mean()),
            "histogram": np.histogram(w, bins=20, range=(0.0, 1.0))[0].tolist(),
            "signal": signal_health(torch.cat(m.prev_values[n]).cpu().numpy(), w), "eligible": bool(a < 1 + delta)}
