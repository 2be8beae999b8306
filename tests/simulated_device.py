"""A second device on a CPU-only machine, so that a missing `device=` fails in CI and not on a user's GPU.

`SimulatedDevice` is a `TorchFunctionMode` that keeps, by identity, the set of tensors that are "on the device":
the model's parameters and buffers (`put`), whatever an op computes from one of them, what a factory makes with a
`device=` argument, and what `.to(device)` / `.to(tensor)` / `.cuda()` returns. Everything else is on the host.
Every op is checked as CUDA checks it: a tensor on the device beside a host tensor with at least one dimension is a
`DeviceMismatch` (a host 0-dim scalar is allowed, as CUDA allows it; indexing a device tensor with host indices is
allowed, as CUDA allows it; `copy_` crosses devices). Reading a device tensor's values on the host (`item`,
`tolist`, `bool`, `float`, `numpy`, `cpu`, ...) is a host synchronisation on a GPU: each is counted in `syncs`,
with the line of the package that asked for it.

The values are the CPU's own, so every path runs as it does for real, decisions included; only the bookkeeping is
simulated. The text "cpu" (`.to("cpu")`) means the host, a `torch.device` the device (the model's device on a
CPU-only machine is `torch.device("cpu")`). What it cannot see: a `device="cpu"` keyword written out (taken for
the device), a `torch.device("cpu")` written out (likewise), and tensors made inside
C++ (their creators are not Python calls) -- none of which the package does on its hot paths."""

from __future__ import annotations

import traceback
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from reskip.ar_retrofit.side_channel import DerivedCache

# Reading values on the host: on a GPU each waits for the device.
SYNCS = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "__format__", "__repr__",
         "__str__"}
CROSSING = {"copy_", "to", "cuda", "new_tensor", "set_", "_has_compatible_shallow_copy_type",
            "__set__"}  # may see both sides (a parameter's .data set while a module is built)
INDEXING = {"__getitem__", "__setitem__", "index_select", "gather", "scatter", "scatter_", "index_put_"}


class DeviceMismatch(AssertionError):
    pass


def _package_frame() -> str:
    """The innermost stack line in reskip's own code (where a sync or a mismatch was asked for)."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        if "/reskip/" in frame.filename and "/tests/" not in frame.filename:
            return f"{frame.filename.split('/reskip/', 1)[1]}:{frame.lineno} {frame.name}"
    return "outside the package"


class SimulatedDevice(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.on = WeakIdKeyDictionary()
        self.syncs: Counter = Counter()  # "file:line function" -> host reads of device values there
        self.counting = True

    def put(self, *things) -> "SimulatedDevice":
        """Mark modules' parameters and buffers, and tensors, as on the device. What a module derived from its
        parameters before (`DerivedCache`, kept between passes) is forgotten: on a real device it would have
        been derived there."""
        for thing in things:
            if isinstance(thing, torch.nn.Module):
                for t in list(thing.parameters()) + list(thing.buffers()):
                    self.on[t] = True
                for m in thing.modules():
                    for value in vars(m).values():
                        if isinstance(value, DerivedCache):
                            value.key = None
            elif isinstance(thing, torch.Tensor):
                self.on[thing] = True
        return self

    def is_on(self, t) -> bool:
        return isinstance(t, torch.Tensor) and t in self.on

    def total_syncs(self) -> int:
        return sum(self.syncs.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        on = [t for t in tensors if t in self.on]
        if name in ("numpy", "__array__") and args and self.is_on(args[0]):  # CUDA refuses: .cpu() first
            raise DeviceMismatch(f"{name} of a device tensor at {_package_frame()}: copy it to the host first")
        if name in SYNCS or (name == "to" and "cpu" in list(args[1:]) + [kwargs.get("device")]):
            if args and self.is_on(args[0]) and self.counting:
                self.syncs[_package_frame()] += 1
            out = func(*args, **kwargs)
            # on the CPU, .cpu() of a CPU tensor is that tensor: a copy stands for the host's own
            return out.clone() if isinstance(out, torch.Tensor) and out is args[0] else out
        if on and name not in CROSSING:
            self._check(name, args, tensors)
        out = func(*args, **kwargs)
        if on or self._placed(name, args, kwargs):
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.on[t] = True
        return out

    def _check(self, name: str, args, tensors) -> None:
        if name in INDEXING:  # host indices into a device tensor are fine; device indices into a host one are not
            if args and not self.is_on(args[0]):
                raise DeviceMismatch(f"{name}: a host tensor indexed by a device tensor at {_package_frame()}")
            tensors = [t for t in tensors[1:] if t.dtype.is_floating_point]  # values written, not indices
        # a host 0-dim scalar may meet a device tensor in arithmetic, as on CUDA; never in a cat or stack
        scalar_ok = name not in ("cat", "stack", "concat", "concatenate", "hstack", "vstack")
        host = [t for t in tensors if t not in self.on and (t.dim() > 0 or not scalar_ok)]
        if host:
            raise DeviceMismatch(f"{name}: host tensor(s) of shape {[tuple(t.shape) for t in host]} beside the "
                                 f"device's at {_package_frame()}")

    def _placed(self, name: str, args, kwargs) -> bool:
        """Whether an op with no device tensor among its inputs puts its result on the device."""
        if kwargs.get("device") is not None:
            return True
        if name == "cuda":
            return True
        if name == "to":  # .to(device), .to("cuda"), .to(other_tensor): placed; .to(dtype): where it was
            moves = [a for a in list(args[1:]) + [kwargs.get("other")] if isinstance(a, torch.device)
                     or (isinstance(a, str) and a != "cpu")
                     or (isinstance(a, torch.Tensor) and a in self.on)]
            return bool(moves)
        return False
