"""`reskip eval`: every method against the backbone (`reskip.evaluate.run`)."""

from __future__ import annotations

from pathlib import Path

from ..evaluate.options import EvalOptions


def evaluate(run: Path, options: EvalOptions) -> Path:
    """Evaluate the run's methods; results.json's path."""
    from ..evaluate.run import evaluate_run  # lazy: torch

    return evaluate_run(run, options)
