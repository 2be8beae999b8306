"""`reskip lab`'s options: one typed object, each field with its help, default and range (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass

from ...config_fields import described
from ...options import BackboneOptions


@dataclass
class LabOptions(BackboneOptions):
    model: str | None = described(None, "the backbone (None: the run's)")
    port: int = described(7860, "the port on 127.0.0.1", low=1, high=65535)
