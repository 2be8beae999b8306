"""The one grammar of policy and method specs, shared by `generate`, `eval`, `lm_eval` and
`benchmarks/speed.py`: text in, a typed `Spec` out (no torch, no files read).

    none                 nothing skipped (the retrofit as it is)
    reskip               the calibrated ReSkip rule at the policy file's quantile and max_skips
    reskip:Q             ... with tau_n read at quantile Q of w_recent(n)      (0 <= Q <= 1)
    reskip:Q:M           ... and at most M blocks skipped per step             (M >= 0)
    reskip:budget=B      the budgeted thresholds for B blocks skipped per step on average, one
                         point of the frontier that `reskip calibrate --budgets` stored
    reskip:budget=B:held the same point with its rate held online: each block's threshold is the
                         running quantile of its recent w_recent that skips the calibrated share of
                         steps, so the mean skips stay at B on any input (decode, another source)
    static:K             the K eligible blocks of lowest ablation cost A(n), at every step; a
                         fractional K (1.5) mixes k and k + 1 blocks across steps (the (k+1)-th
                         block at an evenly spread share K - k of the steps)
    influence:K          ShortGPT: the K blocks whose output is most like their input (K as static)
    sequence:K           per-sequence selection: a sequence's first step (its prompt) runs every block;
                         then the K eligible blocks whose w_recent sat highest against their own
                         calibrated distribution are skipped at every later step of that sequence
    random:P             each eligible block skipped with probability P        (0 <= P <= 1)
    PATH.json            `reskip` from that policy file (where a single policy is asked for)
Methods of `reskip eval` add these names:
    backbone             the backbone itself (side-channel off)
    retrofit             the retrofit without skipping (the same as `none`)
    matched              static, influence and random at each ReSkip point's mean skips
    budgets              reskip:budget=B for every budget of the policy file's frontier
and the trained methods, each scored as its own model beside the run's (the same backbone, data and references):
    lora:RUN             a LoRA healing run (`reskip experiment baselines`): the backbone with its trained LoRA
    healed:RUN           a healing run with layers removed: the backbone without them and its LoRA
    nested:K:RUN         a nested-depths healing run at depth K: its first K blocks removed and its one LoRA (K = 0: the
                         backbone itself)
    pruned:K             the backbone with its K middle blocks of lowest A(n) (measured on the backbone itself,
                         calibration split) removed, no healing
    export:DIR           a plain Hugging Face folder that `reskip export` or `reskip compress` wrote (its
                         reskip.json says which layers it removed)

Each kind says how it is opened for scoring (`opens`: a skip policy on the retrofit, a method that expands into
others, or a model of its own), which trainee makes it (`trains`: None for a policy) and whether the compute it
spends is measured rather than set (`measured_compute`: such a method is compared at the skips it measured).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import ReskipError


class PolicyError(ReskipError):
    """A policy that cannot be made: a bad spec, or a policy file that cannot serve it."""


class SpecError(PolicyError):
    """A spec that does not follow the grammar."""


def _number(text: str, cast, what: str, spec: str, lo: float, hi: float | None = None):
    try:
        value = cast(text)
    except ValueError:
        raise SpecError(f"cannot read {what} {text!r} in {spec!r}") from None
    if value != value or value in (float("inf"), float("-inf")) or value < lo or (hi is not None and value > hi):
        span = f"in [{lo}, {hi}]" if hi is not None else f">= {lo} and finite"
        raise SpecError(f"{what} in {spec!r} must be {span}, got {text}")
    return value


# Each kind's arguments (the text after its name, split at ':') -> the Spec fields they set.
def _no_arguments(kind: str, text: str, args: list[str]) -> dict:
    if args:
        raise SpecError(f"{kind!r} takes no arguments, got {text!r}; valid: {METHOD_GRAMMAR}")
    return {}


def _reskip(kind: str, text: str, args: list[str]) -> dict:
    if args and args[0].startswith("budget="):
        if len(args) > 2 or (len(args) == 2 and args[1] != "held"):
            raise SpecError(f"reskip:budget=B takes no further arguments but ':held', got {text!r}")
        return {"budget": _number(args[0][len("budget="):], float, "budget B", text, 0.0), "held": len(args) == 2}
    if len(args) > 2:
        raise SpecError(f"reskip takes at most reskip:Q:M, got {text!r}")
    return {"quantile": _number(args[0], float, "quantile Q", text, 0.0, 1.0) if args and args[0] else None,
            "max_skips": _number(args[1], int, "max skips M", text, 0) if len(args) > 1 else None}


def _one(kind: str, text: str, args: list[str], name: str) -> str:
    if len(args) != 1 or not args[0]:
        raise SpecError(f"{kind} needs one argument, {kind}:{name}; got {text!r}")
    return args[0]


def _block_count(kind: str, text: str, args: list[str]) -> dict:
    k = _number(_one(kind, text, args, "K"), float, "block count K", text, 0.0)
    return {"k": int(k) if k == int(k) else k}


def _whole_block_count(kind: str, text: str, args: list[str]) -> dict:
    return {"k": _number(_one(kind, text, args, "K"), int, "block count K (a whole number)", text, 0)}


def _probability(kind: str, text: str, args: list[str]) -> dict:
    return {"p": _number(_one(kind, text, args, "P"), float, "probability P", text, 0.0, 1.0)}


def _run_folder(kind: str, text: str, args: list[str]) -> dict:
    """The rest of the text is a folder (which may itself hold ':')."""
    return {"run": _one(kind, text, [":".join(args)] if args else [], "RUN")}


def _depth_and_run(kind: str, text: str, args: list[str]) -> dict:
    """K, then a folder (the rest of the text)."""
    if len(args) < 2 or not args[1]:
        raise SpecError(f"{kind} needs a depth and a folder, {kind}:K:RUN; got {text!r}")
    return {"k": _number(args[0], int, "depth K (a whole number)", text, 0), **_run_folder(kind, text, args[1:])}


@dataclass(frozen=True)
class Kind:
    """One kind of spec: how it is written, what it means, how its arguments are read, whether it is a skip
    policy (served by a policy file) or one of `reskip eval`'s methods only, how it opens for scoring, what
    trains it and whether its compute is measured."""

    syntax: str
    help: str
    arguments: Callable[[str, str, list[str]], dict]
    needs_policy_file: bool
    method_only: bool = False
    # "policy": a skip policy on the retrofit (`policy_file.BUILDERS`); "expands": a method that stands for
    # others (`evaluate.methods.EXPANSIONS`); "model": a model of its own, opened by `scorer`
    opens: str = "policy"
    trains: str | None = None  # the builder that makes it (`train.trainee`): "retrofit", "lora"; None: nothing trains it
    scorer: str | None = None  # opens="model": "module:function" that opens it for scoring (`evaluate.scorers`)
    # opens="model": "module:function" that checks what it names before any weights load (None: nothing to check)
    checker: str | None = None
    measured_compute: bool = False  # its skips follow the input: compared with others at what it measured


# The one table of kinds: the grammar, its help and the parsing derive from it (the policies they build:
# `policy_file.BUILDERS`, keyed by the same names).
KINDS = {
    "backbone": Kind("backbone", "the backbone itself (side-channel off)", _no_arguments, False, method_only=True,
                     opens="model"),
    "retrofit": Kind("retrofit", "the retrofit without skipping (the same as none)", _no_arguments, False,
                     method_only=True, trains="retrofit"),
    "matched": Kind("matched", "static, influence and random at each ReSkip point's mean skips", _no_arguments,
                    False, method_only=True, opens="expands"),
    "budgets": Kind("budgets", "reskip:budget=B for every budget of the policy file's frontier", _no_arguments,
                    False, method_only=True, opens="expands"),
    "lora": Kind("lora:RUN", "a LoRA healing run of `reskip experiment baselines`: the backbone with its LoRA",
                 _run_folder, False, method_only=True, opens="model", trains="lora",
                 scorer="reskip.evaluate.scorers:open_healing_run", checker="reskip.evaluate.scorers:check_healing_run"),
    "healed": Kind("healed:RUN", "a healing run with layers removed: the backbone without them and its LoRA",
                   _run_folder, False, method_only=True, opens="model", trains="lora",
                   scorer="reskip.evaluate.scorers:open_healing_run", checker="reskip.evaluate.scorers:check_healing_run"),
    "nested": Kind("nested:K:RUN", "a nested-depths healing run (`reskip experiment nested`) at depth K: its first K blocks "
                                   "removed, its one LoRA (K = 0: the backbone itself)", _depth_and_run, False,
                   method_only=True, opens="model", trains="lora", scorer="reskip.evaluate.scorers:open_healing_run",
                   checker="reskip.evaluate.scorers:check_healing_run"),
    "pruned": Kind("pruned:K", "the backbone's K middle blocks of lowest A(n) removed, no healing",
                   _whole_block_count, False, method_only=True, opens="model",
                   scorer="reskip.evaluate.scorers:open_pruned"),
    "export": Kind("export:DIR", "a plain Hugging Face folder written by `reskip export` or `reskip compress`",
                   _run_folder, False, method_only=True, opens="model", trains="lora",
                   scorer="reskip.evaluate.scorers:open_export", checker="reskip.evaluate.scorers:check_export"),
    "none": Kind("none", "nothing skipped (the retrofit as it is)", _no_arguments, False),
    "reskip": Kind("reskip[:Q[:M]], reskip:budget=B[:held]",
                   "the calibrated ReSkip rule (tau_n at quantile Q of w_recent(n), at most M blocks per step), or "
                   "the budgeted thresholds for B blocks per step on average (held: the rate held online)",
                   _reskip, True, measured_compute=True),
    "static": Kind("static:K", "the K eligible blocks of lowest ablation cost A(n), at every step (K may be "
                               "fractional)", _block_count, True),
    "influence": Kind("influence:K", "ShortGPT: the K blocks whose output is most like their input", _block_count,
                      True),
    "sequence": Kind("sequence:K", "per sequence: the K eligible blocks whose w_recent sat highest in its prompt, "
                                   "skipped at every later step", _whole_block_count, True, measured_compute=True),
    "random": Kind("random:P", "each eligible block skipped with probability P", _probability, True),
}
POLICY_KINDS = tuple(name for name, kind in KINDS.items() if not kind.method_only)
METHOD_KINDS = tuple(KINDS)
GRAMMAR = ", ".join(KINDS[name].syntax for name in POLICY_KINDS)
METHOD_GRAMMAR = ", ".join(KINDS[name].syntax for name in METHOD_KINDS)


def grammar_help(kinds: tuple[str, ...] = POLICY_KINDS) -> str:
    """One line per kind: how it is written and what it means (the CLI's and the documentation's help)."""
    return "\n".join(f"{KINDS[name].syntax:<40} {KINDS[name].help}" for name in kinds)


@dataclass(frozen=True)
class Spec:
    """A parsed spec. `text` is how it was written (a method's name in results.json)."""

    kind: str
    text: str
    quantile: float | None = None  # reskip
    max_skips: int | None = None  # reskip
    k: float | None = None  # static, influence (an int unless fractional); sequence, pruned, nested (an int)
    p: float | None = None  # random
    budget: float | None = None  # reskip:budget=B
    held: bool = False  # reskip:budget=B:held
    path: str | None = None  # reskip read from this policy file
    run: str | None = None  # lora, healed: the healing run's folder

    @property
    def needs_policy_file(self) -> bool:
        return KINDS[self.kind].needs_policy_file

    @property
    def arguments(self) -> dict:
        """The arguments it was written with (the fields its kind set), for a typed results row."""
        return {f: getattr(self, f) for f in ("quantile", "max_skips", "k", "p", "budget", "held", "path", "run")
                if getattr(self, f) not in (None, False)}


def parse_spec(text: str, kinds: tuple[str, ...] = POLICY_KINDS, allow_path: bool = False) -> Spec:
    """`text` -> Spec, accepting the given kinds (policies by default; METHOD_KINDS for `eval`)."""
    grammar = METHOD_GRAMMAR if "backbone" in kinds else GRAMMAR
    if allow_path and text.endswith(".json"):
        return Spec("reskip", text, path=text)
    name, *args = text.split(":")  # `_run_folder` joins a folder's own ':' back
    if name not in kinds:
        where = ", or a policy.json path" if allow_path else ""
        raise SpecError(f"unknown policy or method {text!r}; valid: {grammar}{where}")
    return Spec(name, text, **KINDS[name].arguments(name, text, args))


def parse_specs(texts: list[str], kinds: tuple[str, ...] = POLICY_KINDS) -> list[Spec]:
    return [parse_spec(t, kinds) for t in texts]
