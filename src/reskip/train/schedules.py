"""Schedules: pure functions of the step, so a resumed run is the same run."""

from __future__ import annotations

import math
import random

import torch


def curriculum(step: int, total_steps: int, hold_frac: float = 0.02, ramp_end_frac: float = 0.3) -> float:
    """c(t): 0 during the hold, linear to 1 at `ramp_end_frac` of training, then 1.

    At exactly c = 0 only the entropy term reaches the routers (the LM loss multiplies a
    zero gate), which is why the hold is short.
    """
    t = step / max(total_steps, 1)
    if t < hold_frac:
        return 0.0
    if t >= ramp_end_frac:
        return 1.0
    return (t - hold_frac) / (ramp_end_frac - hold_frac)


def learning_rate(step: int, total_steps: int, base_lr: float, warmup_frac: float = 0.05, min_lr_frac: float = 0.1) -> float:
    """Linear warm-up, then cosine decay to `min_lr_frac * base_lr` at the last step."""
    warmup = max(1, round(warmup_frac * total_steps))
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return base_lr * (min_lr_frac + (1 - min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def skipped_positions(step: int, seed: int, shape: tuple[int, int], fraction: float):
    """(B, T) bool mask of the positions at which the skip branch's block is identity at `step`
    (None: every position, the source design's whole-block skip). The same on every process and on resume."""
    if fraction >= 1.0:
        return None
    g = torch.Generator().manual_seed(random.Random(f"positions:{seed}:{step}").getrandbits(62))
    return torch.rand(shape, generator=g) < fraction


def drawn_block(step: int, seed: int, drawable: list[int]) -> int:
    """The block replaced by identity in the skip branch at `step`: the same on every process."""
    return random.Random(f"{seed}:{step}").choice(drawable)


def drawn_blocks(step: int, seed: int, drawable: list[int], max_blocks: int = 1) -> list[int]:
    """The blocks dropped together in the skip branch at `step`, in order: with `max_blocks` 1 the
    one `drawn_block` (the source design's recipe, unchanged), else 1..max_blocks distinct drawable blocks
    (the count uniform), so training sees the joint skips a budget of several blocks per step makes."""
    if max_blocks <= 1:
        return [drawn_block(step, seed, drawable)]
    rng = random.Random(f"{seed}:{step}:joint")
    count = rng.randint(1, min(max_blocks, len(drawable)))
    return sorted(rng.sample(drawable, count))


def nested_depth(step: int, seed: int, depths: int) -> int:
    """The depth (1..depths blocks removed) a nested healing run's student runs at `step`: every depth once in each
    `depths` consecutive steps, in an order drawn per cycle from (seed, cycle), so the depths share the budget
    exactly and the batches do not line up with one depth. The same on every process and on resume."""
    cycle, place = divmod(step, depths)
    return random.Random(f"nested:{seed}:{cycle}").sample(range(1, depths + 1), depths)[place]
