"""One lab session on a trained run: the model loaded once, texts scored one token per step under a
setting (`variables.Setting`), and a change measured against the baseline on the same text, beside the
user's prediction. One run at a time (a lock); texts are bounded in tokens."""

from __future__ import annotations

import contextlib
import math
import threading

import torch

from ...data.packing import pack
from ...data.sources import load_splits
from ...losses import ce_tokens
from ...skip.inference_run import open_run
from ...skip.scoring import on_model, score
from .variables import VARIABLES, LabError, Setting, apply, baseline

MAX_TOKENS = 256  # one token per step: a longer text would hold the lab for minutes on a CPU
MAX_HISTORY = 200  # runs kept (and sent with every answer): the oldest go first
UNCHANGED = 0.005  # |relative perplexity change| below this reads as "unchanged"
DIRECTIONS = ("better", "worse", "unchanged")


class LabSession:
    def __init__(self, run, model: str | None = None, dtype: str = "auto", device: str = "auto",
                 trust_remote_code: bool = False):
        self.opened = open_run(run, model=model, dtype=dtype, device=device, trust_remote_code=trust_remote_code,
                               require_policy=True)
        self.model, self.tokenizer = self.opened.model, self.opened.tokenizer
        self.policy_file = self.opened.policy_file
        self.has_shortcut = bool(self.model.side_channel.shortcuts)
        self.base = baseline(self.policy_file, self.has_shortcut)
        self.samples = self._samples()
        self.history: list[dict] = []
        self.lock = threading.Lock()

    def _samples(self, n: int = 3, tokens: int = 96) -> list[str]:
        """A few texts to pick: the first sequences of the run's own test split (never trained or calibrated on)."""
        splits, _ = load_splits(self.opened.source.data_specs)
        if not splits["test"]:
            return []
        data = pack(self.tokenizer, splits["test"], tokens, n, seed=0)
        return [self.tokenizer.decode(row, skip_special_tokens=True) for row in data.input_ids.tolist()]

    def state(self) -> dict:
        return {"baseline": self.base.describe(), "samples": self.samples, "variables": VARIABLES, "n_blocks": self.model.n_blocks,
                "budgets": self.policy_file.budgets(), "eligible": sorted(self.policy_file.eligible()),
                "max_tokens": MAX_TOKENS, "history": self.history}

    def tokens(self, text: str) -> torch.Tensor:
        if not isinstance(text, str) or not text.strip():
            raise LabError("paste a text to run on")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (JSON's "\ud800"): no tokenizer reads it
            raise LabError("the text holds a character that is not Unicode text (a lone surrogate)") from None
        ids = self.tokenizer(text, return_tensors="pt").input_ids
        if ids.shape[1] < 2:
            raise LabError("the text needs at least two tokens (one to predict from, one to predict)")
        if ids.shape[1] > MAX_TOKENS:
            raise LabError(f"the text has {ids.shape[1]} tokens; the lab takes at most {MAX_TOKENS} (one step per "
                           "token): shorten it")
        return on_model(self.model, ids)

    @contextlib.contextmanager
    def _as(self, setting: Setting):
        """The model under a setting's c(t) and skip path, restored afterwards."""
        side = self.model.side_channel
        c, shortcuts = side.curriculum, side.shortcuts
        self.model.set_curriculum(setting.curriculum)
        if setting.skip_path == "identity":
            side.shortcuts = None
        try:
            yield
        finally:
            side.shortcuts = shortcuts
            self.model.set_curriculum(c)

    def measure(self, ids: torch.Tensor, setting: Setting) -> dict:
        """Per token: the blocks skipped and every block's w_recent (one token per step); the perplexity."""
        with self._as(setting):
            logits, trace = score(self.model, ids, setting.policy, setting.window, chunk_size=1, track_all=True)
        nll = ce_tokens(logits, ids)[0, : ids.shape[1] - 1]  # (T - 1,): token t + 1 predicted at t
        return {"ppl": math.exp(float(nll.mean())), "nll": nll.tolist(), "top1": logits[0].argmax(-1).tolist(),
                "skipped": [t.skipped for t in trace],
                "w_recent": [{str(k): v for k, v in t.w_recent.items()} for t in trace]}

    def run(self, text: str, change: dict, prediction: dict) -> dict:
        """Baseline and changed setting on the same text; the measured delta beside the prediction."""
        direction, amount = _prediction(prediction)
        ids = self.tokens(text)
        changed = apply(self.base, change, self.policy_file, self.model.n_blocks, self.has_shortcut)
        if not self.lock.acquire(blocking=False):
            raise LabError("a run is in progress: wait for it to finish")
        try:
            with torch.no_grad():
                a, b = self.measure(ids, self.base), self.measure(ids, changed)
        finally:
            self.lock.release()
        rel = b["ppl"] / a["ppl"] - 1
        measured = "unchanged" if abs(rel) < UNCHANGED else ("better" if rel < 0 else "worse")
        flipped = [t for t, (x, y) in enumerate(zip(a["skipped"], b["skipped"])) if sorted(x) != sorted(y)]
        top1 = [t for t, (x, y) in enumerate(zip(a["top1"], b["top1"])) if x != y]
        words = [self.tokenizer.decode([int(i)]) for i in ids[0]]
        tau = {str(n): v for n, v in changed.policy.tau.items()}
        entry = {
            "change": {k: change[k] for k in ("variable", "value", "block") if k in change},  # only what it read
            "prediction": {"direction": direction, "amount_percent": amount},
            "measured": {"direction": measured, "ppl_base": a["ppl"], "ppl_changed": b["ppl"],
                         "delta_percent": 100 * rel, "top1_changed": len(top1), "decisions_flipped": len(flipped),
                         "mean_skipped_base": _mean(len(s) for s in a["skipped"]),
                         "mean_skipped_changed": _mean(len(s) for s in b["skipped"])},
            "prediction_right": direction == measured,
            "amount_error_percent": None if amount is None else abs(100 * rel) - amount,
        }
        self.history.append(entry)
        del self.history[:-MAX_HISTORY]
        return {**entry, "tokens": words, "base": a, "changed": b, "flipped_tokens": flipped, "top1_tokens": top1,
                "tau": tau, "setting": changed.describe(), "history": self.history}


def _prediction(p: dict) -> tuple[str, float | None]:
    if not isinstance(p, dict) or p.get("direction") not in DIRECTIONS:
        raise LabError("predict first: is perplexity going to be better, worse or unchanged?")
    extra = sorted(set(map(str, p)) - {"direction", "amount_percent"})
    if extra:
        raise LabError(f"a prediction takes direction and amount_percent, not {', '.join(map(repr, extra))[:200]}")
    amount = p.get("amount_percent")
    if amount in (None, ""):
        return p["direction"], None
    if isinstance(amount, bool) or not isinstance(amount, (int, float)):  # true is not 1%
        raise LabError(f"the predicted amount must be a percentage (a number), got {amount!r}")
    amount = float(amount)
    if not (math.isfinite(amount) and 0 <= amount <= 1000):
        raise LabError("the predicted amount must be a percentage between 0 and 1000")
    return p["direction"], amount


def _mean(values) -> float:
    v = list(values)
    return sum(v) / len(v) if v else 0.0
