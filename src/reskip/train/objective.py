"""The retrofit's training objective: CE(full path) + lambda_kl KL(teacher || skip branch)
- lambda_ent mean H(alpha) [+ lambda_signal corr(alpha_{k-1 -> k}, cost_k)], for one micro-batch.
The teacher is the frozen backbone (the source design's), or with `skip_teacher: full` the full path itself.
With `full_objective: kd` (a named variant: the backbone as the only teacher) the first term is KL(backbone ||
full path) per position instead of CE on the mix: the side-channel is asked to keep the full path at the backbone.
The loss terms themselves are `reskip.losses`; the schedules that drive c(t), the learning rate
and the drawn block are `schedules`.

With a skip shortcut (`skip_path: shortcut`), an optional local term `lambda_local` regresses each
shortcut's output onto its block's real output (`local_regression`).

The fourth term (lambda_signal, 1 by default; the lab notebook measures why) asks the drawn
block k's router to put more weight on h_{k-1} where skipping k costs less: it is the Pearson
correlation, over the micro-batch's labelled tokens (those of every process: `process_group`),
between alpha_{k-1 -> k} and the measured per-token cost of the skip branch (its NLL minus the
full path's, detached). Minimising it makes the correlation negative, which is what ReSkip's rule
(skip where w_recent is high) needs."""

from __future__ import annotations

import torch
from torch import nn

from ..ar_retrofit.model import ReskipModel
from ..compat import output_head
from ..losses import ce_sum, ce_tokens, entropy_sum, head_losses, kl_sum, next_token_targets, teacher_targets
from .process_group import global_sum, world_size


class RetrofitObjective(nn.Module):
    """One micro-batch of the three-term loss. Wrapping it (not the model) in DDP keeps the
    teacher, full and skip passes inside a single forward, so gradients sync once."""

    def __init__(self, model: ReskipModel, lambda_kl: float, lambda_ent: float, lambda_signal: float = 0.0,
                 lambda_local: float = 0.0, loss_chunk: int | None = None, recompute: bool = False,
                 skip_teacher: str = "backbone", full_objective: str = "ce"):
        """skip_teacher: what the skip branch is distilled toward: "backbone" (the frozen backbone, the source
        design's) or "full" (this step's full path, detached).
        loss_chunk: compute CE and KL from the passes' final hidden states in chunks of this many
        positions (`losses.head_losses`): no (B, T, V) logits held; None: from whole logits.
        recompute: activation checkpointing of the frozen layers in the full and skip passes."""
        super().__init__()
        self.model = model
        self.lambda_kl = lambda_kl
        self.lambda_ent = lambda_ent
        self.lambda_signal = lambda_signal
        self.lambda_local = lambda_local
        self.loss_chunk = loss_chunk
        self.recompute = recompute
        self.skip_teacher = skip_teacher
        self.full_objective = full_objective

    @classmethod
    def of(cls, model: ReskipModel, cfg) -> "RetrofitObjective":
        """The objective a `TrainConfig` describes: its loss weights, loss chunk and recompute setting."""
        return cls(model, cfg.lambda_kl, cfg.lambda_ent, cfg.lambda_signal, cfg.lambda_local, cfg.loss_chunk,
                   cfg.recompute, cfg.skip_teacher, cfg.full_objective)

    def _full_kd(self, full, teacher, labels) -> torch.Tensor:
        """KL(backbone || full path) summed over positions with `full_objective: kd` (the teacher pass's own
        targets: hidden states when the loss is chunked, else the (p, sum p log p) pair); 0 otherwise."""
        if self.full_objective != "kd":
            return torch.zeros((), device=labels.device)
        if self.loss_chunk is not None:
            return head_losses(full.last_hidden_state, full.last_hidden_state, teacher,
                               output_head(self.model.base_model), labels, self.loss_chunk)[1]
        return kl_sum(teacher, full.logits)

    def forward(self, input_ids, labels, skip_block: int, target_scale: float, position_scale: float,
                skip_mask: torch.Tensor | None = None, also_skipped: tuple[int, ...] = ()):
        with self.model.recomputing_layers(self.recompute):
            return self._terms(input_ids, labels, skip_block, target_scale, position_scale, skip_mask, also_skipped)

    def _terms(self, input_ids, labels, skip_block, target_scale, position_scale, skip_mask, also_skipped):
        """Loss terms as sums over this micro-batch times the given scales (1 / global counts).

        also_skipped: later blocks dropped together with `skip_block` in the skip branch (the joint skips
        of a budget above one block per step); the signal term reads `skip_block`'s router only.

        skip_mask: (B, T) positions at which block `skip_block` is identity in the skip branch (None:
        all of them). A token-level skip branch sees what decode does when a policy skips a block at
        some steps only: the skipped positions keep their input, and their K/V in the block's layers
        are those of the unchanged input (the position-skip reference mode, as the exact cache)."""
        rm = self.model
        chunked = self.loss_chunk is not None
        # Chunked: the passes stop at the final norm (no logits), and the losses read the LM head chunk by chunk.
        out_kw = {"hidden_only": True} if chunked else {}
        with torch.no_grad(), rm.side_channel_disabled(), rm.capturing() as captured:
            t_out = rm(input_ids=input_ids, use_cache=False, **out_kw)
            teacher = t_out.last_hidden_state if chunked else teacher_targets(t_out.logits)  # (B, T, d) or p: (B, T, V)
            del t_out
            teacher_pass = captured()
        # Block 1 has no side-channel: its output h_1 is the teacher's, so it is not rerun.
        with rm.capturing() as captured, rm.continuing(teacher_pass, 1):
            full = rm(input_ids=input_ids, use_cache=False, output_alphas=True, **out_kw)
            cap = captured()
        if self.skip_teacher == "full":  # the retrofit's own prediction, as a fixed target for this step
            teacher = full.last_hidden_state.detach() if chunked else teacher_targets(full.logits.detach())
        # Skip branch: blocks before `skip_block` are the full pass's own (shared, not recomputed).
        if skip_mask is None:
            with rm.replaying(cap, skip_block), rm.blocks_skipped(*also_skipped):
                skip = rm(input_ids=input_ids, use_cache=False, **out_kw)
        else:
            masks = {n: skip_mask for n in (skip_block, *also_skipped)}
            with rm.continuing(cap, skip_block - 1), rm.skipping_positions(masks):
                skip = rm(input_ids=input_ids, use_cache=False, **out_kw)
        want_signal = self.lambda_signal > 0 and skip_block in full.alphas
        if chunked:
            ce, kl, cost = head_losses(full.last_hidden_state, skip.last_hidden_state, teacher, output_head(rm.base_model),
                                       labels, self.loss_chunk, want_costs=want_signal)
        else:
            ce, kl = ce_sum(full.logits, labels), kl_sum(teacher, skip.logits)
            if want_signal:
                with torch.no_grad():  # (B, T): what skipping block k cost at each position
                    cost = ce_tokens(skip.logits, labels) - ce_tokens(full.logits, labels)
        kd = self._full_kd(full, teacher, labels) * position_scale
        ce, kl = ce * target_scale, kl * position_scale
        ent = entropy_sum(full.alphas) * position_scale
        first = kd if self.full_objective == "kd" else ce
        loss = first + self.lambda_kl * kl - self.lambda_ent * ent
        sig = torch.zeros((), device=loss.device)
        if want_signal:
            valid = next_token_targets(labels) != -100  # (B, T): positions with a target
            sig = pearson(full.alphas[skip_block][..., -1][valid], cost[valid])
            loss = loss + self.lambda_signal * sig
        local = torch.zeros((), device=loss.device)
        if self.lambda_local > 0 and rm.side_channel.shortcuts:  # None, or empty with no middle block
            local = local_regression(rm, cap)
            loss = loss + self.lambda_local * local
        return {"loss": loss, "ce": ce.detach(), "kl": kl.detach(), "ent": ent.detach(), "sig": sig.detach(),
                "local": local.detach(), "kd": kd.detach()}


def local_regression(rm: ReskipModel, cap) -> torch.Tensor:
    """Mean over the blocks with a shortcut of |x_n + S_n(x_n) - h_n|^2 / |h_n - x_n|^2 on the full pass's
    own (detached) block inputs and outputs: 1 at init (S = 0), 0 if the shortcut reproduced the block.
    Every shortcut learns from every step, not only when the skip branch draws its block."""
    num, den = [], []
    for n, shortcut in rm.side_channel.shortcuts.items():
        x, h = cap.inputs[int(n)].detach().float(), cap.states[int(n)].detach().float()  # (B, T, d)
        num.append((shortcut(x) - h).pow(2).sum())
        den.append((h - x).pow(2).sum())
    # Ratios of sums over every process's tokens, as one process holding the whole micro-batch.
    num, den = global_sum(torch.stack(num), differentiable=True), global_sum(torch.stack(den))  # (n_shortcuts,)
    return (num / den.clamp_min(1e-12)).mean()


def pearson(x: torch.Tensor, y: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Pearson correlation of two 1-D tensors (differentiable in both), over the union of every
    process's tensors when training runs on several."""
    if world_size() == 1:
        x, y = x - x.mean(), y - y.mean()
        return (x * y).sum() / (x.norm() * y.norm() + eps)
    # Global means, held constant: d/dx of sum((x - m)(y - m_y)) and of sum((x - m)^2) is the same
    # whether m moves with x or not (the centred terms sum to zero), so the gradient stays exact.
    stats = global_sum(torch.stack([x.new_tensor(float(x.numel())), x.sum(), y.sum()]))
    x, y = x - stats[1] / stats[0], y - stats[2] / stats[0]
    sums = global_sum(torch.stack([(x * y).sum(), (x * x).sum(), (y * y).sum()]), differentiable=True)
    return sums[0] / (sums[1].sqrt() * sums[2].sqrt() + eps)
