"""A baseline arm's record and its loader: what `reskip experiment baselines` trains beside the recipe (a LoRA on
the frozen backbone, or on the backbone with layers removed: healed static pruning), how its config.yaml says so,
and how a trained arm opens as a model (scoring: `evaluate.scorers`; export: `baselines.export`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import yaml
from peft import PeftModel

from ..backbones.loading import load_backbone
from ..config_fields import described
from ..errors import ReskipError
from ..reading import read_yaml
from ..runs import RunFolder
from ..train_config import TrainConfig, load_yaml
from .pruning import prune


@dataclass
class LoraArm:
    """What a baseline trains, beside the shared TrainConfig (`TrainConfig.lr` etc.; its retrofit keys unused)."""

    params: int = described(help="trainable parameters to match (the side-channel's count on this backbone)",
                            default=0)
    drop_layers: list[int] = described(help="decoder layers removed before healing (empty: a plain LoRA)",
                                       default_factory=list)
    drop_blocks: list[int] = described(help="the blocks those layers form (for the record)", default_factory=list)
    objective: str = described("ce", "the healing objective: ce (cross-entropy on the mix), kd (KL(backbone || "
                                     "model) on every position, the backbone as the teacher) or kd+ce",
                               choices=("ce", "kd", "kd+ce"))
    temperature: float = described(1.0, "kd's temperature T (the KL of logits / T, scaled by T^2)", low=0.05,
                                   high=100.0)


def arm_config_text(cfg: TrainConfig, arm: LoraArm) -> str:
    return yaml.safe_dump({"train": cfg.to_dict(), "lora": dataclasses.asdict(arm)}, sort_keys=False)


def read_arm(run_dir: Path) -> tuple[TrainConfig, LoraArm]:
    """A baseline run's config.yaml -> (TrainConfig, LoraArm)."""
    if not RunFolder(run_dir).config.is_file():
        raise ReskipError(f"{run_dir} is not a finished baseline run (no config.yaml): a LoRA or healed-static arm of "
                          "`reskip experiment baselines` has one")
    data = read_yaml(RunFolder(run_dir).config, load_yaml)
    if not isinstance(data, dict) or not {"train", "lora"} <= set(data):
        raise ReskipError(f"{run_dir} is not a finished baseline run: its config.yaml has no train: and lora: (a "
                          "LoRA or healed-static arm of `reskip experiment baselines` has)")
    return TrainConfig.from_dict(data["train"]), LoraArm(**data["lora"])


def load_arm_model(run_dir: Path, dtype: str | None = None, device: str = "auto", trust_remote_code: bool = False):
    """A trained baseline run as (model with its LoRA, tokenizer) on `device`: the backbone loaded, pruned as
    recorded and the PEFT adapter applied. The model's own Python code runs only with the caller's
    `trust_remote_code` (the user's flag), never because the arm's config.yaml says so: an arm someone shared runs
    no code on the machine that opens it."""
    cfg, arm = read_arm(run_dir)
    base, tokenizer = load_backbone(cfg.model, dtype or cfg.dtype, trust_remote_code, device)
    if arm.drop_layers:
        prune(base, set(arm.drop_layers))
    model = PeftModel.from_pretrained(base, RunFolder(run_dir).adapter, autocast_adapter_dtype=True)
    model.eval()
    return model, tokenizer
