"""Finding what a run folder holds: the adapter, its training config, its policy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .adapter_io import CONFIG_NAME, load_adapter
from .backbones import load_backbone
from .errors import AdapterError
from .train_config import TrainConfig


@dataclass
class AdapterSource:
    adapter_dir: Path
    run_dir: Path | None
    train_config: TrainConfig | None

    @property
    def policy_path(self) -> Path:
        return (self.run_dir or self.adapter_dir) / "policy.json"

    def policy(self, path: Path | None = None):
        """The calibrated PolicyFile (at `path`, default the run's policy.json), or None if there is none."""
        from .policy_file import PolicyFile

        path = path or self.policy_path
        return PolicyFile.load(path) if path.is_file() else None

    @property
    def model_name(self) -> str | None:
        return self.train_config.model if self.train_config else None

    @property
    def data_specs(self) -> list[str]:
        return self.train_config.data if self.train_config else ["default"]


def resolve_adapter(path) -> AdapterSource:
    """A training run folder (with adapter/ and config.yaml) or a bare adapter folder."""
    path = Path(path)
    if (path / "adapter" / CONFIG_NAME).is_file():
        cfg = TrainConfig.from_yaml((path / "config.yaml").read_text()) if (path / "config.yaml").is_file() else None
        return AdapterSource(path / "adapter", path, cfg)
    if (path / CONFIG_NAME).is_file():
        return AdapterSource(path, None, None)
    raise AdapterError(f"{path} is neither a run folder (with adapter/) nor an adapter folder (with {CONFIG_NAME})")


def load_retrofitted(source: AdapterSource, model: str | None = None, dtype=torch.float32,
                     trust_remote_code: bool = False):
    """(ReskipModel, tokenizer) for the source's adapter on its backbone (or `model`)."""
    base, tokenizer = load_backbone(model or source.model_name, dtype, trust_remote_code)
    return load_adapter(base, source.adapter_dir), tokenizer
