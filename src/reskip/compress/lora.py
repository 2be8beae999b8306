"""The baselines' LoRA: PEFT LoRA on every linear projection of the frozen backbone's decoder layers, with the
ranks that match a parameter count (`reskip.lora_ranks`)."""

from __future__ import annotations

from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn


def add_lora(model: nn.Module, config: LoraConfig) -> PeftModel:
    """The model with a fresh LoRA (B = 0: at the start it computes what the model did, exactly); its frozen
    weights stay in their dtype, the LoRA's in float32."""
    return get_peft_model(model, config, autocast_adapter_dtype=True)


def trainable_parameters(model: PeftModel) -> list[nn.Parameter]:
    """The LoRA's own parameters (PEFT leaves exactly those trainable)."""
    return [p for p in model.parameters() if p.requires_grad]
