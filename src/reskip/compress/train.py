"""Training a healing run: a parameter-matched LoRA on the frozen backbone, or on the backbone with its cheapest
blocks removed (healed static pruning), healed by `ce`, `kd` or `kd+ce` (`compress.objectives`). The training itself is
the one loop's (`stages.train.train_run` with `lora_trainee.LoraBuilder`); this module is what `reskip experiment
baselines` asks of a healing run's folder: train it, resume it when it stopped, read it back when it is finished."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..backbones.dtypes import resolve_dtype_name
from ..errors import ReskipError
from ..reading import read_json
from ..run_folder import RunFolder
from ..train.checkpoint import latest_checkpoint
from ..train.run import train_run
from ..train_config import TrainConfig
from .healing_run import HealingConfig
from .trainee import LoraBuilder


def train_lora(cfg: TrainConfig, healing: HealingConfig, run_dir: Path, show_progress: bool = True) -> dict:
    """Train the healing into `run_dir`; a finished run with the same config is returned as it is, a stopped one
    resumed from its newest checkpoint. Returns summary.json's content."""
    files = RunFolder(run_dir)
    cfg = dataclasses.replace(cfg, dtype=resolve_dtype_name(cfg.dtype))
    builder = LoraBuilder(healing)
    if files.config.is_file():
        recorded = builder.recorded_identity(files.config)
        recorded["dtype"] = resolve_dtype_name(recorded["dtype"])
        asked = builder.identity(cfg)
        if recorded != asked:
            differ = sorted({k for k in (*recorded, *asked) if recorded.get(k) != asked.get(k)})
            if differ == ["lora"]:
                differ = sorted({k for k in (*recorded["lora"], *asked["lora"])
                                 if recorded["lora"].get(k) != asked["lora"].get(k)})
            raise ReskipError(f"{files.root} holds a healing run of other settings ({', '.join(differ)} differ in its "
                              "config.yaml): choose another folder, or remove it to train again")
        if files.summary.is_file() and (files.adapter / "adapter_model.safetensors").is_file():
            return read_json(files.summary)
    resume = latest_checkpoint(files.root) is not None
    train_run(files.root, cfg, resume=resume, show_progress=show_progress, overwrite=not resume, builder=builder)
    return read_json(files.summary)
