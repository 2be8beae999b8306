"""A LoRA with a given number of trainable parameters, on every linear projection of the decoder layers: the
ranks that match a parameter count (the baselines' LoRA, and the LoRA a retrofit may carry inside its blocks).

One LoRA rank on a linear map of shape (out, in) costs in + out parameters, so one rank on every projection of a
layer costs that layer's sum of (in + out) (10,176 on a SmolLM2 layer: q, k, v, o, gate, up, down). The ranks
are dealt out as evenly as the layers allow: R = round(target / mean cost) ranks in all, floor(R / L) per layer
and one more on R mod L layers spread over the depth, so the count lands within half a layer-rank of the target
(987,072 against the side-channel's 982,663 on SmolLM2: +0.45%). Each module's `lora_alpha` is twice its rank,
so every layer's update has the same scale (alpha / r = 2).
"""

from __future__ import annotations

import re

from torch import nn

from . import compat
from .errors import ReskipError

ALPHA_PER_RANK = 2.0  # lora_alpha / r for every module: the update's scale


def projections(model: nn.Module) -> list[list[tuple[str, nn.Linear]]]:
    """Per decoder layer, its linear projections as (full module name, module): what LoRA adapts (by structure:
    the nn.Linear modules inside `compat.decoder_layers`, never the LM head or the embeddings)."""
    layers = compat.decoder_layers(model)
    names = {id(m): n for n, m in model.named_modules()}
    return [[(names[id(m)], m) for m in layer.modules() if isinstance(m, nn.Linear)] for layer in layers]


def rank_cost(layer: list[tuple[str, nn.Linear]]) -> int:
    """Parameters of one LoRA rank on every projection of a layer: sum of (in + out)."""
    return sum(m.in_features + m.out_features for _, m in layer)


def matched_ranks(costs: list[int], target: int) -> list[int]:
    """Ranks per layer (layer costs `costs` per rank) whose parameters come nearest `target`: R ranks in all,
    floor(R / L) each and one more on R mod L layers spread evenly over the depth."""
    if target <= 0 or not costs:
        raise ReskipError(f"a LoRA needs layers and a positive parameter target, got {len(costs)} layers, {target}")
    total = max(1, round(target * len(costs) / sum(costs)))
    base, extra = divmod(total, len(costs))
    ranks = [base] * len(costs)
    for j in range(extra):  # spread: the j-th extra rank goes to layer floor((j + 0.5) L / extra)
        ranks[int((j + 0.5) * len(costs) / extra)] += 1
    return ranks


def lora_parameters(costs: list[int], ranks: list[int]) -> int:
    return sum(c * r for c, r in zip(costs, ranks))


def full_module_names(model: nn.Module, layers: list[int]) -> list[str]:
    """Exact qualified names of the decoder layers `layers` (of the model as it is) and of its final norm: the
    modules a LoRA config trains in full (PEFT's modules_to_save), chosen by structure."""
    names = {id(m): n for n, m in model.named_modules()}
    decoder = compat.decoder_layers(model)
    return [names[id(decoder[i])] for i in layers] + [names[id(compat.final_norm(model))]]


def matched_lora_config(model: nn.Module, target: int, full_layers: list[int] = ()) -> tuple:
    """(the PEFT LoraConfig whose trainable parameters on `model` come nearest `target`, its accounting: {ranks
    per layer, parameters, target, rel_diff}). `full_layers`: decoder layers trained in full instead, with the
    final norm (`compress.full_layers`; PEFT's modules_to_save); they carry no LoRA: the ranks are dealt over the
    other layers."""
    from peft import LoraConfig  # lazy: counting parameters needs no PEFT until a LoRA is asked for

    layers = [layer for i, layer in enumerate(projections(model)) if i not in set(full_layers)]
    costs = [rank_cost(layer) for layer in layers]
    ranks = matched_ranks(costs, target)
    full = [min(min(m.in_features, m.out_features) for _, m in layer) for layer in layers]  # a rank's ceiling
    if any(r > f for r, f in zip(ranks, full)):
        raise ReskipError(f"a LoRA of {target:,} parameters needs rank {max(ranks)} on every layer, above the full "
                          f"rank of their projections ({min(full)}): at most {lora_parameters(costs, full):,} "
                          "parameters on this model")
    common = max(set(ranks), key=ranks.count)
    targets, pattern = [], {}
    for layer, r in zip(layers, ranks):
        for name, _ in layer:
            if r > 0:
                targets.append(name)
                if r != common:
                    pattern[re.escape(name)] = r
    config = LoraConfig(r=common, lora_alpha=ALPHA_PER_RANK * common, lora_dropout=0.0, bias="none",
                        target_modules=targets, rank_pattern=pattern,
                        alpha_pattern={k: ALPHA_PER_RANK * r for k, r in pattern.items()},
                        modules_to_save=full_module_names(model, list(full_layers)) if full_layers else None)
    params = lora_parameters(costs, ranks)
    return config, {"ranks": ranks, "parameters": params, "target": target, "rel_diff": params / target - 1}
