"""The retrofit's training objective: CE(full path) + lambda_kl KL(teacher || skip branch)
- lambda_ent mean H(alpha), for one micro-batch. The loss terms themselves are `reskip.losses`;
the schedules that drive c(t), the learning rate and the drawn block are `schedules`."""

from __future__ import annotations

import torch
from torch import nn

from ..losses import ce_sum, entropy_sum, kl_sum, teacher_targets
from ..ar_retrofit.model import ReskipModel


class RetrofitObjective(nn.Module):
    """One micro-batch of the three-term loss. Wrapping it (not the model) in DDP keeps the
    teacher, full and skip passes inside a single forward, so gradients sync once."""

    def __init__(self, model: ReskipModel, lambda_kl: float, lambda_ent: float):
        super().__init__()
        self.model = model
        self.lambda_kl = lambda_kl
        self.lambda_ent = lambda_ent

    def forward(self, input_ids, labels, skip_block: int, target_scale: float, position_scale: float):
        """Loss terms as sums over this micro-batch times the given scales (1 / global counts)."""
        rm = self.model
        with torch.no_grad(), rm.side_channel_disabled(), rm.capturing() as captured:
            teacher = teacher_targets(rm(input_ids=input_ids, use_cache=False).logits)  # p: (B, T, V)
            teacher_pass = captured()
        # Block 1 has no side-channel: its output h_1 is the teacher's, so it is not rerun.
        with rm.capturing() as captured, rm.continuing(teacher_pass, 1):
            full = rm(input_ids=input_ids, use_cache=False, output_alphas=True)
            cap = captured()
        # Skip branch: blocks before `skip_block` are the full pass's own (shared, not recomputed).
        with rm.replaying(cap, skip_block):
            skip = rm(input_ids=input_ids, use_cache=False).logits
        ce = ce_sum(full.logits, labels) * target_scale
        kl = kl_sum(teacher, skip) * position_scale
        ent = entropy_sum(full.alphas) * position_scale
        loss = ce + self.lambda_kl * kl - self.lambda_ent * ent
        return {"loss": loss, "ce": ce.detach(), "kl": kl.detach(), "ent": ent.detach()}
