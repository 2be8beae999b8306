"""`reskip compress`: the product (`reskip.compress.run`)."""

from __future__ import annotations

from pathlib import Path

from ..compress.options import CompressOptions


def compress(run: Path | None, options: CompressOptions) -> Path:
    """Compress (or resume) into `options.out` (`run` is unused: the options name the folder); report.json's path.
    Every check that needs no weights runs before any load."""
    from ..compress.run import compress as run_compress  # lazy: torch
    from ..compress.run import plan  # lazy: torch

    plan(options)
    return run_compress(options)
