"""Adapter files: `adapter_config.json` + `adapter_model.safetensors`, the side-channel (and the LoRA inside the
blocks, when the retrofit carries one).

The config records the retrofit settings and a fingerprint of the backbone
(family, layer count, hidden size, a hash of the architecture config and a digest
of the weights), so an adapter is never silently applied to another model.
Nothing is unpickled: tensors come from safetensors, metadata from JSON.

This module writes and reads the files; building a model from them is `model.load_adapter`.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import AdapterError
from ..io_atomic import atomic_folder
from ..reading import is_finite_number
from ..version import __version__
from . import inner_lora
from .blocks import inclusive_ranges
from .config import ADAPTER_CONFIG_NAME as CONFIG_NAME
from .config import ADAPTER_WEIGHTS_NAME as WEIGHTS_NAME
from .config import RetrofitConfig
from .model_card import write_card

# 3: the correction A_n's tensors named `correction` (and a shortcut's `low_rank`), no longer `adapter`.
# 2: "blocks" as inclusive [first, last] layer pairs, like every other file reskip writes.
# 1: "blocks" as [start, stop) pairs; still read (the weights and every other field are the same).
FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)

# Tensor names an older reskip saved -> today's, as PEFT maps renamed keys on load: (module group, the
# submodule's old name, today's name).
RENAMED_TENSORS = (("per_block", "adapter", "correction"), ("shortcuts", "adapter", "low_rank"))


def _renamed(name: str, before: bool) -> str:
    for group, old, new in RENAMED_TENSORS:
        src, dst = (new, old) if before else (old, new)
        name = re.sub(rf"^{group}\.(\d+)\.{src}\.", rf"{group}.\1.{dst}.", name)
    return name


def current_names(state: dict) -> dict:
    """A saved state under today's tensor names (an older adapter's or checkpoint's names mapped)."""
    return {_renamed(name, before=False): tensor for name, tensor in state.items()}


def names_before_rename(name: str) -> str:
    """Today's tensor name as adapters saved before FORMAT_VERSION 3 wrote it (the digests of older policy files)."""
    return _renamed(name, before=True)


# Hyperparameters that define the architecture; loader-specific keys (dtype, paths,
# quantization, versions) are left out so a GGUF load and its cached copy hash alike.
ARCH_KEYS = (
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
    "rope_parameters", "rope_theta", "rope_scaling", "tie_word_embeddings", "sliding_window",
    "layer_types", "attention_bias", "mlp_bias", "query_pre_attn_scalar", "final_logit_softcapping",
    "attn_logit_softcapping", "max_position_embeddings",
)


def config_hash(config) -> str:
    d = config.to_dict()
    arch = {k: d[k] for k in ARCH_KEYS if k in d}
    return hashlib.sha256(json.dumps(arch, sort_keys=True, default=str).encode()).hexdigest()[:16]


WHOLE_WEIGHTS_DIGEST = "_reskip_whole_weights_digest"  # the attribute a sharded backbone keeps its digest in


def weights_digest(model: nn.Module, n_values: int = 4096) -> str:
    """Digest of every backbone tensor's shape and first values, rounded to bfloat16.

    Rounding to bf16 makes the digest the same whether the backbone was loaded in
    float32 or bfloat16; parameter names are left out so wrapping does not change it, and so are the
    parameters of a LoRA the retrofit put inside the blocks (they are the adapter's, not the backbone's).
    A sharded backbone (`train.sharding`) holds the digest of its whole weights, taken before they were sharded:
    each process holds only a part of them after.
    """
    kept = getattr(model, WHOLE_WEIGHTS_DIGEST, None)
    if kept is not None:
        return kept
    digest = hashlib.sha256()
    added = {id(p) for p in inner_lora.parameters(model)}
    for p in model.parameters():
        if id(p) in added:
            continue
        digest.update(str(tuple(p.shape)).encode())
        head = p.detach().reshape(-1)[:n_values].to("cpu", torch.bfloat16)
        digest.update(head.view(torch.int16).numpy().tobytes())
    return digest.hexdigest()[:16]


def fingerprint(base_model: nn.Module) -> dict:
    cfg = base_model.config
    return {
        "family": cfg.model_type,
        "num_layers": cfg.num_hidden_layers,
        "hidden_size": cfg.hidden_size,
        "config_hash": config_hash(cfg),
        "weights_digest": weights_digest(base_model),
    }


def save_adapter(model, path, metadata: dict | None = None) -> Path:
    """Write the side-channel of `model` (a ReskipModel) and its config into folder `path` (created if needed)."""
    path = Path(path)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.adapter_state().items()}
    config = {
        "format_version": FORMAT_VERSION,
        "reskip_version": __version__,
        "retrofit": model.config.to_dict(),
        "seed": model.seed,
        "rank": model.rank,
        "blocks": inclusive_ranges(model.blocks),
        "curriculum": model.side_channel.curriculum,
        "backbone": fingerprint(model.base_model),
        "metadata": metadata or {},
    }
    bad = sorted(k for k, v in state.items() if not torch.isfinite(v).all())
    if bad:
        raise AdapterError(f"not saving an adapter whose weights are not finite ({', '.join(bad[:3])}); the run "
                           "diverged: resume from an earlier checkpoint with a lower --lr")

    def write(folder: Path) -> None:  # the weights, the config and the card appear together or not at all
        save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
        (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2))
        write_card(folder, config, sum(v.numel() for v in state.values()))

    return atomic_folder(path, write)


def read_adapter_config(path) -> dict:
    path = Path(path)
    cfg_path = path / CONFIG_NAME
    if not cfg_path.is_file() or not (path / WEIGHTS_NAME).is_file():
        raise AdapterError(
            f"{path} is not an adapter folder: it needs {CONFIG_NAME} and {WEIGHTS_NAME} "
            "(written by `reskip train` or ReskipModel.save_adapter)"
        )
    try:
        cfg = json.loads(cfg_path.read_text())
        if not isinstance(cfg, dict):
            raise TypeError(f"its top level is a {type(cfg).__name__}, not an object")
        version = cfg.get("format_version")
        if version not in READABLE_VERSIONS:
            raise AdapterError(f"{cfg_path} has format_version {version!r}; this reskip reads {list(READABLE_VERSIONS)}")
        if not isinstance(cfg["retrofit"], dict) or not isinstance(cfg["backbone"], dict):
            raise TypeError("retrofit and backbone must be objects")
        RetrofitConfig.from_dict(cfg["retrofit"])
        cfg["backbone"]["family"]
        seed, c = cfg.get("seed", 0), cfg.get("curriculum", 1.0)
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
            raise ValueError(f"seed {str(seed)[:40]!r} is not a whole number in [0, 2^63)")
        if not is_finite_number(c) or not 0.0 <= c <= 1.0:
            raise ValueError(f"curriculum {str(c)[:40]!r} is not a number in [0, 1]")
        if version == 1 and "blocks" in cfg:  # [start, stop) -> [first, last]
            cfg["blocks"] = [[start, stop - 1] for start, stop in cfg["blocks"]]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise AdapterError(f"{cfg_path} is corrupt or incomplete ({e}); re-save the adapter") from e
    return cfg


def check_backbone(saved: dict, base_model: nn.Module, strict_weights: bool = True) -> None:
    """Refuse a backbone that differs from the one the adapter was trained on."""
    actual = fingerprint(base_model)
    keys = ["family", "num_layers", "hidden_size", "config_hash"] + (["weights_digest"] if strict_weights else [])
    diffs = [f"{k}: adapter {saved.get(k)!r} vs model {actual[k]!r}" for k in keys if saved.get(k) != actual[k]]
    if diffs:
        hint = (
            " Only the weights differ: pass strict_weights=False (--allow-other-weights) to load anyway."
            if all(d.startswith("weights_digest") for d in diffs)
            else " Load the backbone this adapter was trained on."
        )
        raise AdapterError("adapter belongs to another backbone (" + "; ".join(diffs) + ")." + hint)


def read_adapter_weights(path) -> dict[str, torch.Tensor]:
    """The side-channel tensors of adapter folder `path` (safetensors: nothing is unpickled)."""
    path = Path(path)
    try:
        state = load_file(path / WEIGHTS_NAME)
    except (SafetensorError, OSError, ValueError) as e:
        raise AdapterError(f"{path / WEIGHTS_NAME} is truncated or corrupt ({e}); re-save the adapter") from e
    state = current_names(state)
    bad = sorted(k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all())
    if bad:
        raise AdapterError(f"{path / WEIGHTS_NAME} holds weights that are not finite ({', '.join(bad[:3])}): the run "
                           "that wrote it diverged; retrain or resume from an earlier checkpoint")
    return state
