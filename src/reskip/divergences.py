"""Divergences between the teacher's and the student's next-token distributions, read through a frozen LM head a chunk
of positions at a time (no (B, T, V) logits held), each position weighted (0 leaves it out: a chat prompt, padding).

Each divergence is a function of the two float32 logit arrays (N, V) of one chunk, returning its value per position
(N,); its gradient with respect to the student's logits is taken by autograd inside the chunk, so a new divergence is
one function. p is the teacher's distribution, q the student's:

- `forward_kl`: KL(p || q), mass-covering (the distillation the project heals with, `losses.head_losses`' term);
- `reverse_kl`: KL(q || p), mode-seeking;
- `jsd(beta)`: GKD's generalised Jensen-Shannon divergence (Agarwal et al. 2024, TRL's convention): with
  m = beta p + (1 - beta) q, beta KL(p || m) + (1 - beta) KL(q || m); near 0 it behaves as the forward KL, near 1
  as the reverse KL (each scaled down), 0.5 the symmetric JSD."""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from .losses import next_token_targets

Divergence = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def forward_kl(zt: torch.Tensor, zs: torch.Tensor) -> torch.Tensor:
    lp, lq = zt.log_softmax(-1), zs.log_softmax(-1)
    return (lp.exp() * (lp - lq)).sum(-1)


def reverse_kl(zt: torch.Tensor, zs: torch.Tensor) -> torch.Tensor:
    lp, lq = zt.log_softmax(-1), zs.log_softmax(-1)
    return (lq.exp() * (lq - lp)).sum(-1)


def jsd(beta: float) -> Divergence:
    if not 0.0 < beta < 1.0:
        raise ValueError(f"jsd's beta must lie strictly between 0 and 1 (0 is the forward KL, 1 the reverse), got {beta}")

    def divergence(zt: torch.Tensor, zs: torch.Tensor) -> torch.Tensor:
        lp, lq = zt.log_softmax(-1), zs.log_softmax(-1)
        lm = torch.logsumexp(torch.stack([lp + math.log(beta), lq + math.log(1 - beta)]), dim=0)  # log m
        return beta * (lp.exp() * (lp - lm)).sum(-1) + (1 - beta) * (lq.exp() * (lq - lm)).sum(-1)

    return divergence


def _logits(h: torch.Tensor, weight, bias, softcap) -> torch.Tensor:
    """The head's logits of hidden states h (N, d), as the family's forward computes them, then in float32."""
    z = F.linear(h, weight, bias)
    if softcap is not None:
        z = torch.tanh(z / softcap) * softcap
    return z.float()


class _HeadDivergence(torch.autograd.Function):
    """sum over positions of w * divergence(teacher, student) and the student's CE (detached, for the record), from
    final hidden states, one chunk of positions at a time: each chunk's gradient with respect to the student's hidden
    states is computed at once (autograd on the chunk's logits, then through the frozen head by hand)."""

    @staticmethod
    def forward(ctx, h, h_teacher, weight, bias, softcap, targets, weights, chunk, divergence):
        B, T, d = h.shape
        g = torch.zeros_like(h)  # (B, T, d)
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        ce = torch.zeros((), dtype=torch.float32, device=h.device)
        for a in range(0, T, chunk):
            sl = slice(a, min(a + chunk, T))
            w = weights[:, sl].reshape(-1).float()  # (N,)
            if not bool((w != 0).any()):
                continue
            hs = h[:, sl].reshape(-1, d).detach()
            zt = _logits(h_teacher[:, sl].reshape(-1, d), weight, bias, softcap)  # (N, V)
            with torch.enable_grad():
                hs.requires_grad_(True)
                zs = _logits(hs, weight, bias, softcap)  # (N, V), through the head: its gradient reaches hs
                value = (divergence(zt, zs) * w).sum()
                (grad,) = torch.autograd.grad(value, hs)
            t = targets[:, sl].reshape(-1)
            with torch.no_grad():
                nll = zs.detach().logsumexp(-1) - zs.detach().gather(-1, t.clamp_min(0)[:, None])[:, 0]
                ce += (nll * (t != -100)).sum()
            total += value.detach()
            g[:, sl] = grad.view(B, -1, d).to(g.dtype)
        ctx.save_for_backward(g)
        return total, ce

    @staticmethod
    def backward(ctx, grad_total, grad_ce):
        (g,) = ctx.saved_tensors
        return g * grad_total, None, None, None, None, None, None, None, None


def head_divergence(h: torch.Tensor, h_teacher: torch.Tensor, head, labels: torch.Tensor, weights: torch.Tensor,
                    chunk: int, divergence: Divergence) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over positions of weights * divergence(teacher, student), the student's CE summed over labelled targets,
    detached) from final hidden states (B, T, d) through the frozen `head` (weight, bias, softcap); weights (B, T)."""
    weight, bias, softcap = head
    if weight.requires_grad or (bias is not None and bias.requires_grad):
        raise ValueError("head_divergence needs a frozen LM head: it computes no gradient for it")
    return _HeadDivergence.apply(h, h_teacher.detach(), weight, bias, softcap, next_token_targets(labels), weights,
                                 chunk, divergence)
