"""Training records to accelerate's experiment trackers (`report_to: tensorboard`): every scalar of a
train_log.jsonl record under its kind (`train/loss`, `val/ppl_full`, `val/entropy/3`, ...), at its step.
The JSONL log stays the source of truth; a tracker is a view of it where users look for one."""

from __future__ import annotations

import math

TRACKER_RUN = "tensorboard"  # accelerate writes the event files to RUN/tensorboard/


def scalars(record: dict) -> dict[str, float]:
    """The finite numbers of a log record, nested dicts flattened: {"entropy": {"3": 0.6}} -> "entropy/3"."""
    prefix = "val" if record["kind"] == "eval" else record["kind"]
    out = {}

    def walk(key: str, value) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{key}/{k}", v)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = float(value)

    for k, v in record.items():
        if k not in ("kind", "step"):
            walk(f"{prefix}/{k}", v)
    return out


def hyperparameters(config: dict) -> dict:
    """A TrainConfig's dict as the values a tracker stores (numbers, strings and booleans; the rest as text)."""
    return {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in config.items()}
