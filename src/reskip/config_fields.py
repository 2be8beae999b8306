"""Config dataclass fields that carry their own help text (as PEFT's config dataclasses do): the one place a
setting is described, read by the command line's `--help` and by the documentation's tables."""

from __future__ import annotations

import dataclasses


def described(default=dataclasses.MISSING, help: str = "", default_factory=dataclasses.MISSING):
    """A dataclass field with its help text in `metadata["help"]`."""
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


def help_of(cls, name: str) -> str:
    """The help text of field `name` of dataclass `cls` ('' when it has none)."""
    return next(f.metadata.get("help", "") for f in dataclasses.fields(cls) if f.name == name)


def _default(f: dataclasses.Field) -> str:
    if f.default_factory is not dataclasses.MISSING:
        return repr(f.default_factory())
    return "null" if f.default is None else repr(f.default)


def markdown_table(cls, skip: tuple[str, ...] = ()) -> str:
    """| key | default | meaning | for every field of `cls` but `skip` (the documentation's tables)."""
    rows = ["| key (YAML) / flag | default | meaning |", "| --- | --- | --- |"]
    for f in dataclasses.fields(cls):
        if f.name not in skip:
            text = f.metadata.get("help", "").replace("|", "\\|")
            rows.append(f"| `{f.name}` / `--{f.name.replace('_', '-')}` | `{_default(f)}` | {text} |")
    return "\n".join(rows)
