"""Each block's ablation on the retrofit's capture and replay (the block as identity, every other block as it runs):
the cross-entropy and KL to the full model with the block removed, cos(input, output), and the routers' alpha and
w_recent per token. Calibration reads all of it (A(n), I(n), thresholds); `reskip compress` reads the ablation's
costs of the backbone (a retrofit at c = 0) to choose the blocks it removes."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..ar_retrofit.model import ReskipModel
from ..backbones.devices import model_device
from ..data.packing import Packed
from ..losses import ce_sum, kl_sum, teacher_targets
from .window import sliding_mean


@dataclass
class BlockSums:
    """Sums over the calibration data: the full model's CE and each block's skipped CE (over n_targets labelled
    targets), E[alpha_{i->n}] numerators, cos(x_n, h_n) sums and KL(full || block n skipped) sums (over
    `positions`), w_recent(n) and alpha_{n-1->n} per token."""

    ce_full: float
    n_targets: int
    positions: int
    ce_skip: dict
    alpha_sum: dict
    cos_sum: dict
    w_values: dict
    prev_values: dict
    kl_skip: dict = field(default_factory=dict)


@torch.no_grad()
def measure_blocks(model: ReskipModel, data: Packed, window: int, batch_size: int, progress=None) -> BlockSums:
    """One full pass per batch, and one replayed pass per block with that block as identity."""
    n_blocks, device = model.n_blocks, model_device(model)
    m = BlockSums(0.0, 0, 0, {k: 0.0 for k in range(1, n_blocks + 1)},
                  {n: torch.zeros(n, device=device) for n in range(2, n_blocks + 1)}, {k: 0.0 for k in range(1, n_blocks + 1)},
                  {n: [] for n in range(2, n_blocks + 1)}, {n: [] for n in range(2, n_blocks + 1)})
    was_training = model.training
    model.eval()
    for i, (ids, labels) in zip(range(0, len(data), batch_size), data.batches(batch_size, device)):
        with model.capturing() as captured:
            full = model(input_ids=ids, use_cache=False, output_alphas=True)
            cap = captured()
        m.ce_full += ce_sum(full.logits, labels).item()
        reference = teacher_targets(full.logits)  # p of the full model, once per batch, for every block's KL
        m.n_targets += int((labels[:, 1:] != -100).sum())
        m.positions += ids.numel()
        for n, alpha in full.alphas.items():  # (B, T, n)
            m.alpha_sum[n] += alpha.float().sum(dim=(0, 1))
            m.w_values[n].append(sliding_mean(alpha[..., -1].float(), window).flatten())
            m.prev_values[n].append(alpha[..., -1].float().flatten())
        for k in range(1, n_blocks + 1):
            x, h = cap.inputs[k].float(), cap.states[k].float()
            m.cos_sum[k] += F.cosine_similarity(x, h, dim=-1).sum().item()
            with model.replaying(cap, k):
                z = model(input_ids=ids, use_cache=False).logits  # (B, T, V), block k as identity
            m.ce_skip[k] += ce_sum(z, labels).item()
            m.kl_skip[k] = m.kl_skip.get(k, 0.0) + kl_sum(reference, z).item()
            del z
        if progress is not None:
            progress(min(i + batch_size, len(data)), len(data))
    model.train(was_training)
    return m
