"""`reskip report`: the run's self-contained HTML page, from its files (`reskip.research.report.page`)."""

from __future__ import annotations

from pathlib import Path

from ..research.report.options import ReportOptions


def report(run: Path, options: ReportOptions) -> Path:
    """Write the run's report; report.html's path."""
    from ..research.report.page import report_run  # lazy: matplotlib

    return report_run(run, options)
