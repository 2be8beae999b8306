"""`reskip export RUN --out DIR`: a trained baseline (a LoRA, or LoRA-healed static pruning) as a plain Hugging
Face model folder. The library is imported inside the handler (`lazy:`), so `reskip --help` loads no torch."""

from __future__ import annotations

from pathlib import Path

from ..compress.export_options import ExportOptions
from ..errors import ReskipError
from .common import examples
from .options import add_option_flags, options_from_args


def cmd_export(args) -> int:
    from ..stages.export import export  # lazy: torch

    run = Path(args.run)
    if not (run / "config.yaml").is_file() or not (run / "adapter" / "adapter_config.json").is_file():
        raise ReskipError(f"{run} is not a finished baseline run (needs config.yaml and adapter/); train one with "
                          "`reskip experiment baselines`")
    out = export(run, options_from_args(ExportOptions, args))
    print(f"exported {run} to {out}: load it with AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0


def register(sub) -> None:
    p = sub.add_parser("export", help="write a trained baseline (LoRA, or LoRA-healed static pruning) as a plain "
                                      "Hugging Face model: pruned layers removed, LoRA merged, config updated",
                       **examples("export"))
    p.add_argument("run", help="a healing run's folder (compress's heal/, an arm of `reskip experiment baselines`) (config.yaml, adapter/)")
    add_option_flags(p, ExportOptions, config_file=False)
    p.set_defaults(func=cmd_export)
