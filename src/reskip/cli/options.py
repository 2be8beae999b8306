"""The one way from the command line to a stage's options object, for every command (as lm-eval's `from_cli`):
the flags are built from the options class's fields (each with its help text and its default), an optional
`--config` YAML file gives values by field name, flags given on the line override it, and `options_from_args`
turns the result into the typed object, checked against each field's declared choices and range.

A flag that was not given does not appear in the parsed arguments (argparse.SUPPRESS), so the options class's
own default applies, and a value from `--config` is not overwritten by a default."""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from pathlib import Path
from typing import Callable

from ..config_fields import check_fields, flag_of
from ..errors import ReskipError
from ..reading import read_yaml
from ..train_config import load_yaml

# The text of a value given as a string (a flag, or a YAML string) -> the field's object, where that is not the
# plain type: e.g. specs parsed with their grammar, or "none" for an empty list.
Converters = dict[str, Callable]


def _hints(cls) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _shape(hint) -> tuple[type, bool]:
    """(element type, is a list) of a field's type hint: `int | None` -> (int, False), `list[str]` -> (str, True)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (list, tuple):
        return (args[0] if args else str), True
    if args and typing.get_origin(hint) is not None:  # a union with None
        return _shape(args[0])
    return hint, False


def _shown(value) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(str(getattr(v, "text", v)) for v in value) or "none"
    return "none" if value is None else str(value)


def add_option_flags(p: argparse.ArgumentParser, cls, skip: tuple[str, ...] = (), converters: Converters = (),
                     config_file: bool = True) -> None:
    """One flag per field of `cls` (but `skip`), its help the field's own with the default appended; fields with a
    converter take their values as strings."""
    converters = dict(converters)
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        shown = "required" if f.metadata.get("required") else f"default: {_shown(default)}"
        text = f"{f.metadata.get('help', '')} ({shown})".replace("%", "%%")
        kind, many = _shape(hints[f.name])
        kwargs = {"dest": f.name, "default": argparse.SUPPRESS, "help": text}
        if kind is bool and f.name not in converters:
            p.add_argument(flag_of(f.name), action="store_true", **kwargs)
            continue
        if kind is bool:  # a converter reads its text: `--flag` alone is true, `--flag false` is false
            p.add_argument(flag_of(f.name), nargs="?", const="true", metavar="BOOL", **kwargs)
            continue
        if many:
            kwargs["nargs"] = "*"
        if f.name not in converters and kind in (int, float):
            kwargs["type"] = kind
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        if f.metadata.get("required"):
            kwargs["required"] = True
        p.add_argument(flag_of(f.name), metavar=f.name.upper(), **kwargs)
    if config_file:
        p.add_argument("--config", metavar="FILE",
                       help="a YAML file of these options by name (e.g. `sequences: 64`); flags override it (default: none)")


def options_from_args(cls, args: argparse.Namespace, converters: Converters = (), **fixed):
    """The options object of `cls` from a `--config` file (when given) and the flags given; `fixed` values (set by
    the command itself) win over both (a mapping is merged over the file's, key by key). Checked against the fields'
    choices and ranges before returning."""
    converters = dict(converters)
    values = {}
    if getattr(args, "config", None):
        values.update(_from_file(cls, Path(args.config), converters))
    values.update(given_values(cls, args, converters))
    # a mapping set by the command from its flags (an experiment's `overrides`) goes over the file's, key by key
    fixed = {k: {**values[k], **v} if isinstance(v, dict) and isinstance(values.get(k), dict) else v
             for k, v in fixed.items()}
    options = cls(**{**values, **fixed})
    check_fields(options)
    return options


def given_values(cls, args: argparse.Namespace, converters: Converters = ()) -> dict:
    """field name -> value of each flag of `cls` given on the command line (converted); the flags not given are
    absent (a class whose own reader validates a file, as TrainConfig, takes these as its overrides)."""
    converters = dict(converters)
    return {f.name: _converted(f.name, getattr(args, f.name), converters, flag_of(f.name))
            for f in dataclasses.fields(cls) if f.name in vars(args)}


def _converted(name: str, value, converters: Converters, where: str):
    """A value through its field's converter, which reads text as the flag gives it: a YAML number among the values
    (`methods: [1]`, `budgets: [0.5, 1]`) is read as the flag's text of it."""
    convert = converters.get(name)
    if convert is None:
        return value
    if isinstance(value, list):
        value = [v if isinstance(v, str) else str(v) for v in value]
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    try:
        return convert(value)
    except ReskipError as e:
        raise ReskipError(f"{where}: {e}") from None


def _from_file(cls, path: Path, converters: Converters) -> dict:
    if not path.is_file():
        raise ReskipError(f"--config {path}: no such file")
    data = read_yaml(path, load_yaml)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ReskipError(f"{path}: an options file is a YAML mapping of option names to values")
    hints = _hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    out = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in fields:
            raise ReskipError(f"{path}: unknown option {key!r}; valid: {', '.join(sorted(fields))}")
        where = f"{path}: {name}"
        out[name] = _converted(name, _typed(value, hints[name], where, name in converters), converters, where)
    return out


def _optional(hint) -> bool:
    return type(None) in typing.get_args(hint)


def _typed(value, hint, where: str, converted: bool = False):
    """A YAML value against the field's type, as its flag's conversion would take it: null only where the field
    may be null, and the text a converter reads (a spec, a budget) as scalars, never nested lists or mappings."""
    kind, many = _shape(hint)
    if value is None:
        if not _optional(hint):
            raise ReskipError(f"{where} cannot be null: give a value (or leave the key out for its default)")
        return None
    items = value if many and isinstance(value, list) else [value]
    if many and not isinstance(value, list):
        raise ReskipError(f"{where} takes a list (e.g. [a, b]), got {value!r}")
    for v in items:
        if converted and not isinstance(v, (str, int, float, bool)):
            raise ReskipError(f"{where} takes {'a list of ' if many else ''}plain values as its flag does, got {v!r}")
        ok = (isinstance(v, bool) if kind is bool else
              isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) if kind is float else
              isinstance(v, int) and not isinstance(v, bool) if kind is int else
              isinstance(v, str) if kind is str else True)
        if not ok:
            raise ReskipError(f"{where} takes {'a list of ' if many else ''}{getattr(kind, '__name__', kind)}"
                              f"{' values' if many else ''}, got {v!r}")
    return value
