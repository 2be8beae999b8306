"""Config dataclass fields that carry their own help text (as PEFT's config dataclasses do): the one place a
setting is described and bounded, read by the command line (its flags, their help and defaults), by the range
checks before any work, and by the documentation's tables."""

from __future__ import annotations

import dataclasses
import math

from .errors import ReskipError, check_range

SEED_MAX = 2**63 - 1  # torch.manual_seed's largest seed: a larger one overflows inside torch


def described(default=dataclasses.MISSING, help: str = "", default_factory=dataclasses.MISSING,
              choices: tuple | None = None, low: float | None = None, high: float | None = None,
              required: bool = False, pattern=None, above: float | None = None):
    """A dataclass field with its help text in `metadata["help"]`, and optionally the values it may take
    (`choices`), its inclusive range (`low`, `high`; None inside a range means "not set"; `above`: an exclusive lower
    bound), or that the command
    line must give it (`required`), or a compiled regular expression its text must match whole (`pattern`)."""
    metadata = {"help": help, "required": required}
    if above is not None:  # an exclusive lower bound (a learning rate > 0), beside an inclusive `high`
        metadata["above"] = above
    if pattern is not None:
        metadata["pattern"] = pattern
    if choices is not None:
        metadata["choices"] = tuple(choices)
    if low is not None or high is not None:
        metadata["range"] = (low, high)
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def help_of(cls, name: str) -> str:
    """The help text of field `name` of dataclass `cls` ('' when it has none)."""
    return next(f.metadata.get("help", "") for f in dataclasses.fields(cls) if f.name == name)


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_fields(options) -> None:
    """Every field of `options` against its declared choices and range: one error naming the flag."""
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if value is None:
            continue
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            raise ReskipError(f"{flag_of(f.name)} must be one of {', '.join(map(str, choices))}, got {value!r}")
        pattern = f.metadata.get("pattern")
        if pattern is not None and not (isinstance(value, str) and pattern.fullmatch(value)):
            raise ReskipError(f"{flag_of(f.name)} must match {pattern.pattern}, got {value!r}")
        bounds = f.metadata.get("range")
        if bounds is None:
            continue
        lo, hi = bounds
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ReskipError(f"{flag_of(f.name)} takes numbers, got {v!r}")
            check_range(f.name.replace("_", "-"), v, -math.inf if lo is None else lo, hi)


def _default(f: dataclasses.Field) -> str:
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if isinstance(value, (list, tuple)):  # parsed specs are shown as written
        value = type(value)(getattr(v, "text", v) for v in value)
    return "null" if value is None else repr(value)


def markdown_table(cls, skip: tuple[str, ...] = ()) -> str:
    """| key | default | meaning | for every field of `cls` but `skip` (the documentation's tables)."""
    rows = ["| key (YAML) / flag | default | meaning |", "| --- | --- | --- |"]
    for f in dataclasses.fields(cls):
        if f.name not in skip:
            text = f.metadata.get("help", "").replace("|", "\\|")
            rows.append(f"| `{f.name}` / `--{f.name.replace('_', '-')}` | `{_default(f)}` | {text} |")
    return "\n".join(rows)
