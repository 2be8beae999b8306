"""`reskip calibrate`: a ReSkip policy from the calibration split (`reskip.research.calibrate.run`)."""

from __future__ import annotations

from pathlib import Path

from ..research.calibrate.options import CalibrateOptions


def calibrate(run: Path, options: CalibrateOptions) -> Path:
    """Calibrate the run; policy.json's path."""
    from ..research.calibrate.run import calibrate_run  # lazy: torch

    return calibrate_run(run, options)
