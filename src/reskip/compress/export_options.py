"""`reskip export`'s options: one typed object, each field with its help, default and range (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config_fields import described


@dataclass
class ExportOptions:
    out: str | None = described(None, "the folder to write: new, empty, or an earlier export (replaced whole); any "
                                      "other folder is refused untouched", required=True)
    dtype: str = described("auto", "the exported weights' dtype: auto is the dtype the original is published in "
                                   "(bfloat16 for the packaged backbones, the config's for a folder); the LoRA is "
                                   "merged in float32 first", choices=("auto", "float32", "bfloat16"))
    trust_remote_code: bool = described(False, "allow the backbone's own Python code to run (never taken from the "
                                               "healing's config.yaml)")
    depth: int | None = described(None, "a nested-depths healing run: the depth to write (its first K blocks removed; 0: the "
                                        "backbone itself); any other healing run serves its one depth", low=0)
