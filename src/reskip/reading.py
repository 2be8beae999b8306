"""Reading the files a user or an earlier run hands over (run files, configs, policy files, data): UTF-8 text,
JSON, JSON lines, YAML. Every failure is one ReskipError naming the file, what is wrong and what to do, never a
decoder's traceback."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import ReskipError


def is_finite_number(x) -> bool:
    """A finite JSON number (not a boolean): what a run file's numeric fields must hold."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def read_text(path: Path) -> str:
    path = Path(path)
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ReskipError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}): save it as UTF-8") from None
    except OSError as e:
        raise ReskipError(f"cannot read {path} ({e.strerror or e})") from None


MAX_DEPTH = 64  # nesting levels any file reskip reads may hold (its own files hold fewer than ten)


def _too_deep(path: Path, where: str = "") -> ReskipError:
    return ReskipError(f"{path}{where} nests more than {MAX_DEPTH} levels deep: it is not a file reskip wrote; "
                       "restore or remove it")


def _depth_checked(value, path: Path, where: str = ""):
    """`value` if its containers nest at most MAX_DEPTH deep (checked without recursion), else one error."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > MAX_DEPTH:
                raise _too_deep(path, where)
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return value


def _loads(text: str, path: Path, where: str = ""):
    """json.loads, with a nesting so deep that the decoder recurses out refused in one line."""
    try:
        return _depth_checked(json.loads(text), path, where)
    except RecursionError:
        raise _too_deep(path, where) from None


def read_json(path: Path):
    """A JSON file; a truncated, corrupt or absurdly nested one is refused with the advice to rewrite it."""
    text = read_text(path)
    try:
        return _loads(text, path)
    except json.JSONDecodeError as e:
        raise ReskipError(f"{path} is not valid JSON ({e}): it may be truncated; rerun the command that wrote it") from None


def read_jsonl(path: Path) -> list:
    """One JSON value per non-empty line. A last line cut short (a process stopped while appending it) is left
    out; a bad line before it is refused, naming the line."""
    lines = [(n, line) for n, line in enumerate(read_text(path).splitlines(), 1) if line.strip()]
    out = []
    for k, (n, line) in enumerate(lines):
        try:
            out.append(_loads(line, path, f":{n}"))
        except json.JSONDecodeError as e:
            if k == len(lines) - 1:
                break
            raise ReskipError(f"{path}:{n} is not valid JSON ({e}): the file is corrupt") from None
    return out


def read_yaml(path: Path, load):
    """A YAML file through `load` (a str -> value reader), its error one line naming the file and the line."""
    text = read_text(path)
    try:
        return _depth_checked(load(text), path)
    except RecursionError:
        raise _too_deep(path) from None
    except Exception as e:  # yaml.YAMLError and its subclasses; yaml is not imported here (no dependency)
        if type(e).__module__.split(".")[0] != "yaml":
            raise
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ReskipError(f"{path} is not valid YAML{where} ({problem}): fix or remove it") from None
