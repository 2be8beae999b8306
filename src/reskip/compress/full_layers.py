"""Healing capacity beyond a LoRA: a few whole decoder layers next to the cut, and the final norm, trained in full
(the layer-pruning literature's healer: fine-tuning the layers around the gap beats a LoRA of the same size).

They are PEFT's `modules_to_save` of the healing's adapter, so one loader, one save and one merge serve every healing run: the
adapter file holds the trained copies, `merge_and_unload` puts them in place, `disable_adapter` gives the teacher
the backbone's own modules back. The modules are chosen by structure (the kept layers nearest a removed one, then
the decoder's final norm) and handed to PEFT by their exact qualified names (`lora_ranks.full_module_names`).

While training, the trained copies hold float32 master weights (bfloat16 would round a 1e-4 update away); a hook
casts their floating inputs to float32 and their output back to the model's dtype, so the layers around them see
what they saw before. Loaded for scoring or export, the copies are in the model's dtype and need no hook.
"""

from __future__ import annotations

import torch
from peft.utils import ModulesToSaveWrapper
from torch import nn

from ..errors import ReskipError


def layers_next_to_cut(n_layers: int, drop: list[int], count: int) -> list[int]:
    """The `count` kept layers nearest a removed one, as indices of the pruned model: by distance to the nearest
    removed layer, the layer after a cut before the layer before it at equal distance."""
    kept = [i for i in range(n_layers) if i not in set(drop)]
    if not drop or not 0 < count <= len(kept):
        raise ReskipError(f"{count} layers next to the cut: need removed layers and 1 to {len(kept)} layers (the "
                          "model keeps that many)")

    def distance(i: int) -> tuple[int, int]:
        d = min(abs(i - j) for j in drop)
        return d, 0 if any(j == i - d for j in drop) else 1  # after a cut first

    chosen = sorted(kept, key=distance)[:count]
    return sorted(kept.index(i) for i in chosen)


def full_copies(model: nn.Module) -> list[nn.Module]:
    """The trainable copies PEFT made of the modules trained in full (none for a plain LoRA)."""
    return [w.modules_to_save[w.active_adapter] for w in model.modules() if isinstance(w, ModulesToSaveWrapper)
            and w.active_adapter in w.modules_to_save]


def train_in_float32(model: nn.Module) -> list[nn.Parameter]:
    """Make the full copies float32 master weights that compute in float32 between the model's dtype on both sides;
    returns their parameters (the healing's second parameter group)."""
    params = []
    for copy in full_copies(model):
        dtype = next(copy.parameters()).dtype
        copy.float()
        copy.register_forward_pre_hook(_cast_inputs, with_kwargs=True)
        copy.register_forward_hook(lambda m, a, out, dtype=dtype: _cast(out, dtype))
        params += list(copy.parameters())
    return params


def _cast(value, dtype: torch.dtype):
    """Floating tensors in `value` (a tensor, tuple, list or dict, nested) cast to `dtype`; the rest as it is."""
    if torch.is_tensor(value):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value


def _cast_inputs(module, args, kwargs):
    # the attention mask too: a float mask must match the float32 scores' dtype
    return _cast(args, torch.float32), _cast(kwargs, torch.float32)
