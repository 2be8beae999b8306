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
