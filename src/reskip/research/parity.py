"""The pipeline's first stage: step-zero parity in float32 and bfloat16 and parameter accounting
on the named backbone -> RUN/parity.json."""

from __future__ import annotations

from pathlib import Path

import torch

from ..ar_retrofit.accounting import count_params
from ..ar_retrofit.blocks import retrofit_blocks
from ..ar_retrofit.config import RetrofitConfig, check_rank
from ..ar_retrofit.parity import check_parity, tokenize_batch
from ..backbones.devices import device_name, resolve_device
from ..backbones.dtypes import resolve_dtype
from ..backbones.loading import DEFAULT_BACKBONE, load_backbone, load_config
from ..io_atomic import atomic_write_json
from ..options import ParityOptions
from ..run_folder import RunFolder

PARITY_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def check_against_config(model_name: str | None, config: RetrofitConfig, trust_remote_code: bool = False) -> None:
    """The retrofit's blocks and ranks against the backbone's own config (no weights): a boundary past the
    last layer or a rank above the hidden size is refused here."""
    model_config = load_config(model_name, trust_remote_code)
    retrofit_blocks(model_config.num_hidden_layers, config.block_size, config.boundaries)
    check_rank(config, model_config.hidden_size)


def parity_of(model_name: str | None, dtype_name: str, config: RetrofitConfig, trust_remote_code: bool = False,
              device: str = "auto"):
    """Step-zero parity of the named backbone in one dtype ('auto' resolved as `dtypes.resolve_dtype` for the
    device) on `device`: (check_parity's dict with the device's name, the loaded backbone)."""
    check_against_config(model_name, config, trust_remote_code)  # before any weights load
    device = resolve_device(device)
    model, tokenizer = load_backbone(model_name, resolve_dtype(dtype_name, device), trust_remote_code, device)
    result = check_parity(model, tokenize_batch(tokenizer, device=device), config)
    return {**result, "device": device_name(device)}, model


def parity_run(run_dir, options: ParityOptions = ParityOptions()) -> Path:
    """Parity in each dtype and the parameter report; writes RUN/parity.json and returns its path.

    Exact parity is `all(r["equal"] for r in parity["parity"])`; the caller decides what a failure means."""
    model_name, config, trust_remote_code = options.model, options.retrofit, options.trust_remote_code
    name = model_name or DEFAULT_BACKBONE
    check_against_config(model_name, config, trust_remote_code)
    result = {"model": name, "parity": []}
    for dtype_name in PARITY_DTYPES:
        print(f"[parity] {name} {dtype_name} ...", flush=True)
        r, model = parity_of(model_name, dtype_name, config, trust_remote_code, options.device)
        result["parity"].append({"dtype": dtype_name, **r})
        print(f"[parity] {dtype_name}: max |diff| = {r['max_abs_diff']} ({'exact' if r['equal'] else 'NOT exact'})")
    result["params"] = count_params(model.config, config, name).to_dict()
    p = result["params"]
    print(f"[params] {p['new_params']:,} new / {p['backbone_params']:,} backbone = {p['percent']:.3f}% (rank {p['rank']})")
    path = RunFolder(Path(run_dir)).parity
    atomic_write_json(path, result)
    return path
