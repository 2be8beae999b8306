"""The diagnose and report stages' options: typed objects, each field with its help, default and range (no torch
here)."""

from __future__ import annotations

from dataclasses import dataclass

from ...config_fields import described
from ...options import StageOptions


@dataclass
class DiagnoseOptions(StageOptions):
    data: list[str] | None = described(None, "data specs (None: the run's own); the test split is read, and the "
                                             "calibration split for the cost probes")
    sequences: int = described(4, "test sequences for dilution and routing health", low=1)
    out: str | None = described(None, "the diagnostics file (None: RUN/diagnostics.json)")
    context: int = described(4096, "context length of the depth-state memory table", low=1)
    sample_tokens: int = described(96, "tokens of the per-token skip trace", low=1)
    signal_sequences: int = described(8, "test sequences of the signal test (0: not run)", low=0)
    quiet: bool = described(False, "no progress lines")
    probe_sequences: int = described(
        128, "calibration sequences the signal test's cost probes (a ridge and an MLP on h_{n-1}, "
             "`analysis.cost_probe`) are fitted on (0: no probe chooser)", low=0)


@dataclass
class ReportOptions:
    out: str | None = described(None, "the report's folder (None: RUN/report)")
