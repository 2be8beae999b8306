"""The runtime that applies a skip policy step by step.

A step is one forward over new tokens (a prefill, one decode token, or a chunk). Before
block n runs, its router has produced alpha_{n-1 -> n} for the step's tokens; the runtime
keeps, per block, the most recent W of these values per sequence (the window may reach
into earlier steps), forms w_recent(n), and asks the policy whether to skip block n for
this step. The whole batch shares one decision: w_recent is averaged over the batch's
sequences (padding excluded), so a skipped block saves compute for every row. `RowsRuntime`
instead lets each row of a batch of independent sequences decide for itself (evaluation).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import torch


class Decider(Protocol):
    """What the runtime needs of a policy (`policies.SkipPolicy`)."""

    def skip(self, n: int, w_recent: float, skipped_so_far: int, step: int) -> bool: ...

    def reads_signal(self, n: int) -> bool: ...


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


_WHOLE_TRANSFER = 1024  # up to this many alpha values, copy them all rather than slice first


class Tracking:
    """What every runtime keeps of its policy: which blocks' signal it tracks (the ones the policy reads, or every
    one with `track_all`), asked once per block, and the policy's hook at each new sequence."""

    def __init__(self, policy: Decider, window: int, track_all: bool = False):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.policy = policy
        self.window = window
        self.track_all = track_all
        self.tracked: dict[int, bool] = {}  # n -> whether block n's signal is kept

    def is_tracked(self, n: int) -> bool:
        tracked = self.tracked.get(n)
        if tracked is None:
            tracked = self.tracked[n] = self.track_all or self.policy.reads_signal(n)
        return tracked

    def _new_sequence(self) -> None:
        hook = getattr(self.policy, "new_sequence", None)  # a `Decider` need not have one
        if hook is not None:
            hook()


class SkipRuntime(Tracking):
    """Per-sequence state of a policy: alpha history per block, the step counter, the trace.

    The decision is taken on the host before a block runs, so each router's alpha_{n-1 -> n}
    for the step comes over once (`tolist`); the history is then a few Python floats per row.
    This keeps the per-block cost at decode to about one small transfer instead of several
    tensor ops (the router's overhead budget is a few percent of a decode step). Only the
    blocks whose signal the policy reads are tracked (ReSkip: the eligible ones), unless
    `track_all` (diagnostics): the others cost nothing here and have no `w_recent` in the trace.
    """

    def __init__(self, policy: Decider, window: int, track_all: bool = False):
        super().__init__(policy, window, track_all)
        self.trace: list[StepTrace] = []
        self.history: dict[int, list[deque]] = {}  # n -> per row, its W most recent real values
        self.position = 0
        self.valid: list[list[bool]] | None = None  # (B, T) real tokens of the current step; None: all real
        self.valid_shape: tuple[int, int] | None = None
        self._new_sequence()

    def reset(self) -> None:
        self.history, self.position, self.trace = {}, 0, []
        self._new_sequence()

    def set_step_mask(self, valid: torch.Tensor | None, new_sequence: bool) -> None:
        """Called before each forward with the step's (B, T) mask of real tokens (None: all real)."""
        if new_sequence:
            self.reset()
        if valid is None or bool(valid.all()):
            self.valid, self.valid_shape = None, None
        else:
            self.valid, self.valid_shape = valid.tolist(), tuple(valid.shape)

    def begin_step(self, length: int) -> None:
        self.trace.append(StepTrace(len(self.trace), self.position, length))
        self.position += length

    def decide(self, n: int, alpha: torch.Tensor | None) -> bool:
        """alpha: block n's routing weights (B, T, n) for this step's tokens (None for block 1, which
        has no router); the policy reads alpha_{n-1 -> n}, the last column."""
        current = self.trace[-1]
        w = float("nan")
        if alpha is not None and self.is_tracked(n):
            w = self._update(n, alpha)
            current.w_recent[n] = w
        if self.policy.skip(n, w, len(current.skipped), current.step):
            current.skipped.append(n)
            return True
        return False

    def _update(self, n: int, alpha: torch.Tensor) -> float:
        """Append this step's alpha_{n-1 -> n} to block n's history; return w_recent averaged over rows.

        Padding positions are left out, so each row's window holds its W most recent real values;
        a row with none yet does not count, and a batch with none at all gives 0.0.
        """
        if alpha.numel() <= _WHOLE_TRANSFER:  # decode: one transfer, no slicing op
            values = [[a[-1] for a in row] for row in alpha.tolist()]  # B lists of T floats
        else:
            values = alpha[..., -1].tolist()
        valid = self.valid if self.valid_shape == tuple(alpha.shape[:2]) else None
        rows = self.history.get(n)
        if rows is None:
            rows = self.history[n] = [deque(maxlen=self.window) for _ in values]
        means = []
        for b, (hist, row) in enumerate(zip(rows, values)):
            hist.extend(row if valid is None else [v for v, real in zip(row, valid[b]) if real])
            if hist:
                means.append(sum(hist) / len(hist))
        return sum(means) / len(means) if means else 0.0

    def skipped_per_step(self) -> list[int]:
        return [len(t.skipped) for t in self.trace]


class RowsRuntime:
    """B sequences in one batch, each deciding as it would alone: row b has its own `SkipRuntime`
    (its own history, w_recent and skipped-so-far count), fed its own row of alpha. `decide` returns
    True when every row skips block n (its layers do not run), False when none does, and the B
    per-row decisions otherwise (the block runs and is the identity on the skipping rows: the depth
    pass's per-row masks). Only for a policy whose decisions are a pure function of its arguments
    (`SkipPolicy.pure`): rows are asked in turn, not in the order scoring each alone would ask."""

    def __init__(self, policy: Decider, window: int, batch: int, track_all: bool = False):
        if not getattr(policy, "pure", False):
            raise ValueError(f"{type(policy).__name__} keeps state between decisions: its rows cannot decide "
                             "in one batch (score them one at a time)")
        self.rows = [SkipRuntime(policy, window, track_all) for _ in range(batch)]

    @property
    def traces(self) -> list[list[StepTrace]]:
        """Per row, its steps (`SkipRuntime.trace`)."""
        return [r.trace for r in self.rows]

    def set_step_mask(self, valid: torch.Tensor | None, new_sequence: bool) -> None:
        if valid is not None and valid.shape[0] != len(self.rows):
            raise ValueError(f"a batch of {valid.shape[0]} rows for a runtime of {len(self.rows)}")
        for b, r in enumerate(self.rows):
            r.set_step_mask(None if valid is None else valid[b : b + 1], new_sequence)

    def begin_step(self, length: int) -> None:
        for r in self.rows:
            r.begin_step(length)

    def decide(self, n: int, alpha: torch.Tensor | None):
        """alpha: (B, T, n) or None (block 1); returns True, False or B bools (see the class)."""
        if alpha is not None and alpha.shape[0] != len(self.rows):
            raise ValueError(f"a batch of {alpha.shape[0]} rows for a runtime of {len(self.rows)}")
        rows = tuple(r.decide(n, None if alpha is None else alpha[b : b + 1]) for b, r in enumerate(self.rows))
        if all(rows):
            return True
        return rows if any(rows) else False
