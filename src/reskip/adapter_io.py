"""Adapter files: `adapter_config.json` + `adapter_model.safetensors`, the side-channel only.

The config records the retrofit settings and a fingerprint of the backbone
(family, layer count, hidden size, a hash of the architecture config and a digest
of the weights), so an adapter is never silently applied to another model.
Nothing is unpickled: tensors come from safetensors, metadata from JSON.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from . import __version__
from .config import RetrofitConfig
from .errors import AdapterError
from .io_atomic import atomic_write, atomic_write_text
from .model import ReskipModel

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
FORMAT_VERSION = 1

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


def weights_digest(model: nn.Module, n_values: int = 4096) -> str:
    """Digest of every backbone tensor's shape and first values, rounded to bfloat16.

    Rounding to bf16 makes the digest the same whether the backbone was loaded in
    float32 or bfloat16; parameter names are left out so wrapping does not change it.
    """
    digest = hashlib.sha256()
    for p in model.parameters():
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


def save_adapter(model: ReskipModel, path, metadata: dict | None = None) -> Path:
    """Write the side-channel and its config into folder `path` (created if needed)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.side_channel.state_dict().items()}
    config = {
        "format_version": FORMAT_VERSION,
        "reskip_version": __version__,
        "retrofit": model.config.to_dict(),
        "seed": model.seed,
        "rank": model.rank,
        "blocks": [[b.start, b.stop] for b in model.blocks],
        "curriculum": model.side_channel.curriculum,
        "backbone": fingerprint(model.base_model),
        "metadata": metadata or {},
    }
    atomic_write(path / WEIGHTS_NAME, lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
    atomic_write_text(path / CONFIG_NAME, json.dumps(config, indent=2))
    return path


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
        if cfg.get("format_version") != FORMAT_VERSION:
            raise AdapterError(f"{cfg_path} has format_version {cfg.get('format_version')!r}, expected {FORMAT_VERSION}")
        RetrofitConfig.from_dict(cfg["retrofit"])
        cfg["backbone"]["family"]
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


def load_adapter(base_model: nn.Module, path, strict_weights: bool = True) -> ReskipModel:
    """Retrofit `base_model` and load the saved side-channel into it."""
    path = Path(path)
    cfg = read_adapter_config(path)
    check_backbone(cfg["backbone"], base_model, strict_weights)
    try:
        state = load_file(path / WEIGHTS_NAME)
    except (SafetensorError, OSError, ValueError) as e:
        raise AdapterError(f"{path / WEIGHTS_NAME} is truncated or corrupt ({e}); re-save the adapter") from e
    model = ReskipModel(base_model, RetrofitConfig.from_dict(cfg["retrofit"]), seed=cfg.get("seed", 0))
    expected = model.side_channel.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    bad_shapes = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or unexpected or bad_shapes:
        model.unretrofit()
        raise AdapterError(
            f"{path / WEIGHTS_NAME} does not match its config (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}, wrong shape {bad_shapes[:3]})"
        )
    model.side_channel.load_state_dict(state)
    model.set_curriculum(cfg.get("curriculum", 1.0))
    return model
