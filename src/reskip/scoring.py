"""Scoring with a skip policy (whole text or chunks), generation, and the no-cache reference.

The reference recomputes a whole sequence in one pass without a KV cache, skipping block n
exactly at the positions of the steps where the policy skipped it (layers run on every
position and the skipped positions keep their input). With K/V for skipped positions
computed from the block's unchanged input (see `compat.append_kv`), the cached step-by-step
run and the reference give the same logits; tests check it on Llama, Qwen3, Gemma-3 and the
bundled model.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from . import compat
from .model import ReskipModel
from .skipping import SkipPolicy, StepTrace


def trace_masks(trace: list[StepTrace], shape: tuple[int, int]) -> dict[int, torch.Tensor]:
    """Per block, a (B, T) bool mask of the positions whose step skipped it."""
    masks: dict[int, torch.Tensor] = {}
    for t in trace:
        for n in t.skipped:
            m = masks.setdefault(n, torch.zeros(shape, dtype=torch.bool))
            m[:, t.start : t.start + t.length] = True
    return masks


@torch.no_grad()
def reference_logits(model: ReskipModel, input_ids, trace: list[StepTrace], attention_mask=None) -> torch.Tensor:
    """Logits (B, T, V) of one cache-free pass that makes the trace's decisions."""
    masks = {n: m.to(input_ids.device) for n, m in trace_masks(trace, tuple(input_ids.shape)).items()}
    with model.skipping_positions(masks):
        return model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


@torch.no_grad()
def score(model: ReskipModel, input_ids, policy: SkipPolicy, window: int, chunk_size: int | None = None,
          attention_mask=None) -> tuple[torch.Tensor, list[StepTrace]]:
    """Logits (B, T, V) under `policy`: one step for the whole text, or one step per chunk (with a cache)."""
    with model.skipping(policy, window) as runtime:
        if chunk_size is None or chunk_size >= input_ids.shape[1]:
            logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        else:
            cache, parts = DynamicCache(), []
            for lo in range(0, input_ids.shape[1], chunk_size):
                hi = lo + chunk_size
                mask = attention_mask[:, :hi] if attention_mask is not None else None
                out = model(input_ids=input_ids[:, lo:hi], attention_mask=mask, use_cache=True,
                            **{compat.cache_kwarg(): cache})
                parts.append(out.logits)
            logits = torch.cat(parts, dim=1)
        return logits, list(runtime.trace)


@torch.no_grad()
def generate(model: ReskipModel, input_ids, policy: SkipPolicy, window: int, attention_mask=None, **kwargs):
    """`generate()` under a policy. Returns (generate output, trace); trace[i] produced new token i."""
    with model.skipping(policy, window) as runtime:
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return out, list(runtime.trace)
