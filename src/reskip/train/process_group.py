"""Sums over the training processes, for the loss terms that are not sums over tokens.

CE, KL and entropy are per-token sums scaled by global counts, so DDP's gradient average already
gives the one-process gradient. A correlation or a ratio of sums is not such a sum: computed per
process it would make two processes train something else than one. Those terms reduce their
sufficient statistics here first. With one process (or no process group) every function is the
identity, so a single-process run computes exactly what it did before."""

from __future__ import annotations

import torch
import torch.distributed as dist


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class _SumOverProcesses(torch.autograd.Function):
    """all_reduce(SUM) forward and backward: the gradient of a sum over processes w.r.t. each
    process's term is the sum of every process's gradient of the result. (Written here because
    torch.distributed.nn.functional.all_reduce, which does the same, is deprecated.)"""

    @staticmethod
    def forward(ctx, t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        dist.all_reduce(t)
        return t

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


def global_sum(t: torch.Tensor, differentiable: bool = False) -> torch.Tensor:
    """`t` summed over the processes. differentiable: its backward sums the processes' gradients;
    every process then holds the same loss value, so after DDP averages the gradients each
    process's statistics get exactly the one-process gradient."""
    if world_size() == 1:
        return t
    if differentiable:
        return _SumOverProcesses.apply(t)
    t = t.detach().clone()
    dist.all_reduce(t)
    return t
