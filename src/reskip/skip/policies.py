"""Skip policies: per step and block, whether block n is replaced by identity.

A policy sees w_recent(n) (from `runtime.SkipRuntime`), how many blocks this step already
skipped, and the step number. `none` never skips, `ReSkip` is the source design's rule, `StaticSkip`
is static pruning, `RandomSkip` the random baseline at a given rate.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from .runtime import SkipRuntime


class SkipPolicy:
    """Decides, per step and block, whether block n is replaced by identity."""

    name = "none"
    # pure: each decision a function of skip()'s arguments alone (no state advanced by asking), so the
    # rows of a batch may decide in any order (`runtime.RowsRuntime`). False unless a policy says so.
    pure = False

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
    pure = True

    def reads_signal(self, n):
        return False


@dataclass
class ReSkip(SkipPolicy):
    """Skip n when w_recent(n) > tau_n and n is eligible and fewer than max_skips were skipped this step.

    `always`: eligible blocks skipped at every step whatever their signal (a budgeted allocation
    that drops a whole block, as static pruning does); they still count toward max_skips."""

    tau: dict[int, float]
    eligible: set[int]
    max_skips: int
    name: str = "reskip"
    always: frozenset[int] = frozenset()
    pure = True

    def skip(self, n, w_recent, skipped_so_far, step):
        if n not in self.eligible or skipped_so_far >= self.max_skips:
            return False
        return n in self.always or w_recent > self.tau[n]

    def reads_signal(self, n):
        return n in self.eligible and n not in self.always

    def describe(self):
        out = {"policy": self.name, "max_skips": self.max_skips, "eligible": sorted(self.eligible),
               "tau": {str(k): v for k, v in sorted(self.tau.items()) if k not in self.always}}
        if self.always:
            out["always"] = sorted(self.always)
        return out


@dataclass
class StaticSkip(SkipPolicy):
    """The same blocks for every step (static pruning).

    A fractional count (static:1.5) adds `partial`, skipped at a share `fraction` of the steps,
    spread evenly and deterministically over every step this policy decides, across sequences (its
    c-th decision skips it when floor((c + 1) f) > floor(c f)): a mix of k and k + 1 blocks whose
    mean is k + f to within one step over a whole evaluation. (Counting each sequence's steps from 0
    instead fell short of k + f by up to 1/S on sequences of S steps.)"""

    blocks: set[int]
    name: str = "static"
    partial: int | None = None
    fraction: float = 0.0
    decided: int = field(default=0, init=False, repr=False, compare=False)  # the partial block's decisions so far

    def skip(self, n, w_recent, skipped_so_far, step):
        if n in self.blocks:
            return True
        if n == self.partial:
            c, self.decided = self.decided, self.decided + 1
            return math.floor((c + 1) * self.fraction) > math.floor(c * self.fraction)
        return False

    def reads_signal(self, n):
        return False

    def describe(self):
        out = {"policy": self.name, "blocks": sorted(self.blocks)}
        if self.partial is not None:
            out.update(partial=self.partial, fraction=self.fraction)
        return out


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


@dataclass
class PlannedSkip(SkipPolicy):
    """Decisions fixed in advance: `steps[j]` is the set of blocks skipped at step j of a sequence
    (`plan`). Scoring under it computes exactly what the planned policy would have."""

    steps: list[frozenset[int]]
    name: str = "planned"
    pure = True

    def skip(self, n, w_recent, skipped_so_far, step):
        return n in self.steps[step]

    def reads_signal(self, n):
        return False


def plan(policy: SkipPolicy, n_blocks: int, n_steps: int) -> PlannedSkip | None:
    """The decisions `policy` takes over the next sequence of `n_steps` steps, asked in the runtime's
    order (every step, blocks 1..N), when it reads no block's signal (static, influence, random, a
    budget of whole blocks): its state (a fractional mix's counter, a random draw) advances as if that
    sequence ran. None when it reads a signal: its decisions depend on the model's states."""
    if any(policy.reads_signal(n) for n in range(1, n_blocks + 1)):
        return None
    steps = []
    for j in range(n_steps):
        skipped: list[int] = []
        for n in range(1, n_blocks + 1):
            if policy.skip(n, float("nan"), len(skipped), j):
                skipped.append(n)
        steps.append(frozenset(skipped))
    return PlannedSkip(steps)
