"""`reskip run`: the source design's pipeline, stage after stage (`reskip.research.pipeline`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config_fields import described


@dataclass
class RunStageOptions:
    """What `reskip run` runs: the pipeline's configuration (`research.pipeline.PipelineConfig`), and whether the
    folder's own run continues."""

    pipeline: object = described(None, "the pipeline's configuration (a PipelineConfig)", required=True)
    resume: bool = described(False, "continue the folder's run from its last finished stage and checkpoint")


def run(folder: Path, options: RunStageOptions) -> Path:
    """Run (or resume) the pipeline in `folder`; its pipeline.json's path."""
    from ..research.pipeline import run_pipeline  # lazy: torch
    from ..run_folder import RunFolder  # lazy: with the pipeline

    run_pipeline(folder, options.pipeline, resume=options.resume)
    return RunFolder(folder).pipeline
