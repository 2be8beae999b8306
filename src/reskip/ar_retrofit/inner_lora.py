"""A LoRA inside the frozen blocks, carried by the retrofit beside its side-channel (`RetrofitConfig.inner_lora`):
does routing add anything on top of what a LoRA does, at the same trainable parameters in all?

PEFT's LoRA layers are injected into every linear projection of the decoder layers (the ranks that match the
asked parameter count: `lora_ranks.matched_lora_config`), before the retrofit wraps those layers. B = 0 at the
start, so the retrofitted model is still the backbone exactly; the LoRA's weights are float32 over a backbone of
any dtype (as the baselines' LoRA). The teacher pass and the `backbone` method switch it off with the
side-channel (`ReskipModel.side_channel_disabled`). Its tensors are saved in the adapter's safetensors beside the
side-channel's, under `inner_lora.<layer>.<module path>` names that do not depend on the wrappers.
"""

from __future__ import annotations

import contextlib
import sys

from torch import nn

from .. import compat

PREFIX = "inner_lora."


def _lora_layer_class():
    from peft.tuners.lora import LoraLayer  # lazy: a retrofit without an inner LoRA never imports PEFT

    return LoraLayer


def inject(base_model: nn.Module, params: int) -> dict:
    """Put a fresh LoRA of about `params` parameters into `base_model`'s decoder layers (in place); its accounting."""
    from peft import inject_adapter_in_model  # lazy: PEFT only for a retrofit that asks for an inner LoRA

    from ..lora_ranks import matched_lora_config  # lazy: as above (it builds PEFT's LoraConfig)

    config, accounting = matched_lora_config(base_model, params)
    inject_adapter_in_model(config, base_model)
    for layer in lora_layers(base_model):
        layer.lora_A.float()
        layer.lora_B.float()
    return accounting


def lora_layers(base_model: nn.Module) -> list:
    """The PEFT LoRA layers inside `base_model` (none where PEFT's LoRA was never imported: nothing can hold one)."""
    if "peft.tuners.lora" not in sys.modules:
        return []
    cls = _lora_layer_class()
    return [m for m in base_model.modules() if isinstance(m, cls)]


def parameters(base_model: nn.Module) -> list[nn.Parameter]:
    """The LoRA's own parameters: chosen by structure (the LoRA layers' A and B), never by name."""
    return [p for layer in lora_layers(base_model) for part in (layer.lora_A, layer.lora_B) for p in part.parameters()]


def _named_layers(base_model: nn.Module):
    """(stable name, LoRA layer): the name is `<decoder layer index>.<path inside it>`, wrappers left out."""
    cls = _lora_layer_class()
    for i, layer in enumerate(compat.decoder_layers(base_model)):
        inner = getattr(layer, "layer", layer)  # a retrofit's BlockLayer holds the layer as `.layer`
        for path, m in inner.named_modules():
            if isinstance(m, cls):
                yield f"{i}.{path}", m


def state_dict(base_model: nn.Module) -> dict:
    out = {}
    for name, layer in _named_layers(base_model):
        for part in ("lora_A", "lora_B"):
            for key, t in getattr(layer, part).state_dict().items():  # "default.weight"
                out[f"{PREFIX}{name}.{part}.{key}"] = t
    return out


def load_state_dict(base_model: nn.Module, state: dict) -> None:
    expected = state_dict(base_model)
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise KeyError(f"inner LoRA tensors: missing {missing[:3]}, unexpected {unexpected[:3]}")
    for name, layer in _named_layers(base_model):
        for part in ("lora_A", "lora_B"):
            prefix = f"{PREFIX}{name}.{part}."
            getattr(layer, part).load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})


@contextlib.contextmanager
def disabled(base_model: nn.Module):
    """The backbone's own projections for the passes inside (every LoRA layer off), then back on."""
    layers = lora_layers(base_model)
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def remove(base_model: nn.Module) -> None:
    """Put the backbone's own linear modules back in place of the LoRA layers."""
    cls = _lora_layer_class()
    for parent in list(base_model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, cls):
                setattr(parent, child_name, child.get_base_layer())
