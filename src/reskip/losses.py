"""The three loss terms, as sums over tokens (the caller normalises by the global token count)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def next_token_targets(labels: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, T): position t's target is token t+1 (-100: none, as at the last position)."""
    return F.pad(labels[:, 1:], (0, 1), value=-100)


def ce_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy summed over labelled positions. logits (B, T, V), labels (B, T).

    The labels are shifted, not the logits: slicing (B, T, V) logits would copy them.
    """
    targets = next_token_targets(labels)  # (B, T)
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
    targets = next_token_targets(labels)  # (B, T)
    ce = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100, reduction="none")
    return ce.view(targets.shape)


def _head_logits(h: torch.Tensor, weight, bias, softcap) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(float32 logits, d logits / d pre-cap logits or None) for hidden states h (B, c, d), in the
    model's dtype up to the cast, as the family's forward computes them."""
    u = F.linear(h, weight, bias)
    if softcap is None:
        return u.float(), None
    t = torch.tanh(u / softcap)
    return (t * softcap).float(), (1 - t.float() ** 2)


@torch.no_grad()
def head_logits(h: torch.Tensor, head) -> torch.Tensor:
    """float32 logits (B, T, V) of final hidden states h (B, T, d) through head = `compat.output_head(model)`:
    the same operations as the family's forward, so the same values as its `.logits`."""
    return _head_logits(h, *head)[0]


def _to_hidden(dz: torch.Tensor, cap: torch.Tensor | None, weight, dtype) -> torch.Tensor:
    """A chunk's loss gradient w.r.t. its logits (B, c, V), in place through the soft-cap if any, ->
    the gradient w.r.t. the hidden states the head read (B, c, d)."""
    if cap is not None:
        dz.mul_(cap)
    return (dz.to(weight.dtype) @ weight).to(dtype)


class _HeadLosses(torch.autograd.Function):
    """CE of the full path and KL(teacher || skip branch) from the three passes' final hidden states,
    one chunk of positions at a time, so no (B, T, V) tensor is ever held: each chunk's logits give
    its loss and, at once, the loss's gradient with respect to the chunk's hidden states (the LM head
    is frozen), which backward only scales. The same values and gradients as `ce_sum` and `kl_sum`
    on whole logits (Liger-Kernel's fused linear cross-entropy does this for CE alone)."""

    @staticmethod
    def forward(ctx, h_full, h_skip, h_teacher, weight, bias, softcap, targets, chunk, want_costs):
        B, T, _ = h_full.shape
        g_full, g_skip = torch.zeros_like(h_full), torch.zeros_like(h_skip)  # (B, T, d)
        ce = torch.zeros((), dtype=torch.float32, device=h_full.device)
        kl = torch.zeros((), dtype=torch.float32, device=h_full.device)
        costs = torch.zeros(B, T, dtype=torch.float32, device=h_full.device) if want_costs else None
        for a in range(0, T, chunk):
            sl = slice(a, min(a + chunk, T))
            t = targets[:, sl]  # (B, c)
            valid = t != -100
            picked = t.clamp_min(0).unsqueeze(-1)  # (B, c, 1)
            zt, _ = _head_logits(h_teacher[:, sl], weight, bias, softcap)  # (B, c, V)
            p = torch.softmax(zt, dim=-1)
            kl += torch.linalg.vecdot(p, zt).sum() - zt.logsumexp(-1).sum()  # sum p log p
            del zt
            zf, cap_f = _head_logits(h_full[:, sl], weight, bias, softcap)
            nll_f = (zf.logsumexp(-1) - zf.gather(-1, picked).squeeze(-1)) * valid  # (B, c)
            ce += nll_f.sum()
            dz = torch.softmax(zf, dim=-1)
            dz.scatter_add_(-1, picked, -valid.unsqueeze(-1).to(dz.dtype))  # softmax - onehot(target)
            dz.mul_(valid.unsqueeze(-1))
            del zf
            g_full[:, sl] = _to_hidden(dz, cap_f, weight, g_full.dtype)
            del dz, cap_f
            zs, cap_s = _head_logits(h_skip[:, sl], weight, bias, softcap)
            lse_s = zs.logsumexp(-1)  # (B, c)
            kl += lse_s.sum() - torch.linalg.vecdot(p, zs).sum()
            if want_costs:
                costs[:, sl] = (lse_s - zs.gather(-1, picked).squeeze(-1)) * valid - nll_f
            dz = torch.softmax(zs, dim=-1).sub_(p)
            del zs, p
            g_skip[:, sl] = _to_hidden(dz, cap_s, weight, g_skip.dtype)
        ctx.save_for_backward(g_full, g_skip)
        if costs is not None:
            ctx.mark_non_differentiable(costs)
        return ce, kl, costs

    @staticmethod
    def backward(ctx, grad_ce, grad_kl, grad_costs):
        g_full, g_skip = ctx.saved_tensors
        return g_full * grad_ce, g_skip * grad_kl, None, None, None, None, None, None, None


def head_losses(h_full: torch.Tensor, h_skip: torch.Tensor, h_teacher: torch.Tensor, head, labels: torch.Tensor,
                chunk: int, want_costs: bool = False):
    """(ce_sum of the full path, kl_sum(teacher || skip branch), per-position cost of the skip branch
    (B, T) or None), from final hidden states (B, T, d) and the head `(weight, bias, softcap)`, in chunks
    of `chunk` positions. ce and kl equal `ce_sum(full logits)` and `kl_sum(teacher logits, skip logits)`;
    the cost equals `ce_tokens(skip) - ce_tokens(full)` (detached)."""
    weight, bias, softcap = head
    if weight.requires_grad or (bias is not None and bias.requires_grad):
        raise ValueError("head_losses needs a frozen LM head: it computes no gradient for it")
    targets = next_token_targets(labels)  # (B, T)
    return _HeadLosses.apply(h_full, h_skip, h_teacher.detach(), weight, bias, softcap, targets, chunk, want_costs)
