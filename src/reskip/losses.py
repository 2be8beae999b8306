"""The three loss terms, as sums over tokens (the caller normalises by the global token count)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ce_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy summed over labelled positions. logits (B, T, V), labels (B, T).

    The labels are shifted, not the logits: slicing (B, T, V) logits would copy them.
    """
    targets = F.pad(labels[:, 1:], (0, 1), value=-100)  # (B, T): position t predicts token t+1
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100, reduction="sum")


@torch.no_grad()
def teacher_targets(teacher_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(p_teacher (B, T, V), sum over positions of sum_v p log p) from teacher logits.

    sum_v p log p = sum_v p z - logsumexp(z), so no (B, T, V) log-probabilities are kept.
    """
    z = teacher_logits.float()
    p = torch.softmax(z, dim=-1)
    return p, torch.linalg.vecdot(p, z).sum() - z.logsumexp(-1).sum()


class _KLFromTeacher(torch.autograd.Function):
    """KL(p || softmax(z)) summed over positions, with a one-pass backward: (softmax(z) - p) * g.

    Written out because autograd's logsumexp backward materialises several (B, T, V)
    temporaries; on a 49k vocabulary those cost more than the loss itself.
    """

    @staticmethod
    def forward(ctx, z, p, neg_entropy):
        ctx.save_for_backward(z, p)
        # sum_v p (log p - log q) = sum_v p log p - sum_v p z + logsumexp(z), as sum_v p = 1
        return neg_entropy - torch.linalg.vecdot(p, z).sum() + z.logsumexp(-1).sum()

    @staticmethod
    def backward(ctx, grad):
        z, p = ctx.saved_tensors
        return torch.softmax(z, dim=-1).sub_(p).mul_(grad), None, None


def kl_sum(teacher, student_logits: torch.Tensor) -> torch.Tensor:
    """sum over positions of KL(p_teacher || p_student).

    teacher: logits (B, T, V), or the pair from `teacher_targets` (computed once per batch).
    """
    p, neg_entropy = teacher_targets(teacher) if isinstance(teacher, torch.Tensor) else teacher
    return _KLFromTeacher.apply(student_logits.float(), p, neg_entropy)


def token_entropy(alpha: torch.Tensor) -> torch.Tensor:
    """Entropy of each token's routing distribution: (B, T, n) -> (B, T)."""
    return -(alpha * alpha.clamp_min(1e-12).log()).sum(-1)


def entropy_sum(alphas: dict) -> torch.Tensor:
    """sum over positions of the mean (over blocks) entropy of alpha. alphas: n -> (B, T, n)."""
    return torch.stack([token_entropy(a) for a in alphas.values()]).mean(0).sum()


def entropy_per_block(alphas: dict) -> dict[int, float]:
    """Mean entropy of alpha per block (over all tokens)."""
    return {n: float(token_entropy(a).mean()) for n, a in alphas.items()}


def ce_tokens(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy per position (B, T); 0 where there is no labelled target (like `ce_sum`)."""
    targets = F.pad(labels[:, 1:], (0, 1), value=-100)  # (B, T): position t predicts token t+1
    ce = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100, reduction="none")
    return ce.view(targets.shape)
