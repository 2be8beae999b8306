"""Skip policies: per step and block, whether block n is replaced by identity.

A policy sees w_recent(n) (from `runtime.SkipRuntime`), how many blocks this step already
skipped, and the step number. `none` never skips, `ReSkip` is the source design's rule, `StaticSkip`
is static pruning, `RandomSkip` the random baseline at a given rate, `SequenceSkip` a choice of blocks
taken once per sequence from its first step's routing.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import deque
from dataclasses import dataclass, field

from .device_runtime import DeviceSkipRuntime
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

    def reads_now(self, n: int, skipped_so_far: int, step: int) -> bool:
        """Whether `skip` reads w_recent(n) in this call: a runtime with its windows on the device reads the value
        back only then (one host read where Python branches). The policies that ignore it past a cap say so."""
        return self.reads_signal(n)

    def describe(self) -> dict:
        return {"policy": self.name}

    def new_sequence(self) -> None:
        """Called by the runtime when a sequence starts (a policy that decides once per sequence forgets the
        last one's choice here); most policies keep nothing per sequence."""

    def runtime(self, window: int, track_all: bool = False, on_device: bool = False):
        """The per-sequence state that applies this policy step by step (`ReskipModel.skipping`): its windows as
        host floats (`runtime.SkipRuntime`, the cheapest on a CPU), or `on_device` as tensors on the model's device
        (`device_runtime.DeviceSkipRuntime`: no host read but where Python branches), the same decisions."""
        if on_device:
            return DeviceSkipRuntime(self, window, track_all)
        return SkipRuntime(self, window, track_all)


class NoSkip(SkipPolicy):
    name = "none"
    pure = True

    def reads_signal(self, n):
        return False

    def skip_rows(self, n, w_recent, skipped_so_far, step):
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

    def skip_rows(self, n, w_recent, skipped_so_far, step):
        """`skip` for every row of a batch on the device: w_recent (B,) float64 (None: block n has no router),
        skipped_so_far an int or (B,) counts; False, True, or a (B,) bool mask."""
        if n not in self.eligible:
            return False
        below = skipped_so_far < self.max_skips  # a bool, or (B,)
        if n in self.always or below is False:
            return below
        return below & (w_recent > self.tau[n])

    def reads_signal(self, n):
        return n in self.eligible and n not in self.always

    def reads_now(self, n, skipped_so_far, step):
        return self.reads_signal(n) and skipped_so_far < self.max_skips

    def describe(self):
        out = {"policy": self.name, "max_skips": self.max_skips, "eligible": sorted(self.eligible),
               "tau": {str(k): v for k, v in sorted(self.tau.items()) if k not in self.always}}
        if self.always:
            out["always"] = sorted(self.always)
        return out


@dataclass
class HeldReSkip(ReSkip):
    """A budgeted ReSkip whose rate is held online: block n's threshold is, at every decision, the quantile
    1 - f_n of the last `span` values of w_recent(n) it saw (f_n: the share of steps the calibration allocated
    to n), so n is skipped at about that share of steps whatever the input's distribution of w_recent: in
    token-by-token decode (steps of one token where calibration measured 32) and on another source, where the
    fixed thresholds drift. The window starts as the calibration's distribution (its quantile grid), so the
    first decisions are the calibrated ones; it is shared by every sequence this policy decides (a deployment's
    stream), so it is not `pure`."""

    share: dict[int, float] = field(default_factory=dict)
    seed_values: dict[int, list[float]] = field(default_factory=dict)
    span: int = 64
    pure = False

    def __post_init__(self):
        def spread(values: list[float]) -> list[float]:  # the grid thinned evenly to the window's length
            if len(values) <= self.span:
                return list(values)
            return [values[round(i * (len(values) - 1) / (self.span - 1))] for i in range(self.span)]

        self.recent = {n: deque(spread(self.seed_values.get(n, [])), maxlen=self.span) for n in self.tau}

    def skip(self, n, w_recent, skipped_so_far, step):
        if n not in self.eligible or skipped_so_far >= self.max_skips:
            return False
        if n in self.always:
            return True
        seen = self.recent[n]
        seen.append(w_recent)
        # the smallest value above which a share f_n of the window lies: skip when this one is among them
        k = max(1, math.ceil(self.share[n] * len(seen)))
        return self.share[n] > 0 and w_recent >= sorted(seen)[-k]

    def describe(self):
        return {**super().describe(), "held": {"share": {str(n): f for n, f in sorted(self.share.items())},
                                               "span": self.span}}


@dataclass
class SequenceSkip(SkipPolicy):
    """Per-sequence selection: the first `prefix_steps` steps of a sequence (its prompt, in generation) run
    every block while block n's w_recent is read; then the K eligible blocks whose routing sat highest against
    their own calibrated distribution (the percentile of the prefix's mean w_recent(n) in block n's calibration
    quantile grid: ReSkip's rule, decided once) are skipped at every later step of that sequence. Fixed for the
    rest of a generation, so a batch can share it and the skipped layers' KV cache is never needed again after
    the prompt. Ties go to the block of lower ablation cost A(n)."""

    k: int
    eligible: set[int]
    grids: dict[int, list[float]]  # block -> its calibration quantile grid of w_recent (ascending)
    cost: dict[int, float]  # block -> A(n), the tie-break
    prefix_steps: int = 1
    name: str = "sequence"

    def __post_init__(self):
        self.new_sequence()

    def new_sequence(self) -> None:
        self.prefix: dict[int, list[float]] = {n: [] for n in self.eligible}
        self.chosen: frozenset[int] | None = None

    def percentile(self, n: int) -> float:
        """Where the prefix's mean w_recent(n) lies in block n's calibration distribution, in [0, 1]."""
        grid, seen = self.grids[n], self.prefix[n]
        if not seen:
            return 0.0
        w = sum(seen) / len(seen)
        below = bisect.bisect_left(grid, w)
        return below / len(grid)

    def reads_now(self, n, skipped_so_far, step):
        return step < self.prefix_steps and n in self.eligible

    def skip(self, n, w_recent, skipped_so_far, step):
        if step < self.prefix_steps:
            if n in self.eligible and w_recent == w_recent:  # nan: a block without a router
                self.prefix[n].append(w_recent)
            return False
        if self.chosen is None:
            ranked = sorted(self.eligible, key=lambda b: (-self.percentile(b), self.cost[b]))
            self.chosen = frozenset(ranked[: self.k])
        return n in self.chosen

    def reads_signal(self, n):
        return n in self.eligible

    def describe(self):
        return {"policy": self.name, "k": self.k, "eligible": sorted(self.eligible), "prefix_steps": self.prefix_steps}


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

    skip_rows = skip  # the same for every row: a bool

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
