"""The methods that are models of their own (`spec.KINDS` with `opens="model"`): a LoRA healing run, one with layers removed, the
backbone with blocks removed. Each is scored beside the run's methods on the same sequences and against the same
references (the backbone's logits, computed once per group): one cache-free pass over a group, no skip decisions,
its compute the layers it keeps.

A scorer is what `evaluate.methods` needs of such a method: the logits of a group (G, T, V), the blocks it removed
and the share of layer FLOPs it executes. Each kind's row in `spec.KINDS` names the function that opens it
(`Kind.scorer`, "module:function", imported when first used): a new trained kind writes its opener in its own
module and names it there, nothing here changes.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from ..backbones.devices import model_device
from ..backbones.dtypes import resolve_dtype
from ..backbones.loading import load_backbone
from ..compress.blocks import BlockCosts, backbone_block_costs, prune
from ..compress.export import RECORD, read_record
from ..compress.healing_run import layers_removed_by, load_healed_model, read_healing_run
from ..data.packing import Packed
from ..errors import ReskipError
from ..skip.spec import KINDS, Spec


@dataclass
class ModelScorer:
    """A model scored as one method: `logits` of a group in one cache-free pass (G, T, V); it removed
    `dropped_layers` (its `dropped_blocks` of the retrofit's partition) of `n_layers` decoder layers."""

    model: nn.Module
    dropped_layers: list[int]
    dropped_blocks: list[int]
    n_layers: int

    @torch.no_grad()
    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        self.model.eval()
        return self.model(input_ids=ids.to(model_device(self.model)), use_cache=False).logits

    @property
    def executed_share(self) -> float:
        """Its layer FLOPs over the backbone's (every decoder layer of these families costs the same)."""
        return 1 - len(self.dropped_layers) / self.n_layers


@dataclass
class ScorerContext:
    """What opening a model method needs from the evaluation: the backbone (name, dtype, device, trust), its blocks
    (the retrofit's partition), and the calibration sequences that rank blocks for `pruned:K` (packed when first
    needed; the backbone's A(n) measured once)."""

    model: str | None
    dtype: str
    device: str
    trust_remote_code: bool
    blocks: list[list[int]]
    calibration: Callable[[], Packed]
    _costs: BlockCosts | None = field(default=None, repr=False)

    def load(self):
        return load_backbone(self.model, self.dtype, self.trust_remote_code, self.device)

    def block_costs(self) -> BlockCosts:
        if self._costs is None:
            backbone, _ = self.load()
            self._costs = backbone_costs_on(backbone, self.calibration(), self.blocks)
        return self._costs


def backbone_costs_on(backbone: nn.Module, data: Packed, blocks: list[list[int]]) -> BlockCosts:
    """The backbone's A(n) and block influence for the given partition (its boundaries read off the blocks)."""
    boundaries = [b[0] for b in blocks[1:]]
    return backbone_block_costs(backbone, data, block_size=len(blocks[0]), boundaries=boundaries)


def open_healing_run(spec: Spec, ctx: ScorerContext) -> ModelScorer:
    """A healing run (`reskip compress`'s heal/, an arm of `reskip experiment baselines`) on the evaluation's backbone."""
    cfg, healing = read_healing_run(Path(spec.run))
    if (cfg.model or None) != (ctx.model or None):
        raise ReskipError(f"{spec.text}: the healing run was trained on the backbone {cfg.model or 'default'!r}, the "
                          f"evaluation's is {ctx.model or 'default'!r}: compare methods of one backbone")
    depth = int(spec.k) if spec.kind == "nested" else None
    model, _ = load_healed_model(Path(spec.run), ctx.dtype, ctx.device, ctx.trust_remote_code, depth)
    blocks = healing.nested_blocks[:depth] if healing.nested else list(healing.drop_blocks)
    return ModelScorer(model, layers_removed_by(healing, Path(spec.run), depth), blocks, sum(len(b) for b in ctx.blocks))


def open_pruned(spec: Spec, ctx: ScorerContext) -> ModelScorer:
    """The backbone with its K cheapest middle blocks (its own A(n), the calibration split) removed."""
    costs = ctx.block_costs()
    blocks = costs.cheapest(int(spec.k))
    layers = sorted(costs.layers_of(blocks))
    backbone, _ = ctx.load()
    return ModelScorer(prune(backbone, set(layers)), layers, blocks, sum(len(b) for b in ctx.blocks))


def open_export(spec: Spec, ctx: ScorerContext) -> ModelScorer:
    """A plain folder, loaded as any user loads it (`AutoModelForCausalLM`), in the evaluation's dtype and device."""
    record = read_record(Path(spec.run))
    n_layers = sum(len(b) for b in ctx.blocks)
    if record["backbone_layers"] != n_layers:
        raise ReskipError(f"{spec.text}: the folder came from a backbone of {record['backbone_layers']} layers, the "
                          f"evaluation's has {n_layers}: compare methods of one backbone")
    model = AutoModelForCausalLM.from_pretrained(spec.run, dtype=resolve_dtype(ctx.dtype, ctx.device)).to(ctx.device)
    # the compute share is the model's own (its layers), read from what was loaded, never from the record alone
    kept = model.config.num_hidden_layers
    drop = list(record["drop_layers"])
    if kept + len(drop) != n_layers or len(set(drop)) != len(drop) or not all(0 <= i < n_layers for i in drop):
        raise ReskipError(f"{spec.text}: the folder's model has {kept} layers, and its {RECORD} says layers {drop} of "
                          f"{n_layers} were removed: the record does not describe this model; export it again")
    return ModelScorer(model.eval(), drop, list(record["drop_blocks"]), n_layers)


def _named(where: str) -> Callable:
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)


def opener(kind: str) -> Callable[[Spec, ScorerContext], ModelScorer]:
    """The function `KINDS[kind].scorer` names."""
    return _named(KINDS[kind].scorer)


def check_export(spec: Spec) -> None:
    """An exported folder has its record."""
    read_record(Path(spec.run))


def check_healing_run(spec: Spec) -> None:
    """The folder is a healing run of the spec's kind: a plain LoRA (lora:), one depth with layers removed (healed:) or
    nested depths (nested:K, K among its depths)."""
    _, healing = read_healing_run(Path(spec.run))
    kind = "nested" if healing.nested else "healed" if healing.drop_layers else "lora"
    if kind != spec.kind:
        form = {"nested": f"nested:K:{spec.run} (K from 0 to {healing.depths})", "healed": f"healed:{spec.run}",
                "lora": f"lora:{spec.run}"}[kind]
        raise ReskipError(f"{spec.text}: the healing run is a {kind} one: score it as {form}")
    if healing.nested:
        healing.layers_at(int(spec.k))  # a depth it does not serve: one clear error


def check_model_spec(spec: Spec) -> None:
    """What can be checked of a model method before any weights load (its kind's `checker`)."""
    if KINDS[spec.kind].checker:
        _named(KINDS[spec.kind].checker)(spec)


def open_scorer(spec: Spec, ctx: ScorerContext) -> ModelScorer:
    return opener(spec.kind)(spec, ctx)
