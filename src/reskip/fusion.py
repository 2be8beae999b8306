"""`torch.compile` where it pays and works, the eager function where it does not.

A compiled function fuses a chain of elementwise ops and reductions into one loop over memory; on the
chunked losses' (N, V) float32 arrays that halves their time on a CPU (`benchmarks/train_throughput.py`
measures it). Compiling costs 10-20 s per input shape the first time (inductor keeps its kernels on disk
for later processes), so small inputs, whose arrays fit in cache, stay eager. Where compiling fails (no
C++ compiler, an unsupported platform) the eager function runs, after one warning; `RESKIP_COMPILE=0`
turns compiling off.
"""

from __future__ import annotations

import os
import warnings
from typing import Callable

import torch

MIN_ELEMENTS = 1 << 22  # per (N, V) array: below about 4M values compiling does not pay for itself
_compiled: dict[tuple[Callable, bool], Callable] = {}
_failed: set[Callable] = set()


def compile_enabled() -> bool:
    """False when `RESKIP_COMPILE=0` or this torch has no compiler backend."""
    return os.environ.get("RESKIP_COMPILE", "1") != "0" and hasattr(torch, "compile")


def fused(fn: Callable, elements: int, dynamic: bool = False) -> Callable:
    """`fn` compiled (once per process) when arrays of `elements` values make it pay and compiling works;
    otherwise `fn` itself. The compiled function computes the same values up to float rounding.
    dynamic: one compiled kernel for every input size (for callers whose sizes vary), instead of one per size."""
    if elements < MIN_ELEMENTS or fn in _failed or not compile_enabled():
        return fn
    key = (fn, dynamic)
    if key not in _compiled:
        _compiled[key] = _with_fallback(fn, torch.compile(fn, dynamic=dynamic))
    return _compiled[key]


def _with_fallback(fn: Callable, compiled: Callable) -> Callable:
    def call(*args):
        if fn in _failed:
            return fn(*args)
        try:
            return compiled(*args)
        except Exception as e:  # noqa: BLE001 - any failure of the compiler stack: run eager from now on
            if not _is_compile_error(e):
                raise
            _failed.add(fn)
            warnings.warn(f"torch.compile of {fn.__name__} failed ({type(e).__name__}); running it eagerly",
                          stacklevel=2)
            return fn(*args)
    return call


def _is_compile_error(e: Exception) -> bool:
    """An error of dynamo / inductor (or the C++ toolchain they call), not of the computation itself."""
    module = type(e).__module__ or ""
    return module.startswith(("torch._dynamo", "torch._inductor", "subprocess")) or isinstance(e, (OSError,))
