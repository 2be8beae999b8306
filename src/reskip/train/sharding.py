"""Sharded training for a backbone that does not fit one device: FSDP2 over the frozen decoder layers.

Each decoder layer is one FSDP2 unit (`torch.distributed.fsdp.fully_shard`): a process holds 1/world of every
layer's weights, and a layer's whole weights exist only while it runs (gathered before its forward and again
before its backward, freed after). The layers are frozen, so nothing of theirs is reduced or stepped. What stays
whole on every process: the embeddings, the final norm and the LM head (read outside the layers' forward: the
chunked losses apply the head themselves), and the side-channel, the only trained part, whose gradients are
averaged over the processes here (`average_gradients`) as data-parallel training averages them, so a sharded run
trains what a data-parallel run of the same settings trains, to float rounding.

Every process runs every pass the same way (the skip branch's block and positions are drawn from the step and the
seed alone), so the layers' collectives always meet; validation runs on every process for the same reason."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import compat
from ..ar_retrofit.adapter_io import WHOLE_WEIGHTS_DIGEST, weights_digest
from ..errors import ReskipError


def shard_backbone(base_model: torch.nn.Module, device: torch.device) -> int:
    """Shard every decoder layer of `base_model` (loaded on the host) over the process group onto `device`, and
    move the rest of it there whole; returns the number of sharded layers."""
    # FSDP2's public names need torch 2.6; the package runs on older torch without --shard
    try:
        from torch.distributed.device_mesh import init_device_mesh  # lazy: torch >= 2.6 only under --shard
        from torch.distributed.fsdp import fully_shard  # lazy: torch >= 2.6 only under --shard
        from torch.distributed.tensor import DTensor  # lazy: torch >= 2.6 only under --shard
    except ImportError as e:
        raise ReskipError(f"--shard needs torch >= 2.6 (FSDP2's fully_shard); this is torch {torch.__version__}") from e
    # the adapter and its checkpoints name the backbone by a digest of its weights: taken now, while they are whole
    setattr(base_model, WHOLE_WEIGHTS_DIGEST, weights_digest(base_model))
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    layers = compat.decoder_layers(base_model)
    for layer in layers:
        with torch.no_grad():  # weights read from a memory-mapped file: FSDP frees storage it owns, so copy them
            for p in layer.parameters():
                p.data = p.data.clone()
        fully_shard(layer, mesh=mesh)  # its shard moves to the mesh's device; the whole weights are dropped
    with torch.no_grad():
        for module in base_model.modules():
            for name, t in list(module._parameters.items()) + list(module._buffers.items()):
                if t is not None and not isinstance(t, DTensor) and t.device != device:
                    t.data = t.data.to(device)
    return len(layers)


def average_gradients(params: list[torch.Tensor]) -> None:
    """Every process's gradients of `params` replaced by their mean over the processes, in one collective."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
