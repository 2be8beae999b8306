"""Parameter accounting without weights: the backbone is built on the meta device from its config, the
side-channel (and any LoRA inside the blocks) is built to be counted."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM

from ..lora_ranks import matched_lora_config
from .blocks import inclusive_ranges, retrofit_blocks
from .config import RetrofitConfig, check_rank
from .side_channel import SideChannel


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
