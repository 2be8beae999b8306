"""`reskip parity --out RUN`: the retrofit at its identity against the backbone, to the bit (`reskip.research.parity`)."""

from __future__ import annotations

from pathlib import Path

from ..options import ParityOptions


def parity(run: Path, options: ParityOptions) -> Path:
    """Check step-zero parity into `run`; parity.json's path."""
    from ..research.parity import parity_run  # lazy: torch

    return parity_run(run, options)
