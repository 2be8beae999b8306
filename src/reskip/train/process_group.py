"""Sums over the training processes, for the loss terms that are not sums over tokens.

CE, KL and entropy are per-token sums scaled by global counts, so DDP's gradient average already
gives the one-process gradient. A correlation or a ratio of sums is not such a sum: computed per
process it would make two processes train something else than one. Those terms reduce their
sufficient statistics here first. With one process (or no process group) every function is the
identity, so a single-process run computes exactly what it did before."""

from __future__ import annotations

import os
import re

import torch
import torch.distributed as dist

from ..errors import ReskipError


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


def launched_processes() -> int:
    """The processes a launcher (torchrun, `accelerate launch --multi_gpu`) started for this job, from its
    environment, before any process group exists; 1 without a launcher."""
    text = os.environ.get("WORLD_SIZE", "1")
    if not text.isdigit() or int(text) < 1:
        raise ReskipError(f"WORLD_SIZE={text!r} in the environment is not a process count: unset it, or run under "
                          "torchrun or accelerate launch, which set it")
    n = int(text)
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if n > 1 and not os.environ.get(k)]
    if missing:
        raise ReskipError(f"WORLD_SIZE={n} but no launcher started this process ({', '.join(missing)} not set): run "
                          "it under torchrun or accelerate launch, or unset WORLD_SIZE to train as one process")
    return n


def asked_processes(parent_command: list[str]) -> int:
    """The processes an `accelerate launch` command line (`accelerate launch`, `python -m
    accelerate.commands.launch`) asked for (`--num_processes N`, `--num_processes=N`), 1 when it names none or is
    not one."""
    launcher = "accelerate.commands.launch" in parent_command or (
        "launch" in parent_command and any(a.endswith("accelerate") for a in parent_command))
    if not launcher:
        return 1
    text = " ".join(parent_command)
    found = re.search(r"--num[_-]processes(?:=|\s+)(\d+)", text)
    return int(found.group(1)) if found else 1


def check_launch() -> None:
    """Refuse a launch that started fewer processes than it was asked for: `accelerate launch --cpu
    --num_processes N` runs one process through its simple launcher (no process group, no word from accelerate),
    so a user would train alone believing N processes share the batch."""
    if launched_processes() > 1:
        return
    try:
        import psutil  # lazy: accelerate's own dependency, only read here

        parent = psutil.Process().parent()
        command = parent.cmdline() if parent is not None else []
    except Exception:  # the parent is gone or unreadable: nothing to check against
        return
    asked = asked_processes(command)
    if asked > 1:
        raise ReskipError(f"accelerate launch was asked for {asked} processes but started one (with --cpu it runs a "
                          f"single process); use `accelerate launch --multi_gpu --num_processes {asked}` (it also "
                          f"starts CPU processes) or `torchrun --nproc_per_node {asked}`")
