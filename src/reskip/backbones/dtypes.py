"""The compute dtype: `auto` is bfloat16 where the hardware has fast bfloat16 matrix units, float32 elsewhere.

Fast bfloat16 means a CUDA device that supports it, or a CPU whose PyTorch reports AMX (`amx_bf16`) or
AVX512-BF16: on such a CPU a bfloat16 matrix product runs 6-14x faster than a float32 one, and the
backbone's forward about 4x faster. Without those units bfloat16 is emulated and slower than float32,
so `auto` keeps float32 there. Side-channel parameters, optimizer states, loss terms and metrics stay
float32 whatever the backbone's dtype.
"""

from __future__ import annotations

import torch

from ..errors import ReskipError
from ..options import DTYPE_NAMES

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def cpu_has_fast_bfloat16() -> bool:
    """True when this CPU has AMX or AVX512-BF16, as PyTorch's own CPU feature detection reports."""
    caps = getattr(torch.cpu, "get_capabilities", None)
    if caps is not None:
        found = caps()
        return bool(found.get("amx_bf16") or found.get("avx512_bf16"))
    tile = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    avx = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    return bool(tile() or avx())


def fast_bfloat16(device: str | torch.device | None = None) -> bool:
    """Whether `device` (default: CUDA when present, else the CPU) computes bfloat16 faster than float32."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_has_fast_bfloat16()


def resolve_dtype_name(name: str | torch.dtype, device: str | torch.device | None = None) -> str:
    """'auto' -> 'bfloat16' or 'float32' for `device` (see `fast_bfloat16`); a dtype name or torch dtype as itself."""
    if isinstance(name, torch.dtype):
        for key, value in _DTYPES.items():
            if value == name:
                return key
        raise ReskipError(f"dtype must be float32 or bfloat16, got {name}")
    if name not in DTYPE_NAMES:
        raise ReskipError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {name!r}")
    if name == "auto":
        return "bfloat16" if fast_bfloat16(device) else "float32"
    return name


def resolve_dtype(name: str | torch.dtype, device: str | torch.device | None = None) -> torch.dtype:
    """The torch dtype `name` stands for on `device` ('auto' resolved)."""
    return _DTYPES[resolve_dtype_name(name, device)]


def describe(name: str | torch.dtype, device: str | torch.device | None = None) -> str:
    """One line for the logs: what was asked and what it resolved to, e.g. 'auto -> bfloat16'."""
    resolved = resolve_dtype_name(name, device)
    asked = name if isinstance(name, str) else resolved
    return resolved if asked == resolved else f"{asked} -> {resolved}"
