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
Methods of `reskip eval` add three names:
    backbone             the backbone itself (side-channel off)
    retrofit             the retrofit without skipping (the same as `none`)
    matched              static, influence and random at each ReSkip point's mean skips
    budgets              reskip:budget=B for every budget of the policy file's frontier
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ReskipError

POLICY_KINDS = ("none", "reskip", "static", "influence", "sequence", "random")
METHOD_KINDS = ("backbone", "retrofit", "matched", "budgets", *POLICY_KINDS)
GRAMMAR = "none, reskip[:Q[:M]], reskip:budget=B[:held], static:K, influence:K, sequence:K, random:P"
METHOD_GRAMMAR = "backbone, retrofit, matched, budgets, " + GRAMMAR


class PolicyError(ReskipError):
    """A policy that cannot be made: a bad spec, or a policy file that cannot serve it."""


class SpecError(PolicyError):
    """A spec that does not follow the grammar."""


@dataclass(frozen=True)
class Spec:
    """A parsed spec. `text` is how it was written (a method's name in results.json)."""

    kind: str
    text: str
    quantile: float | None = None  # reskip
    max_skips: int | None = None  # reskip
    k: float | None = None  # static, influence (an int unless fractional); sequence (an int)
    p: float | None = None  # random
    budget: float | None = None  # reskip:budget=B
    held: bool = False  # reskip:budget=B:held
    path: str | None = None  # reskip read from this policy file

    @property
    def needs_policy_file(self) -> bool:
        return self.kind in ("reskip", "static", "influence", "sequence", "random")


def _number(text: str, cast, what: str, spec: str, lo: float, hi: float | None = None):
    try:
        value = cast(text)
    except ValueError:
        raise SpecError(f"cannot read {what} {text!r} in {spec!r}") from None
    if value != value or value in (float("inf"), float("-inf")) or value < lo or (hi is not None and value > hi):
        span = f"in [{lo}, {hi}]" if hi is not None else f">= {lo} and finite"
        raise SpecError(f"{what} in {spec!r} must be {span}, got {text}")
    return value


def parse_spec(text: str, kinds: tuple[str, ...] = POLICY_KINDS, allow_path: bool = False) -> Spec:
    """`text` -> Spec, accepting the given kinds (policies by default; METHOD_KINDS for `eval`)."""
    grammar = METHOD_GRAMMAR if "backbone" in kinds else GRAMMAR
    if allow_path and text.endswith(".json"):
        return Spec("reskip", text, path=text)
    kind, *args = text.split(":")
    if kind not in kinds:
        where = ", or a policy.json path" if allow_path else ""
        raise SpecError(f"unknown policy or method {text!r}; valid: {grammar}{where}")
    if kind in ("none", "backbone", "retrofit", "matched", "budgets"):
        if args:
            raise SpecError(f"{kind!r} takes no arguments, got {text!r}; valid: {grammar}")
        return Spec(kind, text)
    if kind == "reskip":
        if args and args[0].startswith("budget="):
            if len(args) > 2 or (len(args) == 2 and args[1] != "held"):
                raise SpecError(f"reskip:budget=B takes no further arguments but ':held', got {text!r}")
            b = _number(args[0][len("budget="):], float, "budget B", text, 0.0)
            return Spec(kind, text, budget=b, held=len(args) == 2)
        if len(args) > 2:
            raise SpecError(f"reskip takes at most reskip:Q:M, got {text!r}")
        q = _number(args[0], float, "quantile Q", text, 0.0, 1.0) if args and args[0] else None
        m = _number(args[1], int, "max skips M", text, 0) if len(args) > 1 else None
        return Spec(kind, text, quantile=q, max_skips=m)
    if len(args) != 1 or not args[0]:
        arg = "P" if kind == "random" else "K"
        raise SpecError(f"{kind} needs one argument, {kind}:{arg}; got {text!r}")
    if kind == "random":
        return Spec(kind, text, p=_number(args[0], float, "probability P", text, 0.0, 1.0))
    if kind == "sequence":
        return Spec(kind, text, k=_number(args[0], int, "block count K (a whole number)", text, 0))
    k = _number(args[0], float, "block count K", text, 0.0)
    return Spec(kind, text, k=int(k) if k == int(k) else k)


def parse_specs(texts: list[str], kinds: tuple[str, ...] = POLICY_KINDS) -> list[Spec]:
    return [parse_spec(t, kinds) for t in texts]
