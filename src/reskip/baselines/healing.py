"""A LoRA arm's objective, one micro-batch at a time: what healing asks of the model after its layers are removed.

- `ce`: next-token cross-entropy on the mix (the recipe's loss mask): fine-tuning toward the data;
- `kd`: KL(backbone || model) on every position: distillation from the model the user deploys. The teacher is
  the same model with the removed layers put back and the LoRA off, under no_grad (`compat.layers_put_back`,
  PEFT's `disable_adapter`): never a second copy of the weights. On a plain LoRA (nothing removed) the teacher is
  the backbone with the LoRA off;
- `kd+ce`: both, each normalised by its own count (CE per labelled target, KL per position).

`temperature` T divides both logits before the KL, which is scaled by T^2 (Hinton et al.) so its gradients keep
their size; T = 1 is the plain KL. With `loss_chunk` (the recipe's default) the head reads a chunk of positions at a
time (`losses.head_ce`, `losses.head_losses`), as the retrofit's objective does; T != 1 reads whole logits.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
from torch import nn

from .. import compat
from ..losses import ce_sum, head_ce, head_losses, kl_sum, teacher_targets

HEAL_OBJECTIVES = ("ce", "kd", "kd+ce")


class HealingObjective(nn.Module):
    """One micro-batch of a LoRA arm's loss (`HEAL_OBJECTIVES`); `removed` is what was pruned (None: nothing)."""

    def __init__(self, model, objective: str = "ce", temperature: float = 1.0, loss_chunk: int | None = None,
                 removed: compat.RemovedLayers | None = None):
        super().__init__()
        if objective not in HEAL_OBJECTIVES:
            raise ValueError(f"healing objective {objective!r}: one of {', '.join(HEAL_OBJECTIVES)}")
        self.model = model
        self.objective = objective
        self.temperature = temperature
        self.loss_chunk = loss_chunk
        self.removed = removed

    @property
    def base(self) -> nn.Module:
        return self.model.get_base_model()

    @contextmanager
    def teacher(self):
        """The context in which the model computes the backbone: layers back, LoRA off, no gradient."""
        back = compat.layers_put_back(self.base, self.removed) if self.removed else nullcontext()
        with torch.no_grad(), self.model.disable_adapter(), back:
            yield

    def student(self, drop: list[int] | None):
        """The context of the student's pass: the model as trained, or (nested depths) without the layers `drop`."""
        return compat.layers_removed(self.base, set(drop)) if drop else nullcontext()

    def forward(self, input_ids, labels, n_targets: int, n_positions: int, drop: list[int] | None = None) -> dict:
        """{loss, ce, kl}: CE summed over the labelled targets / n_targets, KL summed over positions / n_positions
        (the step's global counts); the loss is the objective's. `drop`: layers the student runs without this step
        (a nested arm's depth); the teacher is always the whole backbone."""
        chunked = self.loss_chunk is not None and self.temperature == 1.0
        body, head = compat.decoder_body(self.base), compat.output_head(self.base)
        if self.objective == "ce":  # no teacher pass
            with self.student(drop):
                if chunked:
                    h = body(input_ids=input_ids, use_cache=False).last_hidden_state  # (b, T, d), through the LoRA
                    ce = head_ce(h, head, labels, self.loss_chunk) / n_targets
                else:
                    ce = ce_sum(self.model(input_ids=input_ids, use_cache=False).logits, labels) / n_targets
            return {"loss": ce, "ce": ce.detach(), "kl": torch.zeros((), device=ce.device)}
        if chunked:
            with self.teacher():
                h_teacher = body(input_ids=input_ids, use_cache=False).last_hidden_state  # (b, T, d)
            with self.student(drop):
                h = body(input_ids=input_ids, use_cache=False).last_hidden_state
            ce, kl = head_losses(h, h, h_teacher, head, labels, self.loss_chunk)[:2]
        else:
            t = self.temperature
            with self.teacher():
                z_teacher = self.model(input_ids=input_ids, use_cache=False).logits.float() / t  # (b, T, V)
            with self.student(drop):
                z = self.model(input_ids=input_ids, use_cache=False).logits
            kl = kl_sum(teacher_targets(z_teacher), z.float() / t) * t * t
            ce = ce_sum(z, labels)
        ce, kl = ce / n_targets, kl / n_positions
        loss = kl if self.objective == "kd" else ce + kl
        return {"loss": loss, "ce": ce.detach(), "kl": kl.detach()}
