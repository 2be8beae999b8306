"""User-facing errors: each says what went wrong and what to do; the CLI prints them without a traceback."""


class ReskipError(Exception):
    """Base class for errors caused by input (a model, a file, a flag), not by a bug."""


class UnsupportedModelError(ReskipError):
    pass


class ModelNotFoundError(ReskipError):
    pass


class AdapterError(ReskipError):
    """An adapter folder that is missing, corrupt, or belongs to another backbone."""


class RetrofitConfigError(ReskipError, ValueError):
    """A retrofit configuration that cannot be built (a ValueError too, for library callers)."""


def check_range(flag: str, value, lo, hi=None) -> None:
    """Refuse an option outside [lo, hi] (or below lo when hi is None), or NaN, with one line naming
    the flag (`flag` without its dashes, e.g. "max-skips"). None means "not given" and passes; NaN and
    infinities never do (every option is a finite number)."""
    if value is None:
        return
    if value != value or value in (float("inf"), float("-inf")) or value < lo or (hi is not None and value > hi):
        span = f"[{lo}, {hi}]" if hi is not None else f">= {lo} and finite"
        raise ReskipError(f"--{flag} must be {span}, got {value}")
