"""What a timing is worth on a shared machine: the spread of repeated rounds (min / median / max) and the machine's
load while they ran. Two runs of one benchmark minutes apart on a loaded 2-core machine read 0.78x and 4.33x: a
figure timed while other processes held the cores is reported as unreadable, never as a speed-up."""

from __future__ import annotations

import os
import statistics

# more runnable processes on average than this many per core beyond the benchmark's own threads: not readable
SPARE_LOAD = 0.5


def spread(values: list[float]) -> dict:
    """min, median and max of repeated rounds."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "rounds": len(values)}


def load_average() -> float | None:
    """The 1-minute load average (None where the system has none)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def load_report(before: float | None, after: float | None, threads: int) -> dict:
    """The machine's load around a timing and whether the timing can be read: the load average beyond the
    benchmark's own `threads` stayed under `SPARE_LOAD` per core."""
    cores = os.cpu_count() or 1
    worst = max((x for x in (before, after) if x is not None), default=None)
    others = None if worst is None else max(0.0, worst - min(threads, cores))
    readable = others is None or others <= SPARE_LOAD * cores
    note = ("" if readable else f"the machine was loaded (load average {worst:.2f} on {cores} cores, {threads} of "
            "them this benchmark's): these timings measure the other processes as much as the model; rerun alone")
    return {"load_before": before, "load_after": after, "cores": cores, "threads": threads, "readable": readable,
            "note": note}
