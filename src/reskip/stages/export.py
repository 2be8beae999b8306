"""`reskip export`: a healing run (`run`) as a plain Hugging Face folder (`reskip.compress.export`)."""

from __future__ import annotations

from pathlib import Path

from ..compress.export_options import ExportOptions


def export(run: Path, options: ExportOptions) -> Path:
    """Write the healing's merged model into `options.out`; returns the folder."""
    from ..compress.export import check_out, export_run  # lazy: torch

    check_out(Path(run), Path(options.out))
    return export_run(Path(run), Path(options.out), options.dtype, options.trust_remote_code, options.depth)
