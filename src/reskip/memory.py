"""The process's peak resident memory, for the pipeline's per-stage record (no torch here)."""

from __future__ import annotations

import resource
import sys


def peak_rss_gib() -> float:
    """The high-water mark of this process's resident set so far, in GiB (it never falls: the stage
    after which it rose is the one that holds the peak)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20  # bytes on macOS, KiB on Linux
