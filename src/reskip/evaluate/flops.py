"""Multiply-add counts of the backbone's layers, to report the share of layer FLOPs executed.

Counted: the weight matrices of each decoder layer (attention projections and the gated
MLP), 2 FLOPs per multiply-add, per token. Not counted: attention scores (they grow with
context and are the same for every method at a given length), norms, rotary, the LM head
and the side-channel (reported separately). Counted when a block is skipped: its learned
shortcut S_n, if the retrofit has one (`shortcut_flops`). A skipped layer still computes its k/v
projections for the cache (see `reskip.ar_retrofit.kv_cache`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerFlops:
    full: int  # per token, one whole decoder layer
    kv_only: int  # per token, the k/v projections a skipped layer still computes

    @classmethod
    def of(cls, config) -> "LayerFlops":
        d = config.hidden_size
        head_dim = getattr(config, "head_dim", None) or d // config.num_attention_heads
        q = config.num_attention_heads * head_dim
        kv = config.num_key_value_heads * head_dim
        attn = d * q + 2 * d * kv + q * d
        mlp = 3 * d * config.intermediate_size
        return cls(full=2 * (attn + mlp), kv_only=2 * 2 * d * kv)


def executed_share(blocks: list[range], blocks_skipped_per_step: list[list[int]], tokens_per_step: list[int],
                   flops: LayerFlops, shortcut: dict[int, int] | None = None) -> tuple[float, float]:
    """(executed layer FLOPs, dense layer FLOPs) over the steps of one scored sequence. shortcut: per
    block, the FLOPs per token of its skip shortcut S_n, paid when it is skipped (`shortcut_flops`)."""
    sizes = {n: len(b) for n, b in enumerate(blocks, start=1)}
    n_layers = sum(sizes.values())
    shortcut = shortcut or {}
    executed = dense = 0.0
    for skipped, tokens in zip(blocks_skipped_per_step, tokens_per_step):
        skipped_layers = sum(sizes[n] for n in skipped)
        executed += tokens * ((n_layers - skipped_layers) * flops.full + skipped_layers * flops.kv_only
                              + sum(shortcut.get(n, 0) for n in skipped))
        dense += tokens * n_layers * flops.full
    return executed, dense


def shortcut_flops(hidden_size: int, rank: int | None) -> int:
    """Per token, a skipped block's shortcut S_n (W_down and W_up, 2 FLOPs per MAC); 0 for the identity."""
    return 0 if rank is None else 2 * 2 * hidden_size * rank


def side_channel_flops(hidden_size: int, rank: int, n_blocks: int) -> int:
    """Per token: routers (n sources x d each) and adapters (2 d r) of blocks 2..N, 2 FLOPs per MAC."""
    return sum(2 * (n * hidden_size + 2 * hidden_size * rank) for n in range(2, n_blocks + 1))
