"""The skip runtimes with their state on the model's device: no host synchronisation inside the block loop.

`runtime.SkipRuntime` and `runtime.RowsRuntime` read each router's alpha back to the host (`tolist`) and keep the
windows as Python floats: on a CPU that is the cheapest way (a host read costs nothing there), but on a GPU every
read waits for the device, once per block. These runtimes compute the same numbers on the device:

- `DeviceWindows`: per block, each row's W most recent real values of alpha_{n-1 -> n} as a (B, W) float64 tensor
  with its (B, W) mask of filled slots, and w_recent per row and averaged over rows, summed in the host runtime's
  order (float64, left to right), so on a CPU they are the host runtime's numbers exactly.
- `DeviceSkipRuntime` (one decision for the batch, generation and `score`): Python must branch to leave a block's
  layers out, so a decision reads one value, w_recent(n), and only where the policy reads it (an eligible block
  while the step's cap is not reached: `SkipPolicy.reads_now`); every other block costs no read.
- `DeviceRowsRuntime` (each row decides for itself, evaluation): the decision is a (B,) mask computed on the device
  (`SkipPolicy.skip_rows`), the block runs and is the identity on the skipping rows: no read at all in the block
  loop.

The traces' values are read once, when `trace` (or `traces`) is first asked for after a step: one read per call."""

from __future__ import annotations

import torch

from .runtime import Decider, StepTrace, Tracking


class DeviceWindows:
    """Per block: (values (B, W) float64, filled (B, W) bool), each row's most recent real values oldest first."""

    def __init__(self, window: int):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.blocks: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def reset(self) -> None:
        self.blocks = {}

    def update(self, n: int, alpha: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's alpha_{n-1 -> n} (the last column of alpha (B, T, n)), the positions where `valid`
        (B, T) is False left out; return (per-row w_recent (B,), whether a row has any value yet (B,))."""
        new = alpha[..., -1].to(torch.float64)  # (B, T)
        real_new = torch.ones_like(new, dtype=torch.bool) if valid is None else valid
        old = self.blocks.get(n)
        if old is None:
            values, filled = new, real_new
        else:
            values, filled = torch.cat([old[0], new], dim=1), torch.cat([old[1], real_new], dim=1)
        if valid is not None:  # each row's real values moved to its end, in order (a stable sort of the flags)
            order = torch.sort(filled.to(torch.uint8), dim=1, stable=True).indices
            values, filled = values.gather(1, order), filled.gather(1, order)
        values, filled = values[:, -self.window :], filled[:, -self.window :]  # (B, <= W)
        self.blocks[n] = (values, filled)
        count = filled.sum(dim=1)  # (B,)
        # left to right from zero, as Python's sum() over the row's window: the same float64 on a CPU
        sums = torch.where(filled, values, 0.0).cumsum(dim=1)[:, -1]  # (B,)
        has = count > 0
        return torch.where(has, sums / count.clamp_min(1), 0.0), has

    @staticmethod
    def batch_mean(per_row: torch.Tensor, has: torch.Tensor) -> torch.Tensor:
        """w_recent over the rows that have a value (0.0 when none has), 0-dim float64, summed in row order."""
        total = torch.where(has, per_row, 0.0).cumsum(dim=0)[-1]
        k = has.sum()
        return torch.where(k > 0, total / k.clamp_min(1), 0.0)


def _mask_for(valid: torch.Tensor | None, alpha: torch.Tensor) -> torch.Tensor | None:
    """The step's (B, T) mask of real tokens when it is this alpha's (B, T, n) step's, else None (all real)."""
    return valid if valid is not None and valid.shape == alpha.shape[:2] else None


class _Pending:
    """A trace's w_recent values still on the device: (step trace, block, 0-dim w), read together."""

    def __init__(self):
        self.w: list[tuple[StepTrace, int, torch.Tensor]] = []

    def settle(self) -> None:
        if self.w:
            values = torch.stack([w for *_, w in self.w]).tolist()  # one read for every value of the call
            for (trace, n, _), v in zip(self.w, values):
                trace.w_recent[n] = v
            self.w = []


class DeviceSkipRuntime(Tracking):
    """`runtime.SkipRuntime`'s decisions (one for the batch), its windows on the device."""

    def __init__(self, policy: Decider, window: int, track_all: bool = False):
        super().__init__(policy, window, track_all)
        self.windows = DeviceWindows(window)
        self._reads_now = getattr(policy, "reads_now", None)  # a `Decider` need not say: then every value is read
        self._trace: list[StepTrace] = []
        self._pending = _Pending()
        self.position = 0
        self.valid: torch.Tensor | None = None
        self._new_sequence()

    @property
    def trace(self) -> list[StepTrace]:
        self._pending.settle()
        return self._trace

    def reset(self) -> None:
        self.windows.reset()
        self.position, self._trace, self._pending = 0, [], _Pending()
        self._new_sequence()

    def set_step_mask(self, valid: torch.Tensor | None, new_sequence: bool) -> None:
        if new_sequence:
            self.reset()
        self.valid = valid  # kept on the device whole (no test for "all real": that would be a read)

    def begin_step(self, length: int) -> None:
        self._trace.append(StepTrace(len(self._trace), self.position, length))
        self.position += length

    def decide(self, n: int, alpha: torch.Tensor | None) -> bool:
        current = self._trace[-1]
        w = None
        if alpha is not None and self.is_tracked(n):
            w = DeviceWindows.batch_mean(*self.windows.update(n, alpha, _mask_for(self.valid, alpha)))
        value = float("nan")
        if w is not None:
            if self._reads_now is None or self._reads_now(n, len(current.skipped), current.step):
                value = current.w_recent[n] = float(w)  # the one read: Python branches on it
            else:
                current.w_recent[n] = None  # its place in the block order; the value is read with the trace
                self._pending.w.append((current, n, w))
        if self.policy.skip(n, value, len(current.skipped), current.step):
            current.skipped.append(n)
            return True
        return False

    def skipped_per_step(self) -> list[int]:
        return [len(t.skipped) for t in self.trace]


class DeviceRowsRuntime(Tracking):
    """`runtime.RowsRuntime`'s decisions (each row its own), as (B,) masks on the device: the block always runs and
    is the identity on the rows that skip it (`DepthPass` takes a tensor decision as the rows' mask)."""

    def __init__(self, policy: Decider, window: int, batch: int, track_all: bool = False):
        if not getattr(policy, "pure", False) or not hasattr(policy, "skip_rows"):
            raise ValueError(f"{type(policy).__name__} cannot decide every row of a batch on the device")
        super().__init__(policy, window, track_all)
        self.batch = batch
        self.windows = DeviceWindows(window)
        self.valid: torch.Tensor | None = None
        self.skipped: int | torch.Tensor = 0  # blocks each row skipped this step: one count, or (B,) once rows differ
        self.steps: list[tuple[int, int, dict, dict]] = []  # (start, length, {n: (B,) mask}, {n: (B,) w})
        self._traces: list[list[StepTrace]] | None = None
        self.position = 0

    @property
    def traces(self) -> list[list[StepTrace]]:
        """Per row, its steps; the masks and values read in one go."""
        if self._traces is None or len(self._traces[0]) != len(self.steps):
            self._traces = self._read()
        return self._traces

    def _read(self) -> list[list[StepTrace]]:
        flat = [t for _, _, masks, ws in self.steps for t in (*masks.values(), *ws.values()) if t is not True]
        values = iter(torch.stack([t.to(torch.float64) for t in flat]).tolist() if flat else [])  # (K, B): one read
        out: list[list[StepTrace]] = [[] for _ in range(self.batch)]
        for j, (start, length, masks, ws) in enumerate(self.steps):
            rows_m = {n: [True] * self.batch if m is True else next(values) for n, m in masks.items()}
            rows_w = {n: next(values) for n in ws}
            for b in range(self.batch):
                skipped = [n for n, m in rows_m.items() if m[b]]
                out[b].append(StepTrace(j, start, length, skipped, {n: w[b] for n, w in rows_w.items()}))
        return out

    def set_step_mask(self, valid: torch.Tensor | None, new_sequence: bool) -> None:
        if valid is not None and valid.shape[0] != self.batch:
            raise ValueError(f"a batch of {valid.shape[0]} rows for a runtime of {self.batch}")
        if new_sequence:
            self.windows.reset()
            self.steps, self._traces, self.position = [], None, 0
        self.valid = valid

    def begin_step(self, length: int) -> None:
        self.steps.append((self.position, length, {}, {}))
        self.position += length
        self.skipped = 0

    def decide(self, n: int, alpha: torch.Tensor | None):
        """alpha: (B, T, n) or None (block 1); returns False, True or a (B,) bool mask on alpha's device."""
        _, _, masks, ws = self.steps[-1]
        w = None
        if alpha is not None:
            if alpha.shape[0] != self.batch:
                raise ValueError(f"a batch of {alpha.shape[0]} rows for a runtime of {self.batch}")
            if self.is_tracked(n):
                w, _ = self.windows.update(n, alpha, _mask_for(self.valid, alpha))  # (B,): each row's own w_recent
                ws[n] = w
        decision = self.policy.skip_rows(n, w, self.skipped, len(self.steps) - 1)
        if decision is False:
            return False
        if decision is True:  # every row: the block does not run
            masks[n] = True
            self.skipped = self.skipped + 1
            return True
        masks[n] = decision  # (B,) on the device
        self.skipped = self.skipped + decision.long()
        return decision
