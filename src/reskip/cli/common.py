"""What every command shares: the parser class (bad input -> one line, exit 2), the flags that
several commands take (declared here once), and the few conversions of strings into objects.

Nothing here imports torch: `reskip --help` and `reskip report` must stay light.
"""

from __future__ import annotations

import argparse

from ..errors import ReskipError
from ..ar_retrofit.config import VARIANTS, RetrofitConfig
from ..config_fields import help_of
from ..train_config import RECIPE_RETROFIT

DTYPES = ("auto", "float32", "bfloat16")  # `backbones.dtypes.DTYPE_NAMES`, without importing torch here
# `pipeline.PRESETS` by name, without importing torch here: quick (a smoke run), medium (screening), standard
# (the default recipe, 0.2M training tokens), long and large (the standard recipe at 4x and 10x the tokens)
PRESETS = ("quick", "medium", "standard", "long", "large")


class Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (the same shape as every other reskip error)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def model_flags(p: argparse.ArgumentParser, dtype: bool = False) -> None:
    p.add_argument("--model", default=None, help="HF id, local folder or .gguf; default: the run's, else the "
                                                 "bundled SmolLM2-135M-Instruct")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own Python code to run")
    if dtype:
        dtype_flag(p)


def dtype_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="the backbone's compute dtype: auto (default) is bfloat16 on CUDA and on CPUs with AMX or "
                        "AVX512-BF16, float32 elsewhere")


BUDGET_FLAGS = ("steps", "batch_size", "seq_len", "lr")  # a preset's training budget, overridable by flag


def budget_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)


def budget_values(args, names=BUDGET_FLAGS) -> dict:
    """The training values among `names` that flags set."""
    return {k: getattr(args, k) for k in names if getattr(args, k) is not None}


def retrofit_flags(p: argparse.ArgumentParser) -> None:
    """The retrofit's flags, each with RetrofitConfig's own help text."""
    def text(name: str) -> str:
        return help_of(RetrofitConfig, name).replace("%", "%%")

    p.add_argument("--block-size", type=int, default=None, help=text("block_size") + " (default 4)")
    p.add_argument("--boundaries", default=None, help=text("boundaries") + "; as 4,8,12 (overrides --block-size)")
    p.add_argument("--rank", type=int, default=None, help=text("rank"))
    p.add_argument("--skip-path", choices=("identity", "shortcut"), default=None,
                   help=text("skip_path") + " (default: shortcut when training)")
    p.add_argument("--shortcut-rank", type=int, default=None, help=text("shortcut_rank"))
    p.add_argument("--variant", choices=VARIANTS, default=None, help=text("variant"))
    p.add_argument("--inner-lora", type=int, default=None, help=text("inner_lora"))


def adapter_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--adapter", required=True, help="training run folder or adapter folder")


def parse_boundaries(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise ReskipError(f"--boundaries takes comma-separated layer indices, e.g. 4,8,12; got {text!r}") from None


def retrofit_values(args) -> dict:
    """The retrofit flags that were given, as RetrofitConfig keys."""
    values = {"block_size": args.block_size, "rank": args.rank, "boundaries": parse_boundaries(args.boundaries),
              "skip_path": args.skip_path, "shortcut_rank": args.shortcut_rank, "variant": args.variant,
              "inner_lora": args.inner_lora}
    return {k: v for k, v in values.items() if v is not None}


def retrofit_config(args) -> RetrofitConfig:
    # the training recipe's retrofit unless flags say otherwise, so parity and params describe what train builds
    return RetrofitConfig(**{**RECIPE_RETROFIT, **retrofit_values(args)})  # its checks raise RetrofitConfigError
