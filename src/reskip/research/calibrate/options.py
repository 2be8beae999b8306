"""The calibrate stage's options: one typed object, each field with its help, default and range (no torch here, so
the CLI builds its flags from them without loading the library)."""

from __future__ import annotations

from dataclasses import dataclass

from ...config_fields import described
from ...options import DELTA, StageOptions

DEFAULT_BUDGETS = (0.5, 1.0, 1.5, 2.0, 3.0)  # blocks skipped per step, on average


@dataclass
class CalibrateOptions(StageOptions):
    data: list[str] | None = described(None, "data specs (None: the run's own); the calibration split is used")
    sequences: int = described(32, "calibration sequences", low=1)
    out: str | None = described(None, "the policy file (None: RUN/policy.json)")
    delta: float = described(DELTA, "a block is eligible when its ablation cost A(n) < 1 + delta (1.0: every block "
                                    "whose skipping at most doubles perplexity)", low=0.0)
    quantile: float = described(0.5, "tau_n = this quantile of w_recent(n) on the calibration split", low=0.0,
                                high=1.0)
    window: int = described(1, "W: tokens in w_recent, the window mean of the routing weight", low=1)
    max_skips: int = described(2, "M_max: blocks skipped per step at most", low=0)
    budgets: tuple[float, ...] = described(
        default_factory=lambda: DEFAULT_BUDGETS, low=1e-9,
        help="the budget frontier: target mean blocks skipped per step (empty: no frontier), measured with steps "
             "of chunk_size tokens as `reskip eval` scores; used by reskip:budget=B")
    chunk_size: int = described(32, "tokens per step when the budgets are measured, as reskip eval scores", low=1)
    budget_objective: str = described("ppl", "what each budget's thresholds minimise on the calibration split: ppl "
                                             "(the calibration loss) or kl (KL to the backbone per position: fidelity "
                                             "to the model the retrofit came from)", choices=("ppl", "kl"))
