"""`policy.json`: a calibrated skip policy, readable by a person, tied to its backbone and adapter.

Per block: ablation cost A(n), routing importance I(n), ShortGPT cosine similarity between
block input and output, the threshold tau_n with the quantile it came from and the
w_recent quantile grid it was read off (so other operating points need no recalibration),
and eligibility. Plus delta, window, max_skips, the calibration data's fingerprint and
token count, and the fingerprints of the backbone and the adapter.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..ar_retrofit.adapter_io import fingerprint, names_before_rename
from ..ar_retrofit.model import ReskipModel
from ..errors import ReskipError
from ..io_atomic import atomic_write_json
from ..reading import is_finite_number, read_json
from ..run_folder.versions import upgraded, version_of
from .policies import HeldReSkip, NoSkip, RandomSkip, ReSkip, SequenceSkip, SkipPolicy, StaticSkip
from .spec import GRAMMAR, PolicyError, Spec

FORMAT_VERSION = version_of("policy.json")


def side_channel_digest(model: ReskipModel, legacy_names: bool = False) -> str:
    """A short hash of the adapter's tensors and their names (`legacy_names`: the names adapters had before
    `adapter_io.FORMAT_VERSION` 3, which the digests of older policy files were taken over)."""
    digest = hashlib.sha256()
    state = model.adapter_state()
    if legacy_names:
        state = {names_before_rename(name): t for name, t in state.items()}
    for name, t in sorted(state.items()):
        digest.update(name.encode())
        digest.update(t.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def forward_config(model: ReskipModel) -> dict:
    """The adapter settings that shape its forward pass beyond what its weights' shapes say: a policy calibrated
    under one of them does not hold under another (editing `variant` in adapter_config.json must not pass)."""
    return {"blocks": [[b.start, b[-1]] for b in model.blocks], "activation": model.config.activation,
            "skip_path": model.config.skip_path, "variant": model.config.variant}


def _integer(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass
class PolicyFile:
    data: dict
    path: Path | None = None

    # ---- reading -------------------------------------------------------------------------
    @classmethod
    def load(cls, path) -> "PolicyFile":
        path = Path(path)
        if not path.is_file():
            raise PolicyError(f"policy file {path} does not exist; write one with `reskip calibrate`")
        try:
            data = read_json(path)
        except ReskipError as e:
            raise PolicyError(str(e)) from None
        if not isinstance(data, dict):
            raise PolicyError(f"{path} is not a policy file (a JSON object written by `reskip calibrate`)")
        try:
            data = upgraded("policy.json", data, path)  # a policy file of an older reskip, under today's names
        except ReskipError as e:
            raise PolicyError(str(e)) from None
        policy = cls(data, path)
        policy.validate()
        return policy

    def validate(self, n_blocks: int | None = None) -> None:
        d, where = self.data, self.path or "policy"

        def need(cond, msg):
            if not cond:
                raise PolicyError(f"{where}: {msg}")

        for key in ("format_version", "backbone", "adapter", "delta", "quantile", "window", "max_skips", "blocks"):
            need(key in d, f"missing field {key!r}")
        for key in ("backbone", "adapter"):
            need(isinstance(d[key], dict), f"{key} must be an object (a fingerprint written by `reskip calibrate`)")
        need(d["format_version"] == FORMAT_VERSION, f"format_version must be {FORMAT_VERSION}")
        need(isinstance(d["adapter"].get("legacy_tensor_names"), bool), "adapter.legacy_tensor_names must be true or false")
        need(_integer(d["window"]) and d["window"] >= 1, f"window must be an integer >= 1, got {d['window']!r}")
        need(_integer(d["max_skips"]) and d["max_skips"] >= 0, f"max_skips must be >= 0, got {d['max_skips']!r}")
        need(is_finite_number(d["quantile"]) and 0.0 <= d["quantile"] <= 1.0, f"quantile must lie in [0, 1], got {d['quantile']!r}")
        need(is_finite_number(d["delta"]) and d["delta"] >= 0, f"delta must be a finite number >= 0, got {d['delta']!r}")
        need(isinstance(d["blocks"], list) and d["blocks"], "blocks must be a non-empty list")
        seen = set()
        for b in d["blocks"]:
            need(isinstance(b, dict), f"every block entry must be an object, got {b!r}")
            for key in ("block", "A", "eligible", "tau"):
                need(key in b, f"block entry {b.get('block', '?')} is missing {key!r}")
            n = b["block"]
            need(_integer(n) and n >= 1, f"block index {n!r} must be an integer >= 1")
            need(is_finite_number(b["A"]) and b["A"] > 0, f"A of block {n} must be a finite number > 0, got {b['A']!r}")
            need(isinstance(b["eligible"], bool), f"eligible of block {n} must be true or false, got {b['eligible']!r}")
            need(n not in seen, f"block {n} appears twice")
            seen.add(n)
            if n_blocks is not None:
                need(n <= n_blocks, f"block {n} is beyond this model's {n_blocks} blocks")
            if b["tau"] is not None:
                need(is_finite_number(b["tau"]) and 0.0 <= b["tau"] <= 1.0,
                     f"tau of block {n} must lie in [0, 1] (a routing weight), got {b['tau']!r}")
            need(not (b["eligible"] and b["tau"] is None), f"block {n} is eligible but has no threshold")
            grid = b.get("w_recent_quantiles")
            if grid is not None:
                need(isinstance(grid, list) and all(is_finite_number(g) and 0.0 <= g <= 1.0 for g in grid)
                     and all(a <= c for a, c in zip(grid, grid[1:])),
                     f"w_recent_quantiles of block {n} must be an ascending list of numbers in [0, 1]")
        budgets = d.get("budgets", {})
        need(isinstance(budgets, dict) and isinstance(budgets.get("frontier", []), list),
             "budgets must be an object whose frontier is a list")
        for p in budgets.get("frontier", []):
            need(isinstance(p, dict) and is_finite_number(p.get("budget")) and p["budget"] >= 0,
                 f"frontier point {p!r:.60} needs a budget >= 0")
            need(isinstance(p.get("blocks", {}), dict), f"budget {p['budget']}: blocks must be an object")
            for n, b in p.get("blocks", {}).items():
                need(str(n).isdigit() and int(n) in seen, f"budget {p['budget']}: block {n} is not in blocks")
                need(isinstance(b, dict) and is_finite_number(b.get("fraction")) and 0.0 <= b["fraction"] <= 1.0,
                     f"budget {p['budget']}: fraction of block {n} not in [0, 1]")
                need(b.get("tau") is None or (is_finite_number(b["tau"]) and 0.0 <= b["tau"] <= 1.0),
                     f"budget {p['budget']}: tau of block {n} must lie in [0, 1] or be null (skipped at every step)")

    def check_model(self, model: ReskipModel) -> None:
        """Refuse a model other than the backbone + adapter this policy was calibrated for."""
        self.validate(model.n_blocks)
        actual = fingerprint(model.base_model)
        saved = self.data["backbone"]
        diffs = [k for k in ("family", "num_layers", "hidden_size", "config_hash", "weights_digest") if saved.get(k) != actual[k]]
        if diffs:
            raise PolicyError(f"{self.path}: calibrated for another backbone (differs in {', '.join(diffs)}); recalibrate")
        adapter = self.data["adapter"]
        if adapter.get("side_channel_digest") != side_channel_digest(model, adapter["legacy_tensor_names"]):
            raise PolicyError(f"{self.path}: calibrated for another adapter; run `reskip calibrate` for this one")
        saved_forward = self.data["adapter"]["forward_config"]  # None: an upgraded file that did not keep it
        if saved_forward is not None and saved_forward != forward_config(model):
            diffs = [k for k, v in forward_config(model).items() if saved_forward.get(k) != v]
            raise PolicyError(f"{self.path}: calibrated for this adapter's weights under other settings (differs in "
                              f"{', '.join(diffs)}); run `reskip calibrate` for these")

    @property
    def blocks(self) -> dict[int, dict]:
        return {b["block"]: b for b in self.data["blocks"]}

    def eligible(self) -> set[int]:
        return {n for n, b in self.blocks.items() if b["eligible"]}

    # ---- policies ----------------------------------------------------------------------------
    def tau_at(self, n: int, quantile: float) -> float:
        grid = self.blocks[n].get("w_recent_quantiles")
        if quantile == self.data["quantile"] or not grid:
            return self.blocks[n]["tau"]
        return float(np.interp(quantile, np.linspace(0, 1, len(grid)), grid))

    def reskip(self, quantile: float | None = None, max_skips: int | None = None) -> ReSkip:
        q = self.data["quantile"] if quantile is None else quantile
        if not 0.0 <= q <= 1.0:
            raise PolicyError(f"quantile must lie in [0, 1], got {q}")
        eligible = self.eligible()
        return ReSkip(
            tau={n: self.tau_at(n, q) for n in eligible},
            eligible=eligible,
            max_skips=self.data["max_skips"] if max_skips is None else max_skips,
        )

    def static(self, k: float) -> StaticSkip:
        """static:k - the k eligible blocks of lowest ablation cost A(n), for every step (a
        fractional k: the next block at a share k - floor(k) of the steps, see `StaticSkip`)."""
        pool = [b for b in self.data["blocks"] if b["eligible"]]
        if not 0 <= k <= len(pool):
            raise PolicyError(f"static:{k:g} needs {k:g} eligible blocks; eligible: {sorted(self.eligible())}")
        return _ranked_static([b["block"] for b in sorted(pool, key=lambda b: b["A"])], k, f"static:{k:g}")

    def influence(self, k: float) -> StaticSkip:
        """influence:k - ShortGPT: the k blocks whose output is most similar to their input
        (highest mean cosine similarity on the calibration split), eligible or not."""
        pool = [b for b in self.data["blocks"] if b.get("cos_in_out") is not None]
        if not 0 <= k <= len(pool):
            raise PolicyError(f"influence:{k:g} needs {k:g} blocks; the policy has {len(pool)}")
        return _ranked_static([b["block"] for b in sorted(pool, key=lambda b: -b["cos_in_out"])], k,
                              f"influence:{k:g}")

    def sequence(self, k: int) -> SequenceSkip:
        """sequence:k - k eligible blocks chosen once per sequence from its first step's routing, each block's
        w_recent read against its own calibration quantile grid (`policies.SequenceSkip`)."""
        eligible = self.eligible()
        if not 0 <= k <= len(eligible):
            raise PolicyError(f"sequence:{k} needs {k} eligible blocks; eligible: {sorted(eligible)}")
        grids = {n: self.blocks[n].get("w_recent_quantiles") or [self.blocks[n]["tau"]] for n in eligible}
        return SequenceSkip(k, eligible, grids, {n: self.blocks[n]["A"] for n in eligible}, name=f"sequence:{k}")

    # ---- the budgeted frontier (`budget.calibrate_budgets`) ---------------------------------
    def budgets(self) -> list[float]:
        return [p["budget"] for p in self.data.get("budgets", {}).get("frontier", [])]

    def budget(self, b: float, held: bool = False) -> ReSkip:
        """reskip:budget=B - the frontier point stored for budget B (blocks skipped per step on average);
        `held`: its rate held online (`policies.HeldReSkip`), the thresholds starting at the calibration's."""
        points = {p["budget"]: p for p in self.data.get("budgets", {}).get("frontier", [])}
        if not points:
            raise PolicyError(f"{self.path or 'this policy'} has no budget frontier: run "
                              "`reskip calibrate --budgets 0.5,1,2` to store one")
        match = [p for v, p in points.items() if abs(v - b) < 1e-9]
        if not match:
            have = ", ".join(f"{v:g}" for v in sorted(points))
            raise PolicyError(f"no budget {b:g} in the policy's frontier (it has {have}); pick one of those or "
                              "recalibrate with `reskip calibrate --budgets ...`")
        fixed = policy_of_allocation(match[0]["blocks"], f"reskip:budget={b:g}")
        if not held:
            return fixed
        share = {int(n): blk["fraction"] for n, blk in match[0]["blocks"].items() if int(n) in fixed.tau}
        grids = {n: self.blocks[n].get("w_recent_quantiles") or [fixed.tau[n]] for n in share}
        return HeldReSkip(tau=fixed.tau, eligible=fixed.eligible, max_skips=fixed.max_skips,
                          name=f"reskip:budget={b:g}:held", always=fixed.always, share=share, seed_values=grids)

    def make(self, spec: Spec, seed: int = 0) -> SkipPolicy:
        """The policy a parsed spec names (`spec.parse_spec`), from this file."""
        return make_policy(spec, self, seed)

    def save(self, path) -> Path:
        atomic_write_json(Path(path), self.data)
        return Path(path)


def _ranked_static(ranked: list[int], k: float, name: str) -> StaticSkip:
    whole = int(k)
    partial, fraction = (ranked[whole], k - whole) if k > whole else (None, 0.0)
    return StaticSkip(set(ranked[:whole]), name=name, partial=partial, fraction=fraction)


def policy_of_allocation(blocks: dict, name: str) -> ReSkip:
    """A budgeted allocation {block: {"fraction", "tau"}} (tau None: skipped at every step) -> its ReSkip
    policy, with no cap on the skips per step (the allocation itself sets how many)."""
    chosen = {int(n): b for n, b in blocks.items() if b["fraction"] > 0}
    always = frozenset(n for n, b in chosen.items() if b["tau"] is None)
    return ReSkip(tau={n: b["tau"] for n, b in chosen.items() if n not in always}, eligible=set(chosen),
                  max_skips=len(chosen), name=name, always=always)


def dense_if_uncalibrated(spec: Spec, policy: PolicyFile | None, where) -> Spec:
    """Without a policy file every spec but `none` falls back to dense, and says so on stderr."""
    if policy is None and spec.needs_policy_file:
        print(f"note: {where} has no policy.json: running dense (no block is skipped). "
              "Run `reskip calibrate` to make one.", file=sys.stderr)
        return Spec("none", "none")
    return spec


# The policy each kind of `spec.KINDS` builds (a spec, the policy file, a seed -> a policy); `retrofit` is the
# method name of `none`. The kinds that need a policy file get one (checked before).
BUILDERS = {
    "none": lambda spec, policy, seed: NoSkip(),
    "retrofit": lambda spec, policy, seed: NoSkip(),
    "reskip": lambda spec, policy, seed: (policy.budget(spec.budget, spec.held) if spec.budget is not None
                                          else policy.reskip(spec.quantile, spec.max_skips)),
    "static": lambda spec, policy, seed: policy.static(spec.k),
    "influence": lambda spec, policy, seed: policy.influence(spec.k),
    "sequence": lambda spec, policy, seed: policy.sequence(spec.k),
    "random": lambda spec, policy, seed: RandomSkip(spec.p, policy.eligible(), seed, name=f"random:{spec.p}"),
}


def make_policy(spec: Spec, policy: PolicyFile | None, seed: int = 0) -> SkipPolicy:
    """The policy of a parsed spec (the kinds of `BUILDERS`)."""
    build = BUILDERS.get(spec.kind)
    if build is None:
        raise PolicyError(f"{spec.text!r} is not a skip policy; valid: {GRAMMAR}")
    if spec.needs_policy_file and policy is None:
        raise PolicyError(f"policy {spec.text!r} needs a calibrated policy.json (run `reskip calibrate`)")
    return build(spec, policy, seed)
