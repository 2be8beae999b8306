"""Skip policies and the runtime that applies them step by step.

A step is one forward over new tokens (a prefill, one decode token, or a chunk). Before
block n runs, its router has produced alpha_{n-1 -> n} for the step's tokens; the runtime
keeps, per block, the most recent W of these values per sequence (the window may reach
into earlier steps), forms w_recent(n), and asks the policy whether to skip block n for
this step. The whole batch shares one decision: w_recent is averaged over the batch's
sequences (padding excluded), so a skipped block saves compute for every row.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch


class SkipPolicy:
    """Decides, per step and block, whether block n is replaced by identity."""

    name = "none"

    def skip(self, n: int, w_recent: float, skipped_so_far: int, step: int) -> bool:
        return False

    def describe(self) -> dict:
        return {"policy": self.name}


class NoSkip(SkipPolicy):
    name = "none"


@dataclass
class ReSkip(SkipPolicy):
    """Skip n when w_recent(n) > tau_n and n is eligible and fewer than max_skips were skipped this step."""

    tau: dict[int, float]
    eligible: set[int]
    max_skips: int
    name: str = "reskip"

    def skip(self, n, w_recent, skipped_so_far, step):
        return n in self.eligible and skipped_so_far < self.max_skips and w_recent > self.tau[n]

    def describe(self):
        return {"policy": self.name, "max_skips": self.max_skips, "eligible": sorted(self.eligible),
                "tau": {str(k): v for k, v in sorted(self.tau.items())}}


@dataclass
class StaticSkip(SkipPolicy):
    """The same blocks for every step (static pruning)."""

    blocks: set[int]
    name: str = "static"

    def skip(self, n, w_recent, skipped_so_far, step):
        return n in self.blocks

    def describe(self):
        return {"policy": self.name, "blocks": sorted(self.blocks)}


@dataclass
class RandomSkip(SkipPolicy):
    """Each eligible block skipped with probability p, independently per decision; seeded, so a
    run is reproducible given the order of decisions."""

    p: float
    eligible: set[int]
    seed: int = 0
    name: str = "random"

    def __post_init__(self):
        self.rng = random.Random(self.seed)

    def skip(self, n, w_recent, skipped_so_far, step):
        return n in self.eligible and self.rng.random() < self.p

    def describe(self):
        return {"policy": self.name, "p": self.p, "eligible": sorted(self.eligible), "seed": self.seed}


@dataclass
class StepTrace:
    """Which blocks ran at one step. `start` is the position of the step's first token."""

    step: int
    start: int
    length: int
    skipped: list[int] = field(default_factory=list)
    w_recent: dict[int, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"step": self.step, "start": self.start, "length": self.length, "skipped": self.skipped,
                "w_recent": {str(k): v for k, v in self.w_recent.items()}}


class SkipRuntime:
    """Per-sequence state of a policy: alpha history per block, the step counter, the trace."""

    def __init__(self, policy: SkipPolicy, window: int):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.policy = policy
        self.window = window
        self.trace: list[StepTrace] = []
        self.history: dict[int, torch.Tensor] = {}  # n -> (B, <= W) most recent values, NaN = none
        self.padded: set[int] = set()  # blocks whose history holds NaN (padding) somewhere
        self.position = 0
        self.valid: torch.Tensor | None = None  # (B, T) real tokens of the current step

    def reset(self) -> None:
        self.history, self.padded, self.position, self.trace = {}, set(), 0, []

    def set_step_mask(self, valid: torch.Tensor | None, new_sequence: bool) -> None:
        """Called before each forward with the step's (B, T) mask of real tokens (None: all real)."""
        if new_sequence:
            self.reset()
        self.valid = valid

    def begin_step(self, length: int) -> None:
        self.trace.append(StepTrace(len(self.trace), self.position, length))
        self.position += length

    def decide(self, n: int, alpha_prev: torch.Tensor | None) -> bool:
        """alpha_prev: (B, T) weights of block n on h_{n-1} for this step's tokens (None for block 1)."""
        current = self.trace[-1]
        w = float("nan")
        if alpha_prev is not None:
            w = self._update(n, alpha_prev.detach().float())
            current.w_recent[n] = w
        if self.policy.skip(n, w, len(current.skipped), current.step):
            current.skipped.append(n)
            return True
        return False

    def _update(self, n: int, alpha: torch.Tensor) -> float:
        """Append this step's alpha (B, T) to block n's history; return w_recent averaged over rows.

        Padding positions are stored as NaN and sorted to the front of each row, so the last W
        columns hold each row's W most recent real values (vectorised: no per-row loop).
        """
        valid = self.valid if self.valid is not None and self.valid.shape == alpha.shape else None
        if valid is not None and bool(valid.all()):
            valid = None
        vals = alpha if valid is None else alpha.masked_fill(~valid, float("nan"))
        hist = self.history.get(n)
        hist = vals if hist is None else torch.cat([hist, vals], dim=1)
        padded = valid is not None or n in self.padded
        if padded:
            self.padded.add(n)
            order = torch.argsort((~torch.isnan(hist)).to(torch.int8), dim=1, stable=True)
            hist = hist.gather(1, order)
        hist = hist[:, -self.window :]
        self.history[n] = hist
        if not padded:  # the common decode case: no NaN anywhere
            return float(hist.mean())
        rows = hist.nanmean(dim=1)  # (B,): NaN for a row with no real token yet
        return float(rows.nanmean()) if not torch.isnan(rows).all() else 0.0

    def skipped_per_step(self) -> list[int]:
        return [len(t.skipped) for t in self.trace]
