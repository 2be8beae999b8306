"""The calibrate stage's options: one typed object, its defaults the CLI's (no torch here, so the
CLI can read the defaults without loading the library)."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_BUDGETS = (0.5, 1.0, 1.5, 2.0, 3.0)  # blocks skipped per step, on average


@dataclass
class CalibrateOptions:
    """delta: eligible when A(n) < 1 + delta. quantile: tau_n = this quantile of w_recent(n).
    window: W, tokens in w_recent. max_skips: M_max, blocks skipped per step at most.
    sequences x seq_len: calibration data (seq_len None: the run's training seq_len, else 256).
    data: data specs (None: the run's); the calib split is used. out: policy file (None: RUN/policy.json).
    budgets: the frontier's target budgets (blocks skipped per step on average; empty: no frontier),
    measured with steps of chunk_size tokens, as `reskip eval` scores (`budget.calibrate_budgets`)."""

    delta: float = 0.2
    quantile: float = 0.5
    window: int = 1
    max_skips: int = 2
    sequences: int = 32
    seq_len: int | None = None
    data: list[str] | None = None
    model: str | None = None
    dtype: str = "auto"  # the backbone's compute dtype: auto (bfloat16 on fast hardware), float32, bfloat16
    trust_remote_code: bool = False
    out: str | None = None
    budgets: tuple[float, ...] = field(default_factory=lambda: DEFAULT_BUDGETS)
    chunk_size: int = 32
