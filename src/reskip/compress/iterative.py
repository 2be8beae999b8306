"""Iterative removal: drop the cheapest unit, heal, measure again, drop the next (the fourth way of choosing what a
pruned model leaves out, beside A(n), the ablation's KL, ShortGPT's influence and the angular distance, which all
read the backbone once).

Each round reads every unit still in the model (a block of the retrofit's size, or a single layer) by what removing
it *on top of the current healed model* costs in fidelity: KL(backbone || model without it) per position on the
calibration split. Round one's model is the backbone itself (the ablation read as KL); each later round's is the
model healed at the layers removed so far, which the caller trains (`heal`): this module chooses, it does not
train, so one trainer and its files stay the only ones.

The backbone's references are its final hidden states per batch, (B, T, d), kept once; the head is applied again
for each comparison (the same operations as its forward), so a round costs one pass per candidate unit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import torch
from torch import nn

from .. import compat
from ..backbones.devices import model_device
from ..data.packing import Packed
from ..errors import ReskipError
from ..losses import head_logits, kl_sum, teacher_targets

UNITS = ("blocks", "layers")  # what one round removes: a block of the retrofit's size, or one decoder layer


@dataclass
class RemovalRound:
    """One round: the layers removed before it, every candidate's KL to the backbone with it removed on top (keyed
    by the block number or the layer index), and the candidate chosen (the lowest)."""

    removed_before: list[int]
    kl: dict[int, float]
    chosen: int

    def to_dict(self) -> dict:
        return {**asdict(self), "kl": {str(k): v for k, v in self.kl.items()}}


def candidate_units(blocks: list[list[int]], unit: str) -> dict[int, list[int]]:
    """What a round may remove, by key: the middle blocks (1-based; never the first or the last, the rule every
    block ranking keeps) as their layers, or every layer of those blocks alone (the first block's and the last's
    layers stay, so both units draw from the same layers)."""
    if unit not in UNITS:
        raise ReskipError(f"removal unit {unit!r}: one of {', '.join(UNITS)}")
    middle = {n: list(layers) for n, layers in enumerate(blocks, start=1) if 1 < n < len(blocks)}
    if unit == "blocks":
        return middle
    return {layer: [layer] for layers in middle.values() for layer in layers}


@torch.no_grad()
def backbone_states(backbone: nn.Module, data: Packed, batch_size: int = 4) -> list[torch.Tensor]:
    """The backbone's final hidden states per batch of `data`: [(B, T, d)], the references every round reads."""
    body = compat.decoder_body(backbone)
    return [body(input_ids=ids, use_cache=False).last_hidden_state
            for ids, _ in data.batches(batch_size, model_device(backbone))]


@torch.no_grad()
def removal_kl(model: nn.Module, data: Packed, references: list[torch.Tensor], head, removed: list[int],
               units: dict[int, list[int]], batch_size: int = 4, progress=None) -> dict[int, float]:
    """Per unit, KL(backbone || model without that unit) per position on `data`. `model` is the backbone or a
    healing run's model (a PEFT model) whose layers `removed` are already gone, its layers renumbered; the units name the
    backbone's layer indices. `head` is the backbone's (`compat.output_head`), `references` its states."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    n_layers = len(compat.decoder_layers(base)) + len(removed)
    now = {layer: i for i, layer in enumerate(i for i in range(n_layers) if i not in set(removed))}
    device = model_device(model)
    out = {}
    for key, layers in units.items():
        if set(layers) & set(removed):
            raise ReskipError(f"unit {key} ({layers}) is already removed")
        kl = torch.zeros((), dtype=torch.float64, device=device)  # summed on the device, read once per unit
        positions = 0
        with compat.layers_removed(base, {now[layer] for layer in layers}):
            for (ids, _), h in zip(data.batches(batch_size, device), references):
                z = model(input_ids=ids, use_cache=False).logits  # (B, T, V)
                kl += kl_sum(teacher_targets(head_logits(h, head)), z).double()
                positions += ids.numel()
        out[key] = kl.item() / positions
        if progress is not None:
            progress.update(1)
    return out


def iterative_removal(backbone: nn.Module, data: Packed, units: dict[int, list[int]], k: int,
                      heal: Callable[[list[int]], nn.Module], batch_size: int = 4,
                      progress=None) -> list[RemovalRound]:
    """k rounds of: read every unit still in the model by `removal_kl`, remove the cheapest, and (before every
    round but the first) take the model `heal(removed_layers)` returns: the caller's model healed at those layers.
    Returns the rounds; the layers removed in the end are the last round's `removed_before` plus its choice."""
    if not 1 <= k <= len(units):
        raise ReskipError(f"cannot remove {k} units: {len(units)} may be removed")
    references = backbone_states(backbone, data, batch_size)
    head = compat.output_head(backbone)
    removed: list[int] = []
    rounds = []
    model = backbone
    for r in range(k):
        if r:
            model = heal(removed)
        free = {key: layers for key, layers in units.items() if not set(layers) & set(removed)}
        kl = removal_kl(model, data, references, head, removed, free, batch_size, progress)
        chosen = min(kl, key=kl.get)
        rounds.append(RemovalRound(list(removed), kl, chosen))
        removed = sorted(removed + units[chosen])
    return rounds


def removed_layers(rounds: list[RemovalRound], units: dict[int, list[int]]) -> list[int]:
    """The layers every round together removes."""
    return sorted({layer for r in rounds for layer in units[r.chosen]})
