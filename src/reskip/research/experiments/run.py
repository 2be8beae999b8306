"""Running an experiment -> OUT/experiments/NAME/results.json and results.md. Each experiment is one module behind
the name -> module table below, with one interface: `run(options, folder, show) -> dict | None` (the results, or
None while arms left to other processes have not finished). Bad options are refused before any arm trains."""

from __future__ import annotations

import time
from pathlib import Path

from ...config_fields import check_fields
from ...errors import ReskipError
from ...run_folder import RunFolder
from . import (
    baselines,
    block_size,
    depth_request,
    frontier,
    mix,
    nested,
    placement,
    scale,
    stacked,
    variants,
)
from .options import EXPERIMENTS, ExperimentOptions
from .record import write

DEFAULT_OUT = "runs/experiments"
# The one table of experiments (its names are `options.EXPERIMENTS`, which the CLI reads without torch).
MODULES = {"variants": variants, "block-size": block_size, "mix": mix, "placement": placement, "scale": scale,
           "baselines": baselines, "nested": nested, "stacked": stacked, "frontier": frontier,
           "depth-request": depth_request}


def folder_of(options: ExperimentOptions) -> Path:
    return RunFolder(Path(options.out or DEFAULT_OUT)).experiments_dir / options.name


def run_experiment(options: ExperimentOptions, show=print) -> Path | None:
    """Run (or finish) one experiment; returns its results.json, or None while arms that `options.arms` left
    to other processes have not finished (then nothing is written but the chosen arms' folders)."""
    if options.name not in EXPERIMENTS:
        raise ReskipError(f"unknown experiment {options.name!r}; valid: {', '.join(EXPERIMENTS)}")
    check_fields(options)
    folder = folder_of(options)
    t0 = time.perf_counter()
    result = MODULES[options.name].run(options, folder, show)
    if result is None:
        return None
    result["wall_s"] = time.perf_counter() - t0
    return write(folder, result)
