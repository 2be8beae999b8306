"""Validation metrics of a retrofitted model on held-out packed sequences."""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..ar_retrofit.model import ReskipModel
from ..backbones.devices import model_device
from ..compat import output_head
from ..data.packing import Packed
from ..losses import ce_sum, entropy_per_block, head_logits, kl_sum, teacher_targets


def _add_skips(model: ReskipModel, ids, labels, cap, target, skip: dict, skip_ce: dict) -> None:
    """Each block skipped in turn, replaying the full pass's states before it: KL to the backbone and CE summed."""
    for k in skip:
        with model.replaying(cap, k):
            z = model(input_ids=ids, use_cache=False).logits  # (B, T, V), block k skipped
        skip[k] += kl_sum(target, z).item()
        skip_ce[k] += ce_sum(z, labels).item()


@torch.no_grad()
def validation_metrics(model: ReskipModel, data: Packed, batch_size: int = 4, skip_kl: bool = True,
                       teacher_states: dict | None = None, progress: Callable[[int], None] | None = None) -> dict:
    """Perplexity of the full path and the backbone, KL(backbone || full), alpha entropy per block
    (beside its maximum log n), the skip branch per block (KL(backbone || block n skipped) and its perplexity on
    the data: what a skip costs whichever teacher trained the skip branch), and the
    routing signal: the token-level std of alpha_{n-1 -> n} and the norm |w_n| of each router's query.

    teacher_states: a dict kept across calls on the same data (training's validations): the backbone's
    final hidden states per batch, (B, T, d), filled by the first call, so that later ones only reapply
    the LM head. The backbone is frozen, so they are the same values (`losses.head_logits`: the same
    operations as its forward), without a backbone pass per validation. progress: called with the number of
    sequences after each batch."""
    n_blocks = model.n_blocks
    sums = {"ce_full": 0.0, "ce_backbone": 0.0, "kl_full": 0.0}
    ent = {n: 0.0 for n in range(2, n_blocks + 1)}
    prev = {n: [] for n in range(2, n_blocks + 1)}  # alpha_{n-1 -> n} per token
    skip, skip_ce = {k: 0.0 for k in range(1, n_blocks + 1)}, {k: 0.0 for k in range(1, n_blocks + 1)}
    n_targets, n_positions = 0, 0
    cache = {} if teacher_states is None else teacher_states
    head = output_head(model.base_model)
    was_training = model.training
    model.eval()
    for i, (ids, labels) in zip(range(0, len(data), batch_size), data.batches(batch_size, model_device(model))):
        if (i, batch_size) not in cache:
            with model.side_channel_disabled():
                cache[(i, batch_size)] = model(input_ids=ids, use_cache=False, hidden_only=True).last_hidden_state
        teacher = head_logits(cache[(i, batch_size)], head)  # (B, T, V)
        target = teacher_targets(teacher)  # p and sum p log p once per batch, for every KL below
        with model.capturing() as captured:
            full = model(input_ids=ids, use_cache=False, output_alphas=True)
            cap = captured()
        sums["ce_full"] += ce_sum(full.logits, labels).item()
        sums["ce_backbone"] += ce_sum(teacher, labels).item()
        sums["kl_full"] += kl_sum(target, full.logits).item()
        positions = ids.numel()
        for n, h in entropy_per_block(full.alphas).items():
            ent[n] += h * positions
        for n, a in full.alphas.items():
            prev[n].append(a[..., -1].float().flatten())
        if skip_kl:
            _add_skips(model, ids, labels, cap, target, skip, skip_ce)
        n_targets += int((labels[:, 1:] != -100).sum())
        n_positions += positions
        if progress is not None:
            progress(len(ids))
    model.train(was_training)
    out = {
        "ppl_full": math.exp(sums["ce_full"] / n_targets),
        "ppl_backbone": math.exp(sums["ce_backbone"] / n_targets),
        "kl_full": sums["kl_full"] / n_positions,
        "entropy": {str(n): v / n_positions for n, v in ent.items()},
        "entropy_max": {str(n): math.log(n) for n in ent},
        "alpha_prev_std": {str(n): float(torch.cat(v).std(unbiased=False)) for n, v in prev.items()},
        "query_norm": {str(n): float(model.side_channel.block(n).router.query.norm()) for n in prev},
        "tokens": n_positions,
    }
    if skip_kl:
        out["skip_kl"] = {str(k): v / n_positions for k, v in skip.items()}
        out["skip_ppl"] = {str(k): math.exp(v / n_targets) for k, v in skip_ce.items()}
    return out
