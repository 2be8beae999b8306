"""The lab's variables: what a user may change, one at a time, about how a trained run skips.

The baseline is the run's own policy (its calibrated budget of one block per step when the policy file
has a frontier, else its quantile rule) at the policy's window, c(t) = 1 and the adapter's skip path. A
change names exactly one variable and its new value; a request that changes two is refused, because the
measured delta could not be attributed to either."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...errors import ReskipError
from ...skip.policies import ReSkip
from ...skip.policy_file import PolicyFile

VARIABLES = {
    "skip_block": "skip block n at every step (value 'always') or never (value 'never')",
    "tau": "the threshold tau_n of block n (a routing weight in [0, 1])",
    "window": "W, the tokens w_recent averages over (1 to 256)",
    "max_skips": "the most blocks skipped per step (0 to the number of blocks)",
    "budget": "a stored budget of the frontier (blocks skipped per step)",
    "curriculum": "c(t), the side-channel's gate (0: the backbone's own block inputs, 1: the trained retrofit)",
    "skip_path": "what replaces a skipped block: 'shortcut' (the learned one) or 'identity'",
}


class LabError(ReskipError):
    """A bad lab request: its message is shown in the page."""


@dataclass(frozen=True)
class Setting:
    """Everything that decides one lab run. policy: the ReSkip policy; budget: the frontier point it came
    from (None: the quantile rule or an edit of it)."""

    policy: ReSkip
    window: int
    curriculum: float = 1.0
    skip_path: str = "shortcut"
    budget: float | None = None

    def describe(self) -> dict:
        return {"policy": self.policy.describe(), "window": self.window, "curriculum": self.curriculum,
                "skip_path": self.skip_path, "budget": self.budget}


def baseline(policy_file: PolicyFile, has_shortcut: bool) -> Setting:
    path = "shortcut" if has_shortcut else "identity"
    window = policy_file.data["window"]
    if 1.0 in policy_file.budgets():
        return Setting(policy_file.budget(1.0), window, skip_path=path, budget=1.0)
    return Setting(policy_file.reskip(), window, skip_path=path)


CHANGE_KEYS = {"variable", "value", "block"}


def apply(base: Setting, change: dict, policy_file: PolicyFile, n_blocks: int, has_shortcut: bool) -> Setting:
    """The baseline with exactly one variable changed. change: {"variable": NAME, "value": V, "block": n}."""
    if not isinstance(change, dict):
        raise LabError("a change is an object: {variable, value, block}")
    extra = sorted(set(map(str, change)) - CHANGE_KEYS - set(VARIABLES))
    if extra:
        raise LabError(f"a change takes variable, value and block, not {', '.join(map(repr, extra))[:200]}")
    names = [k for k in change if k in VARIABLES]
    if names:  # the two-variables-at-once shape: {"tau": ..., "window": ...}
        raise LabError(f"changing {', '.join(names)} at once is refused: change one variable per run, or the "
                       "measured delta could not be attributed to either")
    variable, value = change.get("variable"), change.get("value")
    if isinstance(variable, list):
        if len(variable) != 1:
            raise LabError(f"changing {len(variable)} variables at once is refused: change one variable per run, or "
                           "the measured delta could not be attributed to either")
        variable = variable[0]
    if not isinstance(variable, str) or variable not in VARIABLES:
        raise LabError(f"unknown variable {variable!r}; one of: {', '.join(VARIABLES)}")
    p = base.policy
    if variable in ("skip_block", "tau"):
        n = _int(change.get("block"), "block", 2, n_blocks)
    if variable == "skip_block":
        if value == "always":
            policy = replace(p, eligible=p.eligible | {n}, always=p.always | {n},
                             max_skips=max(p.max_skips, len(p.always | {n})))
        elif value == "never":
            policy = replace(p, eligible=p.eligible - {n}, always=p.always - {n},
                             tau={k: v for k, v in p.tau.items() if k != n})
        else:
            raise LabError("skip_block takes 'always' or 'never'")
        return replace(base, policy=policy, budget=None)
    if variable == "tau":
        tau = _float(value, "tau", 0.0, 1.0)
        if n in p.always:
            raise LabError(f"block {n} is skipped at every step under this policy: it has no threshold (change "
                           "skip_block instead)")
        policy = replace(p, eligible=p.eligible | {n}, tau={**p.tau, n: tau},
                         max_skips=max(p.max_skips, 1))
        return replace(base, policy=policy, budget=None)
    if variable == "window":
        return replace(base, window=_int(value, "window", 1, 256))
    if variable == "max_skips":
        return replace(base, policy=replace(p, max_skips=_int(value, "max_skips", 0, n_blocks)), budget=None)
    if variable == "budget":
        b = _float(value, "budget", 0.0, float(n_blocks))
        try:
            return replace(base, policy=policy_file.budget(b), budget=b)
        except ReskipError as e:
            raise LabError(str(e)) from None
    if variable == "curriculum":
        return replace(base, curriculum=_float(value, "curriculum", 0.0, 1.0))
    if value not in ("shortcut", "identity"):
        raise LabError("skip_path takes 'shortcut' or 'identity'")
    if value == "shortcut" and not has_shortcut:
        raise LabError("this adapter has no learned shortcut: its skipped blocks are the identity already")
    return replace(base, skip_path=value)


def _int(v, name: str, lo: int, hi: int) -> int:
    """A JSON number that is whole: never true (not 1) nor the text "3" (a request is typed, not coerced)."""
    whole = isinstance(v, int) or (isinstance(v, float) and math.isfinite(v) and v.is_integer())
    if isinstance(v, bool) or not whole:
        raise LabError(f"{name} must be a whole number, got {v!r}")
    x = int(v)
    if not lo <= x <= hi:
        raise LabError(f"{name} must lie in [{lo}, {hi}], got {v!r}")
    return x


def _float(v, name: str, lo: float, hi: float) -> float:
    """A JSON number: never true, false or a text."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise LabError(f"{name} must be a number, got {v!r}")
    x = float(v)
    if not math.isfinite(x) or not lo <= x <= hi:
        raise LabError(f"{name} must lie in [{lo:g}, {hi:g}], got {v!r}")
    return x
