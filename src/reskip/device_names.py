"""The devices' names every command takes (`--device`), torch-free: the CLI, the options classes and the training
config read them here; `backbones.devices` resolves them."""

from __future__ import annotations

import re

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:(0|[1-9][0-9]*))?")  # cuda:00 is not a name torch takes
DEVICE_HELP = "where the model computes: auto (CUDA when torch sees a GPU, else the CPU), cpu, cuda or cuda:N"
