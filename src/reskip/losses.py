"""The three loss terms, as sums over tokens (the caller normalises by the global token count)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .fusion import fused


def next_token_targets(labels: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, T): position t's target is token t+1 (-100: none, as at the last position)."""
    return F.pad(labels[:, 1:], (0, 1), value=-100)


def token_nll(z: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """-log softmax(z)[target] in float32 for logits z (N, V) in any dtype and targets (N,); 0 where the target
    is -100. logsumexp(z) - z[target]: no (N, V) log-probabilities are written, and compiled (`fusion.fused`)
    the float32 copy of z is never written either."""
    valid = targets != -100
    zf = z.float()
    return (zf.logsumexp(-1) - zf.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1)) * valid


def _nll(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token NLL per position (B, T) of logits (B, T, V): `token_nll`, fused where it pays, when no gradient
    is needed; torch's `cross_entropy` (whose backward autograd knows) when one is."""
    targets = next_token_targets(labels)  # (B, T)
    z, t = logits.flatten(0, 1), targets.flatten()
    if torch.is_grad_enabled() and logits.requires_grad:
        nll = F.cross_entropy(z.float(), t, ignore_index=-100, reduction="none")
    else:
        nll = fused(token_nll, z.numel(), dynamic=True)(z, t)
    return nll.view(targets.shape)


def ce_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy summed over labelled positions. logits (B, T, V), labels (B, T).

    The labels are shifted, not the logits: slicing (B, T, V) logits would copy them.
    """
    return _nll(logits, labels).sum()


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
    return _nll(logits, labels)


@torch.no_grad()
def head_logits(h: torch.Tensor, head) -> torch.Tensor:
    """float32 logits (B, T, V) of final hidden states h (B, T, d) through head = `compat.output_head(model)`:
    the same operations as the family's forward, so the same values as its `.logits`."""
    weight, bias, softcap = head
    return _capped(F.linear(h, weight, bias), softcap)[0].float()


def _capped(u: torch.Tensor, softcap) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits from raw head outputs u (N, V) in u's dtype, as the family's forward computes them, and
    d logits / d u in float32 (None without a soft-cap)."""
    if softcap is None:
        return u, None
    t = torch.tanh(u / softcap)
    return t * softcap, 1 - t.float() ** 2


def chunk_terms(zt: torch.Tensor, zf: torch.Tensor, zs: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor,
                cap_f: torch.Tensor | None, cap_s: torch.Tensor | None, want_costs: bool):
    """One chunk's share of CE(full) and KL(teacher || skip), and their gradients, from the logits (N, V) of the
    teacher, full and skip passes in the model's dtype (consumed: float32 ones are overwritten). targets (N,) >= 0,
    valid (N,) bool: positions with a target; cap_f, cap_s: d logits / d head output (N, V) float32 under a
    soft-cap, else None.

    Returns float32 sums ce and kl; dz_full, dz_skip (N, V): d ce / d (full head output) and d kl / d (skip head
    output) in zf's dtype; costs (N,) = skip NLL - full NLL (0 where not valid), or None. Every reduction is in
    float32; each (N, V) array is read as few times as eager PyTorch allows (logsumexp, then exp of the shifted
    logits in place), and `torch.compile` fuses what is left where it pays (`fusion.fused`)."""
    picked = targets.unsqueeze(-1)  # (N, 1)
    keep = valid.unsqueeze(-1)  # (N, 1)
    dtype = zf.dtype
    zt = zt.float()
    lse_t = zt.logsumexp(-1, keepdim=True)  # (N, 1)
    p = zt.sub(lse_t).exp_()  # p_teacher, (N, V)
    kl = torch.linalg.vecdot(p, zt).sum() - lse_t.sum()  # sum p log p = sum p z - logsumexp z, as sum p = 1
    del zt
    zf = zf.float()
    lse_f = zf.logsumexp(-1, keepdim=True)  # (N, 1)
    nll_f = (lse_f - zf.gather(-1, picked)).squeeze(-1) * valid  # (N,)
    dz_full = zf.sub_(lse_f).exp_().scatter_add_(-1, picked, torch.full_like(lse_f, -1.0))  # softmax - onehot
    dz_full = (dz_full if cap_f is None else dz_full.mul_(cap_f)).mul_(keep)
    zs = zs.float()
    lse_s = zs.logsumexp(-1, keepdim=True)
    kl = kl + lse_s.sum() - torch.linalg.vecdot(p, zs).sum()
    costs = (lse_s - zs.gather(-1, picked)).squeeze(-1) * valid - nll_f if want_costs else None
    dz_skip = zs.sub_(lse_s).exp_().sub_(p)  # softmax(zs) - p
    if cap_s is not None:
        dz_skip.mul_(cap_s)
    return nll_f.sum(), kl, dz_full.to(dtype), dz_skip.to(dtype), costs


class _HeadLosses(torch.autograd.Function):
    """CE of the full path and KL(teacher || skip branch) from the three passes' final hidden states,
    one chunk of positions at a time, so no (B, T, V) tensor is ever held: each chunk's logits give
    its loss and, at once, the loss's gradient with respect to the chunk's hidden states (the LM head
    is frozen), which backward only scales. The same values and gradients as `ce_sum` and `kl_sum`
    on whole logits (Liger-Kernel's fused linear cross-entropy does this for CE alone)."""

    @staticmethod
    def forward(ctx, h_full, h_skip, h_teacher, weight, bias, softcap, targets, chunk, want_costs):
        B, T, d = h_full.shape
        g_full, g_skip = torch.zeros_like(h_full), torch.zeros_like(h_skip)  # (B, T, d)
        ce = torch.zeros((), dtype=torch.float32, device=h_full.device)
        kl = torch.zeros((), dtype=torch.float32, device=h_full.device)
        costs = torch.zeros(B, T, dtype=torch.float32, device=h_full.device) if want_costs else None
        terms = fused(chunk_terms, B * min(chunk, T) * weight.shape[0])
        for a in range(0, T, chunk):
            sl = slice(a, min(a + chunk, T))
            t = targets[:, sl].reshape(-1)  # (N,) with N = B c
            # Each chunk as a 2-D (N, d) matrix: on a 3-D slice, which is not contiguous when B > 1, the
            # product falls back to a batched one that first copies the (V, d) head once per row. The soft-cap,
            # where the family has one, is applied as its forward does (in the model's dtype).
            (zt, _), (zf, cap_f) = (_capped(F.linear(h[:, sl].reshape(-1, d), weight, bias), softcap)
                                    for h in (h_teacher, h_full))  # (N, V) each
            if h_skip is h_full:  # one pass read twice (distillation's CE and KL of the same states): no second head
                zs, cap_s = zf.clone(), None if cap_f is None else cap_f.clone()  # chunk_terms may overwrite its inputs
            else:
                zs, cap_s = _capped(F.linear(h_skip[:, sl].reshape(-1, d), weight, bias), softcap)
            c_ce, c_kl, dz_full, dz_skip, c_costs = terms(zt, zf, zs, t.clamp_min(0), t != -100, cap_f, cap_s, want_costs)
            del zt, zf, zs, cap_f, cap_s
            ce += c_ce
            kl += c_kl
            if want_costs:
                costs[:, sl] = c_costs.view(B, -1)
            g_full[:, sl] = (dz_full.to(weight.dtype) @ weight).view(B, -1, d).to(g_full.dtype)
            del dz_full
            g_skip[:, sl] = (dz_skip.to(weight.dtype) @ weight).view(B, -1, d).to(g_skip.dtype)
            del dz_skip
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


def ce_chunk_terms(z: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor, cap: torch.Tensor | None):
    """One chunk's CE sum and its gradient d ce / d (head output) (N, V) in z's dtype, from logits z (N, V) in the
    model's dtype (consumed in float32), targets (N,) >= 0, valid (N,) bool; cap: d logits / d head output under
    a soft-cap, else None. Reductions in float32; the (N, V) array read as few times as eager PyTorch allows."""
    picked = targets.unsqueeze(-1)  # (N, 1)
    dtype = z.dtype
    z = z.float()
    lse = z.logsumexp(-1, keepdim=True)  # (N, 1)
    nll = (lse - z.gather(-1, picked)).squeeze(-1) * valid  # (N,)
    dz = z.sub_(lse).exp_().scatter_add_(-1, picked, torch.full_like(lse, -1.0))  # softmax - onehot
    dz = (dz if cap is None else dz.mul_(cap)).mul_(valid.unsqueeze(-1))
    return nll.sum(), dz.to(dtype)


class _HeadCE(torch.autograd.Function):
    """`_HeadLosses` for cross-entropy alone: CE from final hidden states through a frozen LM head, a chunk of
    positions at a time, each chunk's gradient with respect to its hidden states computed at once (no (B, T, V)
    tensor is held, and the (N, V) work is fused where it pays)."""

    @staticmethod
    def forward(ctx, h, weight, bias, softcap, targets, chunk):
        B, T, d = h.shape
        g = torch.zeros_like(h)  # (B, T, d)
        ce = torch.zeros((), dtype=torch.float32, device=h.device)
        terms = fused(ce_chunk_terms, B * min(chunk, T) * weight.shape[0])
        for a in range(0, T, chunk):
            sl = slice(a, min(a + chunk, T))
            t = targets[:, sl].reshape(-1)  # (N,) with N = B c
            z, cap = _capped(F.linear(h[:, sl].reshape(-1, d), weight, bias), softcap)  # (N, V)
            c_ce, dz = terms(z, t.clamp_min(0), t != -100, cap)
            del z, cap
            ce += c_ce
            g[:, sl] = (dz.to(weight.dtype) @ weight).view(B, -1, d).to(g.dtype)
            del dz
        ctx.save_for_backward(g)
        return ce

    @staticmethod
    def backward(ctx, grad_ce):
        (g,) = ctx.saved_tensors
        return g * grad_ce, None, None, None, None, None


def head_ce(h: torch.Tensor, head, labels: torch.Tensor, chunk: int) -> torch.Tensor:
    """`ce_sum` of the logits that final hidden states h (B, T, d) give through the frozen `head` (weight, bias,
    softcap), `chunk` positions at a time: the same value and gradient with respect to h, without (B, T, V)
    logits."""
    weight, bias, softcap = head
    if weight.requires_grad or (bias is not None and bias.requires_grad):
        raise ValueError("head_ce needs a frozen LM head: it computes no gradient for it")
    return _HeadCE.apply(h, weight, bias, softcap, next_token_targets(labels), chunk)
