"""`reskip lab`'s options: one typed object, each field with its help, default and range (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config_fields import described
from ..device_names import DEVICE_HELP, DEVICE_PATTERN
from ..stage_options import DTYPE_HELP, DTYPE_NAMES


@dataclass
class LabOptions:
    port: int = described(7860, "the port on 127.0.0.1", low=1, high=65535)
    model: str | None = described(None, "the backbone (None: the run's)")
    dtype: str = described("auto", DTYPE_HELP, choices=DTYPE_NAMES)
    device: str = described("auto", DEVICE_HELP, pattern=DEVICE_PATTERN)
