"""`reskip diagnose`: the routing's health, the signal test and the memory table (`reskip.research.diagnose`)."""

from __future__ import annotations

from pathlib import Path

from ..research.report.options import DiagnoseOptions


def diagnose(run: Path, options: DiagnoseOptions) -> Path:
    """Diagnose the run; diagnostics.json's path."""
    from ..research.diagnose import diagnose_run  # lazy: torch

    return diagnose_run(run, options)
