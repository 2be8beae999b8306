"""`reskip experiment NAME`: one experiment's arms and table (`reskip.research.experiments`)."""

from __future__ import annotations

from pathlib import Path

from ..research.experiments.options import ExperimentOptions


def experiment(run: Path | None, options: ExperimentOptions) -> Path | None:
    """Run (or resume) the experiment into `options.out` (`run` unused); results.json's path (None: nothing to do).
    Its progress lines are printed unless `options.quiet`."""
    from ..research.experiments.run import run_experiment  # lazy: torch

    return run_experiment(options, show=(lambda *a, **k: None) if options.quiet else print)
