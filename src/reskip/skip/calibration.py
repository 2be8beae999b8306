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
import torch.nn.functional as F

from ..data.packing import Packed
from ..losses import ce_sum
from ..ar_retrofit.adapter_io import fingerprint
from ..ar_retrofit.blocks import inclusive_ranges
from ..ar_retrofit.model import ReskipModel
from .policy_file import FORMAT_VERSION, PolicyFile, side_channel_digest
from .signal import signal_health

GRID = 101  # w_recent quantiles stored per block: 0%, 1%, ..., 100%


def sliding_mean(a: torch.Tensor, window: int) -> torch.Tensor:
    """(B, T) -> (B, T): mean of the last `window` values up to and including each position."""
    c = F.pad(a.cumsum(-1), (1, 0))  # (B, T + 1)
    t = torch.arange(1, a.shape[-1] + 1)
    lo = (t - window).clamp_min(0)
    return (c[:, t] - c[:, lo]) / (t - lo)


@torch.no_grad()
def calibrate(model: ReskipModel, data: Packed, delta: float = 0.2, quantile: float = 0.5, window: int = 1,
              max_skips: int = 2, batch_size: int = 4, data_record: dict | None = None, progress=None) -> PolicyFile:
    if window < 1:
        raise ValueError("window must be >= 1")
    t0 = time.perf_counter()
    n_blocks = model.n_blocks
    ce_full, n_targets = 0.0, 0
    ce_skip = {k: 0.0 for k in range(1, n_blocks + 1)}
    alpha_sum = {n: torch.zeros(n) for n in range(2, n_blocks + 1)}  # E[alpha_{i -> n}] numerators
    cos_sum = {k: 0.0 for k in range(1, n_blocks + 1)}
    w_values: dict[int, list[torch.Tensor]] = {n: [] for n in range(2, n_blocks + 1)}
    prev_values: dict[int, list[torch.Tensor]] = {n: [] for n in range(2, n_blocks + 1)}  # alpha_{n-1 -> n} per token
    positions = 0
    was_training = model.training
    model.eval()
    for i in range(0, len(data), batch_size):
        ids, labels = data.input_ids[i : i + batch_size], data.labels[i : i + batch_size]
        with model.capturing() as captured:
            full = model(input_ids=ids, use_cache=False, output_alphas=True)
            cap = captured()
        ce_full += ce_sum(full.logits, labels).item()
        n_targets += int((labels[:, 1:] != -100).sum())
        positions += ids.numel()
        for n, alpha in full.alphas.items():  # (B, T, n)
            alpha_sum[n] += alpha.float().sum(dim=(0, 1))
            w_values[n].append(sliding_mean(alpha[..., -1].float(), window).flatten())
            prev_values[n].append(alpha[..., -1].float().flatten())
        for k in range(1, n_blocks + 1):
            x, h = cap.inputs[k].float(), cap.states[k].float()
            cos_sum[k] += F.cosine_similarity(x, h, dim=-1).sum().item()
            with model.replaying(cap, k):
                ce_skip[k] += ce_sum(model(input_ids=ids, use_cache=False).logits, labels).item()
        if progress is not None:
            progress(min(i + batch_size, len(data)), len(data))
    model.train(was_training)

    ppl_full = math.exp(ce_full / n_targets)
    mean_alpha = {n: (s / positions).tolist() for n, s in alpha_sum.items()}
    blocks = []
    for n, layers in zip(range(1, n_blocks + 1), inclusive_ranges(model.blocks)):
        a = math.exp(ce_skip[n] / n_targets) / ppl_full
        later = [mean_alpha[l][n] for l in range(n + 1, n_blocks + 1)]
        entry = {
            "block": n,
            "layers": layers,
            "A": a,
            "I": max(later) if later else None,
            "cos_in_out": cos_sum[n] / positions,
            "router": n >= 2,
        }
        if n >= 2:
            w = torch.cat(w_values[n]).numpy()
            grid = np.quantile(w, np.linspace(0, 1, GRID)).tolist()
            entry.update(
                tau=float(np.quantile(w, quantile)),
                quantile=quantile,
                w_recent_quantiles=grid,
                w_recent_mean=float(w.mean()),
                histogram=np.histogram(w, bins=20, range=(0.0, 1.0))[0].tolist(),
                signal=signal_health(torch.cat(prev_values[n]).numpy(), w),
                eligible=bool(a < 1 + delta),
            )
        else:  # block 1 has a single source and no router: no signal, never eligible
            entry.update(tau=None, quantile=None, eligible=False)
        blocks.append(entry)
    policy = {
        "format_version": FORMAT_VERSION,
        "kind": "reskip-policy",
        "backbone": fingerprint(model.base_model),
        "adapter": {"side_channel_digest": side_channel_digest(model), "rank": model.rank,
                    "blocks": inclusive_ranges(model.blocks)},
        "delta": delta,
        "quantile": quantile,
        "window": window,
        "max_skips": max_skips,
        "calibration": {"data": data_record or {}, "sequences": len(data), "seq_len": int(data.input_ids.shape[1]),
                        "tokens": positions, "labelled_targets": n_targets,
                        "wall_s": time.perf_counter() - t0},  # the blocks' ablation passes (the frontier: `budgets`)
        "ppl_full": ppl_full,
        "I_source0": max(m[0] for m in mean_alpha.values()) if mean_alpha else None,
        "mean_alpha": {str(n): v for n, v in mean_alpha.items()},
        "blocks": blocks,
    }
    pf = PolicyFile(policy)
    pf.validate(n_blocks)
    return pf
