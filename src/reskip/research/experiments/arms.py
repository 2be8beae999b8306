"""One arm of an experiment: a training configuration, trained, calibrated and tested the same way as
every other arm of that experiment (same data, seed and training tokens; only the arm's own keys differ).

An arm's folder is an ordinary run folder (config.yaml, train_log.jsonl, adapter/, policy.json) plus
`arm.json`, its measurements; an experiment run again reuses the arms that finished and resumes the
one that did not (training resumes exactly from its last checkpoint). An arm another experiment of the
same folder has finished with the same training configuration and measurements (`variants`' recipe is
`mix`'s whole mix) is not trained again: its arm.json is copied, saying where from."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...data.packing import pack
from ...data.sources import load_splits
from ...io_atomic import atomic_write_json
from ...reading import read_json
from ...run_folder import RunFolder
from ...skip.inference_run import open_run
from ...skip.policy_file import PolicyFile
from ...train.checkpoint import latest_checkpoint
from ...train.log import read_log, records
from ...train.run import train_run
from ...train_config import TrainConfig
from ..analysis.signal_test import signal_test
from ..calibrate.options import CalibrateOptions
from ..calibrate.run import calibrate_run
from ..report.diagnostics import spearman
from .results_file import read_results

ARM_FILE = "arm.json"


@dataclass
class Arm:
    """name: the arm's label in the tables; train: TrainConfig keys; retrofit: RetrofitConfig keys."""

    name: str
    train: dict = field(default_factory=dict)
    retrofit: dict = field(default_factory=dict)
    note: str = ""

    def config(self, base: TrainConfig) -> TrainConfig:
        values = {**base.to_dict(), **self.train}
        values["retrofit"] = {**values["retrofit"], **self.retrofit}  # the base's resolved retrofit, then the arm's
        return TrainConfig.from_dict(values)


@dataclass
class Measure:
    """What each arm gets measured with: calibration and test sequences, whether it gets the signal test
    (`block-size` does not: its claims are about perplexity and the frontier) and on which blocks (None:
    every block with a router that is not the last), and the budget frontier's budgets (empty: none)."""

    calib_sequences: int
    test_sequences: int
    signal_blocks: list[int] | None = None
    budgets: tuple[float, ...] = ()
    chunk_size: int = 32
    signal: bool = True


def curve(log: list[dict]) -> list[dict]:
    """Every validation of the run: step, c(t), perplexity of the retrofit and of the backbone, KL to it."""
    return [{"step": r["step"], "c": r["c"], "ppl": r["ppl_full"], "ppl_backbone": r["ppl_backbone"],
             "kl": r["kl_full"]} for r in records(log, "eval")]


def run_arm(arm: Arm, base: TrainConfig, folder: Path, measure: Measure, show=print) -> dict:
    """Train, calibrate and signal-test one arm (or read its finished measurements); returns them."""
    folder = Path(folder)
    done = folder / ARM_FILE
    if done.is_file():
        show(f"[{arm.name}] measured already: {done}")
        return read_results(done, "arm", "train")
    t0 = time.perf_counter()
    cfg = arm.config(base)
    twin = finished_twin(folder, cfg, measure)
    if twin is not None:
        show(f"[{arm.name}] the same arm as {twin.parent}: its measurements reused, not trained again")
        result = {**read_results(twin, "arm"), "arm": arm.name, "note": arm.note, "train": arm.train,
                  "reused_from": str(twin.parent)}
        atomic_write_json(done, result)
        return result
    show(f"[{arm.name}] training {cfg.steps} steps x {cfg.batch_size} x {cfg.seq_len} tokens")
    # the experiment owns the arm folder: a first attempt stopped before its first checkpoint is replaced
    train_run(folder, cfg, resume=latest_checkpoint(folder) is not None, show_progress=False, overwrite=True)
    t_train = time.perf_counter() - t0
    show(f"[{arm.name}] calibrating on {measure.calib_sequences} sequences")
    options = CalibrateOptions(sequences=measure.calib_sequences, budgets=measure.budgets,
                               chunk_size=measure.chunk_size, dtype=cfg.dtype, device=cfg.device)
    policy = PolicyFile.load(calibrate_run(folder, options))
    opened = open_run(folder, dtype=cfg.dtype, device=cfg.device)
    model = opened.model
    n_blocks = model.n_blocks
    st = None
    if measure.signal:
        blocks = measure.signal_blocks or list(range(2, n_blocks))
        splits, _ = load_splits(cfg.data)
        test = pack(opened.tokenizer, splits["test"], cfg.seq_len, measure.test_sequences, seed=0)
        show(f"[{arm.name}] signal test on blocks {blocks}, {len(test)} test sequences")
        st = signal_test(model, test, blocks, policy.data["window"])
    log = read_log(RunFolder(folder).train_log)
    evals = curve(log)
    last = records(log, "eval")[-1]
    worst = max(evals, key=lambda e: e["ppl"])
    result = {
        "arm": arm.name, "note": arm.note, "train": arm.train, "retrofit": cfg.retrofit_config().to_dict(),
        "params": sum(p.numel() for p in model.trainable_parameters()),
        "n_blocks": n_blocks, "dtype": opened.dtype, "layers_per_block": [b.stop - b.start for b in model.blocks],
        "training": {"steps": cfg.steps, "batch_size": cfg.batch_size, "seq_len": cfg.seq_len,
                   "tokens": cfg.steps * cfg.batch_size * cfg.seq_len},
        "curve": evals,
        "ppl_backbone": evals[0]["ppl_backbone"],
        "worst_ppl": worst["ppl"], "worst_step": worst["step"],
        "final_ppl": evals[-1]["ppl"], "final_kl": evals[-1]["kl"],
        "blocks": {str(b["block"]): _block_row(b, last) for b in policy.data["blocks"]},
        "spearman_I_vs_A": _spearman_I_A(policy.data["blocks"]),
        "signal_test": st,
        "frontier": (policy.data.get("budgets") or {}).get("frontier"),
        "measure": _as_stored(measure),
        "wall_s": {"train": t_train, "total": time.perf_counter() - t0},
    }
    atomic_write_json(done, result)
    del model
    return result


def finished_twin(folder: Path, cfg: TrainConfig, measure: Measure) -> Path | None:
    """arm.json of a finished arm in another experiment of the same experiments folder (OUT/experiments/
    NAME/arms/ARM) trained with exactly `cfg` and measured with `measure`; None when there is none."""
    mine = cfg.to_dict()
    for other in sorted(folder.parents[2].glob(f"*/arms/*/{ARM_FILE}")):
        if other.parent.resolve() == folder.resolve():
            continue
        stored = RunFolder(other.parent).config
        data = read_json(other)
        if not stored.is_file() or not isinstance(data, dict) or data.get("measure") != _as_stored(measure):
            continue
        if TrainConfig.from_file(stored).to_dict() == mine:
            return other
    return None


def _as_stored(measure: Measure) -> dict:
    """The measurements' settings as arm.json holds them (tuples as lists)."""
    return json.loads(json.dumps(asdict(measure)))


def _block_row(b: dict, last_eval: dict) -> dict:
    """A(n), I(n), the routing's entropy (share of log n) and its spread over tokens (w_recent's 5-95% range)."""
    n = str(b["block"])
    ent = last_eval.get("entropy", {}).get(n)
    return {"layers": b["layers"], "A": b["A"], "I": b["I"],
            "entropy_ratio": ent / math.log(b["block"]) if ent is not None and b["block"] > 1 else None,
            "w_recent_range": b["signal"]["w_recent"]["range"] if "signal" in b else None,
            "alpha_prev_std": b["signal"]["alpha_prev"]["std"] if "signal" in b else None}


def _spearman_I_A(blocks: list[dict]) -> float | None:
    """Rank correlation over blocks of routing importance I(n) and ablation cost A(n) (the first source document's pairing)."""
    rows = [b for b in blocks if b["I"] is not None]
    return spearman([b["I"] for b in rows], [b["A"] for b in rows])


def middle_blocks(arm: dict) -> list[dict]:
    """arm.json's rows of the blocks with a router that are not the last (2 .. N-1): the ones ReSkip may skip."""
    return [b for n, b in arm["blocks"].items() if 1 < int(n) < arm["n_blocks"]]


def beats_random(arm: dict, p: float | None = None) -> list[int] | None:
    """Blocks where the signal test finds w_recent's positions cheaper to skip than random ones (at rate p:
    the test's largest by default), outside the 95% bootstrap interval; None when the arm had no signal test."""
    st = arm["signal_test"]
    if st is None:
        return None
    p = max(st["rates"]) if p is None else p
    return [r["block"] for r in st["blocks"] if r["p"] == p and r["verdict"] == "signal beats random"]
