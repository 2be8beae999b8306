"""What healing asks of a model after its layers are removed: the healing objectives, each a loss object of one table
(`OBJECTIVES`), and the micro-batch module that runs the teacher and the student (`HealingObjective`).

The objectives (written `name` or `name:option`, e.g. `jsd:0.9`; the CLI, the experiments and the docs read this
table):
- `kd`: KL(original || model), the forward KL: distillation from the model the user deploys (the default);
- `rkl`: KL(model || original), the reverse KL (mode-seeking);
- `jsd[:beta]`: GKD's generalised Jensen-Shannon divergence between the two (beta 0.5 by default; near 0 it acts as
  the forward KL, near 1 as the reverse);
- `ce`: next-token cross-entropy on the data (the recipe's loss mask): fine-tuning toward the data, no teacher;
- `kd+ce`: the forward KL and cross-entropy, each normalised by its own count.

The teacher is the same model with the removed layers put back and the LoRA off, under no_grad
(`compat.layers_put_back`, PEFT's `disable_adapter`): never a second copy of the weights. On a plain LoRA (nothing
removed) the teacher is the backbone with the LoRA off.

Which positions a divergence reads (`positions`): `all` (every position, text and chat alike) or `replies` (the
positions whose next token is labelled: on chat data the assistant's replies, on text every position but a
sequence's last). A batch the student sampled itself (on-policy, `on_policy.py`) is always read on its replies.
`temperature` T divides both logits of the forward KL, which is scaled by T^2 (Hinton et al.); T != 1 reads whole
logits. With `loss_chunk` (the recipe's default) the head reads a chunk of positions at a time.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from .. import compat
from ..divergences import Divergence, forward_kl, head_divergence, jsd, reverse_kl
from ..errors import ReskipError
from ..losses import ce_sum, head_ce, head_losses, kl_sum, next_token_targets, teacher_targets

POSITIONS = ("all", "replies")


@dataclass(frozen=True)
class HealingLoss:
    """One healing objective: which divergence to the teacher it reads (None: none), and whether cross-entropy on the
    data's labels is part of it. `text` is how it was written (`kd`, `jsd:0.9`)."""

    text: str
    divergence: Divergence | None
    with_ce: bool
    record_name: str  # the divergence's name in a training log

    @property
    def needs_teacher(self) -> bool:
        return self.divergence is not None

    @property
    def is_forward_kl(self) -> bool:
        return self.divergence is forward_kl


def _no_option(name: str, loss: HealingLoss):
    def make(option: str | None) -> HealingLoss:
        if option is not None:
            raise ReskipError(f"objective {name!r} takes no option (got {name}:{option})")
        return loss
    return make


def _jsd(option: str | None) -> HealingLoss:
    try:
        beta = 0.5 if option is None else float(option)
        return HealingLoss(f"jsd:{beta:g}", jsd(beta), False, "jsd")  # one spelling per objective
    except ValueError as e:
        raise ReskipError(f"objective jsd:{option}: beta must be a number strictly between 0 and 1 ({e})") from None


# name -> (what it is, make(option) -> HealingLoss): every healing objective, in one table
OBJECTIVES = {
    "kd": ("KL(original || model) on every position read: distillation from the original",
           _no_option("kd", HealingLoss("kd", forward_kl, False, "kl"))),
    "rkl": ("KL(model || original): the reverse, mode-seeking KL",
            _no_option("rkl", HealingLoss("rkl", reverse_kl, False, "rkl"))),
    "jsd": ("jsd[:beta]: GKD's generalised Jensen-Shannon divergence, beta in (0, 1), 0.5 by default",
            _jsd),
    "ce": ("cross-entropy on the data's labels: fine-tuning toward the data, no teacher",
           _no_option("ce", HealingLoss("ce", None, True, "kl"))),
    "kd+ce": ("the forward KL and cross-entropy, each normalised by its own count",
              _no_option("kd+ce", HealingLoss("kd+ce", forward_kl, True, "kl"))),
}


def objective_help() -> str:
    """Every objective of the table and what it is (the CLI's errors and the docs read it)."""
    return "; ".join(f"{name}: {what}" for name, (what, _) in OBJECTIVES.items())


def parse_objective(text: str) -> HealingLoss:
    """`name` or `name:option` -> its loss object; one clear error for a name or option the table does not have."""
    name, _, option = str(text).partition(":")
    if name not in OBJECTIVES:
        raise ReskipError(f"healing objective {text!r}: one of {', '.join(OBJECTIVES)} ({objective_help()})")
    return OBJECTIVES[name][1](option or None)


class HealingObjective(nn.Module):
    """One micro-batch of a LoRA healing's loss (`OBJECTIVES`); `removed` is what was pruned (None: nothing)."""

    def __init__(self, model, objective: str = "ce", temperature: float = 1.0, loss_chunk: int | None = None,
                 removed: compat.RemovedLayers | None = None, positions: str = "all"):
        super().__init__()
        if positions not in POSITIONS:
            raise ValueError(f"healing positions {positions!r}: one of {', '.join(POSITIONS)}")
        self.model = model
        self.loss = parse_objective(objective)
        self.objective = self.loss.text
        self.temperature = temperature
        self.loss_chunk = loss_chunk
        self.removed = removed
        self.positions = positions

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

    def forward(self, input_ids, labels, n_targets: int, n_positions: int, drop: list[int] | None = None,
                on_policy: bool = False) -> dict:
        """{loss, ce, kl}: CE summed over the labelled targets / n_targets, the divergence ("kl") summed over the
        positions it reads / their count (n_positions for every position, n_targets for the replies); the loss is the
        objective's. `drop`: layers the student runs without this step (a nested healing run's depth); the teacher is always
        the whole backbone. `on_policy`: the batch is the student's own samples, read on their replies."""
        loss, body, head = self.loss, compat.decoder_body(self.base), compat.output_head(self.base)
        if not loss.needs_teacher:  # ce: no teacher pass
            return self._ce_only(input_ids, labels, n_targets, drop, body, head)
        replies = on_policy or self.positions == "replies"
        if self.loss_chunk is None or self.temperature != 1.0:
            if replies or not loss.is_forward_kl:
                raise ReskipError("a divergence read on replies, and every divergence but kd, reads the head in chunks "
                                  "at temperature 1: set loss_chunk and leave the temperature at 1")
            return self._whole_logits(input_ids, labels, n_targets, n_positions, drop)
        with self.teacher():
            h_teacher = body(input_ids=input_ids, use_cache=False).last_hidden_state  # (b, T, d)
        with self.student(drop):
            h = body(input_ids=input_ids, use_cache=False).last_hidden_state
        if loss.is_forward_kl and not replies:  # the fused forward-KL path every kd arm was measured with
            ce, kl = head_losses(h, h, h_teacher, head, labels, self.loss_chunk)[:2]
            count = n_positions
        else:
            weights = next_token_targets(labels) != -100 if replies else torch.ones_like(labels, dtype=torch.bool)
            kl, ce_detached = head_divergence(h, h_teacher, head, labels, weights, self.loss_chunk, loss.divergence)
            ce = head_ce(h, head, labels, self.loss_chunk) if loss.with_ce and not on_policy else ce_detached
            count = n_targets if replies else n_positions
        ce, kl = ce / n_targets, kl / count
        total = ce + kl if loss.with_ce and not on_policy else kl  # a sample's own tokens are never CE targets
        return {"loss": total, "ce": ce.detach(), "kl": kl.detach()}

    def _ce_only(self, input_ids, labels, n_targets: int, drop, body, head) -> dict:
        with self.student(drop):
            if self.loss_chunk is not None and self.temperature == 1.0:
                h = body(input_ids=input_ids, use_cache=False).last_hidden_state  # (b, T, d), through the LoRA
                ce = head_ce(h, head, labels, self.loss_chunk) / n_targets
            else:
                ce = ce_sum(self.model(input_ids=input_ids, use_cache=False).logits, labels) / n_targets
        return {"loss": ce, "ce": ce.detach(), "kl": torch.zeros((), device=ce.device)}

    def _whole_logits(self, input_ids, labels, n_targets: int, n_positions: int, drop) -> dict:
        """The forward KL from whole (B, T, V) logits, at temperature T (scaled by T^2)."""
        t = self.temperature
        with self.teacher():
            z_teacher = self.model(input_ids=input_ids, use_cache=False).logits.float() / t  # (b, T, V)
        with self.student(drop):
            z = self.model(input_ids=input_ids, use_cache=False).logits
        kl = kl_sum(teacher_targets(z_teacher), z.float() / t) * t * t / n_positions
        ce = ce_sum(z, labels) / n_targets
        loss = ce + kl if self.loss.with_ce else kl
        return {"loss": loss, "ce": ce.detach(), "kl": kl.detach()}
