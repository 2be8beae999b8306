"""A healing run's files, checked before and as they load: its record (config.yaml's `lora:`, typed field by field), the
layers it names against the backbone's, the adapter's config and weights, and that the weights are the ones trained
on this healing run's pruning (the record `TRAINED_ON` beside them, and every LoRA tensor the model expects present and no
other). A file someone shared or a disk cut short is one clear error naming the file, never a library's traceback
or a model that loaded with half its adapter."""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from pathlib import Path

from peft import get_peft_model_state_dict
from safetensors import SafetensorError, safe_open

from ..config_fields import check_fields
from ..errors import ReskipError
from ..reading import read_json

TRAINED_ON = "reskip_trained_on.json"  # beside the adapter: the layers removed when it trained
WEIGHTS = "adapter_model.safetensors"


def typed_healing_config(cls, data, where: str):
    """`cls(**data)` for a HealingConfig record, each field's type and range checked (`where` names the file)."""
    if not isinstance(data, dict):
        raise ReskipError(f"{where}: lora: is a mapping of the healing's fields")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(map(str, data)) - set(fields))
    if unknown:
        raise ReskipError(f"{where}: unknown lora field(s) {', '.join(unknown)}; valid: {', '.join(fields)}")
    hints = typing.get_type_hints(cls)
    for name, value in data.items():
        if not _fits(value, hints[name]):
            raise ReskipError(f"{where}: lora.{name} must be {hints[name]}, got {value!r}")
    healing = cls(**data)
    try:
        check_fields(healing)
    except ReskipError as e:
        raise ReskipError(f"{where}: {e}") from None
    return healing


def _fits(value, hint) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, hint)


def check_layers(healing, n_layers: int, where: str) -> None:
    """Every layer the healing removes exists in a backbone of `n_layers` layers, and at least one is kept."""
    named = [*healing.drop_layers, *(i for layers in healing.nested_layers for i in layers)]
    bad = sorted({i for i in named if not 0 <= i < n_layers})
    if bad:
        raise ReskipError(f"{where}: lora names layer(s) {bad}; the backbone has layers 0 to {n_layers - 1}")
    if len(set(named)) >= n_layers:
        raise ReskipError(f"{where}: lora removes every layer of the backbone")


def write_trained_on(folder: Path, drop_layers: list[int], nested_layers: list[list[int]]) -> None:
    (Path(folder) / TRAINED_ON).write_text(json.dumps({"drop_layers": list(drop_layers),
                                                       "nested_layers": [list(x) for x in nested_layers]}))


def check_adapter_files(folder: Path, healing, kept_layers: int) -> None:
    """The adapter folder before the backbone loads: a LoRA config that is JSON, weights that can be read, of the
    ranks the config names, on exactly the `kept_layers` layers the healing's model has, and recorded as trained on this
    healing's layers (`TRAINED_ON`; an adapter written before the record existed has none)."""
    config = read_json(folder / "adapter_config.json")
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise ReskipError(f"{folder / 'adapter_config.json'}: not a LoRA adapter's config (peft_type "
                          f"{config.get('peft_type') if isinstance(config, dict) else None!r}); train the healing run again")
    if (folder / TRAINED_ON).is_file():
        record = read_json(folder / TRAINED_ON)
        mine = {"drop_layers": list(healing.drop_layers), "nested_layers": [list(x) for x in healing.nested_layers]}
        if not isinstance(record, dict) or set(record) != set(mine):
            raise ReskipError(f"{folder / TRAINED_ON} is not an adapter's record of the layers it trained without (an "
                              "object of drop_layers and nested_layers): it was edited or cut; train the healing run again")
        if record != mine:
            what = ("the depths' layers in the order " + str(record["nested_layers"]) if healing.nested
                    else f"layers {record['drop_layers']} removed")
            mine_text = (f"its config.yaml orders them {healing.nested_layers}" if healing.nested
                         else f"the healing removes {healing.drop_layers}")
            raise ReskipError(f"{folder} holds an adapter trained with {what}, but {mine_text}: the adapter belongs to "
                              "another healing run (or its record was edited); train the healing run again")
    elif healing.nested:
        raise ReskipError(f"{folder / TRAINED_ON} is missing: a nested healing run's adapter says which layers each depth "
                          "trained without, and without it a depth it was never trained for could be served; train "
                          "the healing run again")
    shapes = adapter_shapes(folder)
    ranks = {config.get("r"), *(config.get("rank_pattern") or {}).values()}
    held = {shape[0] for key, shape in shapes.items() if ".lora_A." in key}
    if not held <= ranks:
        raise ReskipError(f"{folder}: adapter_config.json names rank(s) {sorted(r for r in ranks if r is not None)}, "
                          f"the weights hold rank(s) {sorted(held)}: the config and weights are of different adapters")
    # a parameter-matched LoRA may leave some layers without a rank, never name a layer the model lacks
    layers = {int(m.group(1)) for key in shapes if (m := re.search(r"\.layers\.(\d+)\.", key))}
    if not layers <= set(range(kept_layers)):
        raise ReskipError(f"{folder / WEIGHTS} holds LoRA tensors for layer {max(layers)}, this healing run's model has "
                          f"{kept_layers} layers: the adapter was trained on another pruning")


def adapter_shapes(folder: Path) -> dict[str, list[int]]:
    """Tensor name -> shape, from the weights file's header (no tensor read)."""
    try:
        with safe_open(str(folder / WEIGHTS), "pt") as f:
            return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise ReskipError(f"{folder / WEIGHTS} cannot be read ({e}): it may be cut short; train the healing run again") from None


def check_loaded(model, folder: Path) -> None:
    """Every LoRA tensor of the loaded model came from the file and the file holds no other: a loader's warning
    about missing or unexpected keys is this error."""
    expected, held = set(get_peft_model_state_dict(model)), set(adapter_shapes(folder))
    if expected != held:
        raise ReskipError(f"{folder / WEIGHTS} does not fit this healing run's model ({len(expected - held)} LoRA tensors "
                          f"missing, {len(held - expected)} unexpected): the adapter was trained on another pruning")
