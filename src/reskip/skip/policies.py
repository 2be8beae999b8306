"""Skip policies: per step and block, whether block n is replaced by identity.

A policy sees w_recent(n) (from `runtime.SkipRuntime`), how many blocks this step already
skipped, and the step number. `none` never skips, `ReSkip` is the seed's rule, `StaticSkip`
is static pruning, `RandomSkip` the random baseline at a given rate.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .runtime import SkipRuntime


class SkipPolicy:
    """Decides, per step and block, whether block n is replaced by identity."""

    name = "none"

    def skip(self, n: int, w_recent: float, skipped_so_far: int, step: int) -> bool:
        return False

    def reads_signal(self, n: int) -> bool:
        """Whether `skip` looks at w_recent(n); the runtime keeps block n's history only if so.
        True unless a policy says otherwise, so a new policy always sees its signal."""
        return True

    def describe(self) -> dict:
        return {"policy": self.name}

    def runtime(self, window: int, track_all: bool = False) -> SkipRuntime:
        """The per-sequence state that applies this policy step by step (`ReskipModel.skipping`)."""
        return SkipRuntime(self, window, track_all)


class NoSkip(SkipPolicy):
    name = "none"

    def reads_signal(self, n):
        return False


@dataclass
class ReSkip(SkipPolicy):
    """Skip n when w_recent(n) > tau_n and n is eligible and fewer than max_skips were skipped this step."""

    tau: dict[int, float]
    eligible: set[int]
    max_skips: int
    name: str = "reskip"

    def skip(self, n, w_recent, skipped_so_far, step):
        return n in self.eligible and skipped_so_far < self.max_skips and w_recent > self.tau[n]

    def reads_signal(self, n):
        return n in self.eligible

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

    def reads_signal(self, n):
        return False

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

    def reads_signal(self, n):
        return False

    def describe(self):
        return {"policy": self.name, "p": self.p, "eligible": sorted(self.eligible), "seed": self.seed}
