"""`reskip compress --out DIR`: a user's model -> a smaller plain Hugging Face model healed toward the original,
with a report beside it. The library is imported inside the handler (`lazy:`), so `reskip --help` loads no torch."""

from __future__ import annotations

from ..compress.options import CompressOptions
from .common import examples
from .options import add_option_flags, options_from_args

CONVERTERS = {"data": lambda specs: list(specs) or ["default"],
              "heldout": lambda specs: [s for s in specs if s != "none"]}  # `--heldout none` (or nothing): no held-out text


def cmd_compress(args) -> int:
    from ..compress.run import REPORT_MD  # lazy: torch
    from ..stages.compress import compress  # lazy: torch

    o = options_from_args(CompressOptions, args, CONVERTERS)
    report = compress(None, o)
    print((report.parent / REPORT_MD).read_text())
    print(f"the compressed model: {report.parent / 'model'} (AutoModelForCausalLM.from_pretrained loads it); "
          f"its report: {report.parent / REPORT_MD}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("compress", help="a smaller plain Hugging Face model from yours: the cheapest blocks of layers "
                                        "removed, the rest healed by distillation from your model, exported, and "
                                        "measured beside it (its chat replies, raw-text fidelity, speed)",
                       **examples("compress"))
    add_option_flags(p, CompressOptions, converters=CONVERTERS)
    p.set_defaults(func=cmd_compress)
