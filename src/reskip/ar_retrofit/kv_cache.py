"""The exact KV cache of skipped layers, and the cache-free reference it is exact against.

A block replaced by identity for a step does not run its layers, but later tokens still attend,
in each of those layers, to the positions of that step: the cache must hold K/V for them. The
default (`append_kv`) computes them from the layer's unchanged input, exactly as the family's own
attention would (input norm, k/v projections, the family's k-norm where it has one, its own
rotary function); it costs the k/v projections only.

"Exact" is defined against `reference_logits`: one pass over the whole sequence without a cache,
in which block n acts as identity exactly at the positions of the steps that skipped it (the
layers run on every position, and the skipped positions keep their input, so their K/V are those
of the unchanged input). A step-by-step run with the cache and this reference give the same
logits; the tests check it on Llama, Qwen3, Gemma-3 and the bundled model, and compare
`append_kv` with each family's own attention.
"""

from __future__ import annotations

from typing import Iterable, Protocol

import torch
from torch import nn

from .. import compat

# Arguments of a decoder layer that `append_kv` passes on by name or must not pass to the cache.
_NAMED = ("cache", "past_key_values", "position_embeddings", "attention_mask", "hidden_states")


def append_kv(layer: nn.Module, hidden: torch.Tensor, kwargs: dict) -> None:
    """For a layer acting as identity: append the K/V its attention would have cached for these positions.

    hidden: the layer's input (B, T, d); kwargs: what the family's loop handed the layer.
    """
    attn = layer.self_attn
    x = layer.input_layernorm(hidden)
    shape = (*x.shape[:-1], -1, attn.head_dim)
    k = attn.k_proj(x).view(shape)
    if hasattr(attn, "k_norm"):
        k = attn.k_norm(k)
    k = k.transpose(1, 2)  # (B, kv_heads, T, head_dim)
    v = attn.v_proj(x).view(shape).transpose(1, 2)
    cos, sin = kwargs["position_embeddings"]
    rotary = compat.rotary_function(attn)
    _, k = rotary(k[:, :1], k, cos, sin)  # the family's rotary; the query slot gets a 1-head dummy
    rest = {key: val for key, val in kwargs.items() if key not in _NAMED}
    compat.layer_cache(kwargs).update(k, v, attn.layer_idx, kwargs=rest)


class Step(Protocol):
    """One step of a skip trace: the position of its first token, its length, the blocks it skipped."""

    start: int
    length: int
    skipped: list[int]


def trace_masks(trace: Iterable[Step], shape: tuple[int, int]) -> dict[int, torch.Tensor]:
    """Per block, a (B, T) bool mask of the positions whose step skipped it."""
    masks: dict[int, torch.Tensor] = {}
    for t in trace:
        for n in t.skipped:
            m = masks.setdefault(n, torch.zeros(shape, dtype=torch.bool))
            m[:, t.start : t.start + t.length] = True
    return masks


@torch.no_grad()
def reference_logits(model, input_ids: torch.Tensor, trace: Iterable[Step], attention_mask=None) -> torch.Tensor:
    """Logits (B, T, V) of one cache-free pass of `model` (a ReskipModel) that makes the trace's decisions."""
    masks = {n: m.to(input_ids.device) for n, m in trace_masks(trace, tuple(input_ids.shape)).items()}
    with model.skipping_positions(masks):
        return model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
