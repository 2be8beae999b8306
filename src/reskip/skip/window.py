"""The window mean of a routing weight, offline: what the runtime's running window computes at each step,
for every position of a whole sequence at once (calibration, the signal test, the cost probe, diagnose)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sliding_mean(a: torch.Tensor, window: int) -> torch.Tensor:
    """(B, T) -> (B, T): mean of the last `window` values up to and including each position."""
    c = F.pad(a.cumsum(-1), (1, 0))  # (B, T + 1)
    t = torch.arange(1, a.shape[-1] + 1, device=a.device)
    lo = (t - window).clamp_min(0)
    return (c[:, t] - c[:, lo]) / (t - lo)
