"""The device a stage computes on: `auto` is CUDA when torch sees a GPU, else the CPU.

Every stage takes the same name (`--device`, `device=`), resolves it once here, loads its model there, and moves
what it reads from the host (token ids, masks) to the model's device at the point of use (`model_device`). The
resolved name is what the stage's files record, beside the dtype."""

from __future__ import annotations

import torch

from ..device_names import DEVICE_PATTERN
from ..errors import ReskipError


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """'auto' -> cuda when torch sees one, else cpu; 'cpu', 'cuda', 'cuda:N' as themselves, checked against what
    this machine has (one error naming what to pass instead)."""
    if isinstance(name, torch.device):  # one torch already made (an engine's: 'cpu:0' under gloo) is as it is
        return torch.device("cpu") if name.type == "cpu" else name
    name = name or "auto"
    if not DEVICE_PATTERN.fullmatch(name):
        raise ReskipError(f"device must be auto, cpu, cuda or cuda:N, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ReskipError(f"--device {name}: torch sees no CUDA device on this machine; pass --device cpu (or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ReskipError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                              f"numbered from 0")
    return device


def device_name(device: str | torch.device | None) -> str:
    """The name files record: 'cpu', or 'cuda:N' with the index the process actually uses."""
    device = resolve_device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


def model_device(model: torch.nn.Module) -> torch.device:
    """Where `model` computes: its input embeddings' device (a sharded or offloaded model's first stage)."""
    embeddings = getattr(model, "get_input_embeddings", lambda: None)()
    if embeddings is not None and getattr(embeddings, "weight", None) is not None:
        return embeddings.weight.device
    return next(model.parameters()).device
