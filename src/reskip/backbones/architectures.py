"""Backbone configs without weights: shipped architecture configs (hyperparameters only, see
`reskip/backbones/archs/*.json`) make well-known names work offline; a config.json or a model folder works too."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from types import SimpleNamespace

from transformers import AutoConfig

from .. import compat
from ..errors import ModelNotFoundError

ARCHS = "reskip.backbones"  # the package whose archs/ folder holds the shipped configs


def shipped_architectures() -> dict[str, str]:
    """lower-case name -> shipped file name (without .json)."""
    folder = resources.files(ARCHS) / "archs"
    return {p.name[:-5].lower(): p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json")}


def architecture_config(name_or_path: str):
    """A transformers config from a shipped name, a config.json, or a model folder (no weights)."""
    shipped = shipped_architectures()
    path = Path(name_or_path).expanduser()
    if name_or_path.lower() in shipped:
        text = (resources.files(ARCHS) / "archs" / f"{shipped[name_or_path.lower()]}.json").read_text()
    elif path.is_file():
        text = _read_text(path)
    elif (path / "config.json").is_file():
        text = _read_text(path / "config.json")
    else:
        raise ModelNotFoundError(
            f"unknown backbone {name_or_path!r}: give a config.json, a model folder, or one of "
            f"{sorted(shipped.values())}"
        )
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelNotFoundError(f"{name_or_path} is not a JSON model config ({e.msg} at line {e.lineno}); "
                                 f"give a config.json, a model folder, or one of {sorted(shipped.values())}") from e
    if not isinstance(data, dict):
        raise ModelNotFoundError(f"{name_or_path}: a model config is a JSON object, got {type(data).__name__}")
    model_type = data.pop("model_type", None)
    if model_type is None:
        raise ModelNotFoundError(f"{name_or_path}: the config has no model_type")
    if not isinstance(model_type, str):
        raise ModelNotFoundError(f"{name_or_path}: model_type must be a name, got {model_type!r}")
    compat.check_supported(SimpleNamespace(model_type=model_type))  # before transformers reads the rest
    check_sizes(data, name_or_path)
    try:
        return AutoConfig.for_model(model_type, **data)
    except (TypeError, ValueError) as e:
        raise ModelNotFoundError(f"{name_or_path}: transformers cannot build a {model_type} config from it ({e})") from e


# what the parameter arithmetic reads, and the largest value any model of these families has by far
SIZES = {"hidden_size": 2**17, "num_hidden_layers": 4096, "num_attention_heads": 4096, "num_key_value_heads": 4096,
         "intermediate_size": 2**20, "vocab_size": 2**24, "head_dim": 2**14}
REQUIRED_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


def check_sizes(data: dict, name: str) -> None:
    """The sizes a parameter count needs: whole numbers from 1 to far beyond any real model (a config someone wrote
    by hand with 0 heads, a string or a billion layers is one error, never a traceback or minutes of counting)."""
    for key, limit in SIZES.items():
        value = data.get(key)
        if value is None and key not in REQUIRED_SIZES:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
            raise ModelNotFoundError(f"{name}: {key} must be a whole number from 1 to {limit:,}, got {value!r}")
    if data.get("head_dim") is None and data["hidden_size"] % data["num_attention_heads"]:
        raise ModelNotFoundError(f"{name}: hidden_size {data['hidden_size']} is not a multiple of num_attention_heads "
                                 f"{data['num_attention_heads']}")


def check_model_folder(folder: Path) -> None:
    """A model folder's config.json and weight files, checked before transformers reads them (which answers a
    hand-edited or cut file with a long traceback, or minutes of work): the config a JSON object of a supported
    `model_type` with sane sizes, and every safetensors file's header whole (a truncated file is refused here)."""
    from safetensors import SafetensorError, safe_open  # lazy: only for local folders

    path = folder / "config.json"
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise ModelNotFoundError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}): restore the model's "
                                 "config") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise ModelNotFoundError(f"{path}: a model config is a JSON object with a model_type name")
    compat.check_supported(SimpleNamespace(model_type=data["model_type"]))
    for key in ("text_config",):  # a multimodal family keeps the decoder's sizes in a sub-config
        if isinstance(data.get(key), dict):
            data = {**data[key], "model_type": data["model_type"]}
    check_sizes(data, str(path))
    for weights in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(weights, "pt") as f:
                f.keys()
        except (SafetensorError, OSError) as e:
            raise ModelNotFoundError(f"{weights} cannot be read ({str(e).splitlines()[0][:200]}): the file is cut "
                                     "short or corrupt; copy the model again") from None


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ModelNotFoundError(f"cannot read {path} as a model config ({e})") from e


def model_parameters(config) -> int:
    """A model's parameters from its config alone, built on the meta device (tied weights counted once)."""
    import torch  # lazy: the shipped configs are read by `reskip params` and `--help` paths without torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())
