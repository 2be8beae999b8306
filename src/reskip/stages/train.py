"""`reskip train`: the one training loop (`reskip.train.run`) on a configuration."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config_fields import described
from ..train_config import TrainConfig


@dataclass
class TrainStageOptions:
    """What `reskip train` runs: the training configuration, and how it treats the folder."""

    config: TrainConfig = described(default_factory=TrainConfig, help="the training configuration")
    resume: bool = described(False, "continue the folder's own run from its last checkpoint")
    overwrite: bool = described(False, "replace another training run's files in the folder")
    quiet: bool = described(False, "no progress bar")


def train(run: Path, options: TrainStageOptions) -> Path | None:
    """Train into `run`; summary.json's path (None in the other processes of a data-parallel job)."""
    from ..train.run import train_run  # lazy: torch

    return train_run(run, options.config, resume=options.resume, show_progress=not options.quiet,
                     overwrite=options.overwrite)
