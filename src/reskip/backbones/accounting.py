"""Parameter accounting without weights: the backbone is built on the meta device.

Shipped architecture configs (hyperparameters only, no weights) make well-known
names work offline: see `reskip/backbones/archs/*.json`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ..lora_ranks import matched_lora_config
from .. import compat
from ..errors import ModelNotFoundError
from ..ar_retrofit.blocks import inclusive_ranges, retrofit_blocks
from ..ar_retrofit.config import RetrofitConfig, check_rank
from ..ar_retrofit.side_channel import SideChannel

ARCHS = "reskip.backbones"  # the package whose archs/ folder holds the shipped configs


def shipped_architectures() -> dict[str, str]:
    """lower-case name -> shipped file name (without .json)."""
    folder = resources.files(ARCHS) / "archs"
    return {p.name[:-5].lower(): p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json")}


def architecture_config(name_or_path: str):
    """A transformers config from a shipped name, a config.json, or a model folder (no weights)."""
    shipped = shipped_architectures()
    path = Path(name_or_path).expanduser()
    if name_or_path.lower() in shipped:
        text = (resources.files(ARCHS) / "archs" / f"{shipped[name_or_path.lower()]}.json").read_text()
    elif path.is_file():
        text = _read_text(path)
    elif (path / "config.json").is_file():
        text = _read_text(path / "config.json")
    else:
        raise ModelNotFoundError(
            f"unknown backbone {name_or_path!r}: give a config.json, a model folder, or one of "
            f"{sorted(shipped.values())}"
        )
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelNotFoundError(f"{name_or_path} is not a JSON model config ({e.msg} at line {e.lineno}); "
                                 f"give a config.json, a model folder, or one of {sorted(shipped.values())}") from e
    if not isinstance(data, dict):
        raise ModelNotFoundError(f"{name_or_path}: a model config is a JSON object, got {type(data).__name__}")
    model_type = data.pop("model_type", None)
    if model_type is None:
        raise ModelNotFoundError(f"{name_or_path}: the config has no model_type")
    compat.check_supported(SimpleNamespace(model_type=model_type))  # before transformers reads the rest
    try:
        return AutoConfig.for_model(model_type, **data)
    except (TypeError, ValueError) as e:
        raise ModelNotFoundError(f"{name_or_path}: transformers cannot build a {model_type} config from it ({e})") from e


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ModelNotFoundError(f"cannot read {path} as a model config ({e})") from e


@dataclass
class ParamReport:
    backbone: str
    family: str
    backbone_params: int
    new_params: int
    rank: int
    blocks: list[list[int]]
    shortcut_params: int = 0  # of new_params: the skip path's shortcuts S_n (0 for the identity)
    shortcut_rank: int | None = None
    inner_lora_params: int = 0  # of new_params: the LoRA inside the blocks (`RetrofitConfig.inner_lora`)

    @property
    def fraction(self) -> float:
        return self.new_params / self.backbone_params

    def to_dict(self) -> dict:
        return {
            "backbone": self.backbone,
            "family": self.family,
            "backbone_params": self.backbone_params,
            "new_params": self.new_params,
            "fraction": self.fraction,
            "percent": 100 * self.fraction,
            "rank": self.rank,
            "n_blocks": len(self.blocks),
            "blocks": self.blocks,
            "shortcut_params": self.shortcut_params,
            "shortcut_rank": self.shortcut_rank,
            "inner_lora_params": self.inner_lora_params,
        }


def count_params(config, retrofit_config: RetrofitConfig, name: str = "") -> ParamReport:
    """Backbone parameters on the meta device, side-channel parameters by building it."""
    check_rank(retrofit_config, config.hidden_size)
    blocks = retrofit_blocks(config.num_hidden_layers, retrofit_config.block_size, retrofit_config.boundaries)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    # parameters() de-duplicates tied weights (embeddings shared with the LM head).
    backbone = sum(p.numel() for p in model.parameters())
    with torch.device("meta"):
        side = SideChannel(config.hidden_size, len(blocks), retrofit_config)
    new = sum(p.numel() for p in side.parameters())
    shortcut = sum(p.numel() for m in side.shortcut_modules() for p in m.parameters())
    lora = matched_lora_config(model, retrofit_config.inner_lora)[1]["parameters"] if retrofit_config.inner_lora else 0
    new += lora
    return ParamReport(
        backbone=name or config.model_type,
        family=config.model_type,
        backbone_params=backbone,
        new_params=new,
        rank=side.rank,
        blocks=inclusive_ranges(blocks),
        shortcut_params=shortcut,
        shortcut_rank=side.shortcut_rank,
        inner_lora_params=lora,
    )
