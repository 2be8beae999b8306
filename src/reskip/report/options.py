"""The diagnose stage's options: one typed object whose defaults are the CLI's (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DiagnoseOptions:
    """context: tokens for the depth-state memory table. sequences: test sequences for dilution.
    sample_tokens: tokens of the per-token skip trace. signal_sequences: test sequences of the signal
    test (0: not run). probe_sequences: calibration sequences the signal test's cost probes are fitted on
    (0: no probe chooser; `analysis.cost_probe`). model: backbone (None: the run's). dtype: the backbone's compute dtype (auto:
    bfloat16 where the hardware computes it fast, else float32)."""

    context: int = 4096
    sequences: int = 4
    sample_tokens: int = 96
    signal_sequences: int = 8
    probe_sequences: int = 128
    model: str | None = None
    dtype: str = "auto"
    out: str | None = None
