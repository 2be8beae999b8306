"""`reskip run`: parity -> training -> calibration -> evaluation -> diagnostics -> report, into one folder.

Each finished stage is recorded in RUN/pipeline.json; `--resume RUN` skips finished stages and
continues training from its last checkpoint. Budgets come from a preset; flags override them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .errors import ReskipError
from .io_atomic import atomic_write_json

STAGES = ("parity", "train", "calibrate", "eval", "diagnose", "report")

PRESETS = {
    # Fits in well under 20 minutes on a 2-core CPU with the bundled model: a smoke run of the
    # whole pipeline, too short for the retrofit to learn much.
    "quick": {"train": {"steps": 30, "batch_size": 4, "seq_len": 128, "eval_every": 10, "save_every": 10,
                        "eval_sequences": 4},
              "calibrate": {"sequences": 8}, "eval": {"sequences": 4, "mc_limit": 10, "chunk_size": 32},
              "diagnose": {"sequences": 2, "sample_tokens": 64}},
    # The default recipe (TrainConfig defaults): about an hour of training on a 2-core CPU.
    "standard": {"train": {}, "calibrate": {"sequences": 32}, "eval": {"sequences": 16, "mc_limit": 50, "chunk_size": 32},
                 "diagnose": {"sequences": 4, "sample_tokens": 96}},
}


def _state(run: Path) -> dict:
    f = run / "pipeline.json"
    return json.loads(f.read_text()) if f.is_file() else {"finished": [], "timings": {}}


def run_pipeline(run: Path, preset: str = "quick", model: str | None = None, data: list[str] | None = None,
                 train_overrides: dict | None = None, resume: bool = False, delta: float = 1.0) -> dict:
    from .cli import main as cli  # the stages are the CLI commands, run in-process

    if preset not in PRESETS:
        raise ReskipError(f"unknown preset {preset!r}; valid: {', '.join(PRESETS)}")
    run = Path(run)
    if resume and not (run / "pipeline.json").is_file():
        raise ReskipError(f"{run} is not a pipeline run folder (no pipeline.json)")
    if not resume and (run / "pipeline.json").is_file():
        raise ReskipError(f"{run} already holds a run: use --resume {run} or another --out")
    run.mkdir(parents=True, exist_ok=True)
    state = _state(run)
    if not resume:
        state["preset"], state["model"], state["data"] = preset, model, data or ["default"]
        state["delta"] = delta
        atomic_write_json(run / "pipeline.json", state)
    p = PRESETS[state["preset"]]
    if not resume:
        state["overrides"] = train_overrides or {}
    model_args = ["--model", state["model"]] if state["model"] else []
    retrofit_args, train_args = [], []
    for k, v in {**p["train"], **state["overrides"]}.items():
        flag = [f"--{k.replace('_', '-')}", str(v)]
        train_args += flag
        if k in ("block_size", "rank", "boundaries"):
            retrofit_args += flag
    commands = {
        "parity": lambda: cli(["run-parity", "--out", str(run), *model_args, *retrofit_args]),
        "train": lambda: cli(["train", "--out", str(run), "--quiet", *model_args, "--data", *state["data"], *train_args]
                             + (["--resume", str(run)] if (run / "checkpoints" / "latest").is_file() else [])),
        "calibrate": lambda: cli(["calibrate", "--adapter", str(run), "--sequences", str(p["calibrate"]["sequences"]),
                                  "--delta", str(state["delta"])]),
        "eval": lambda: cli(["eval", "--adapter", str(run), "--quiet", "--sequences", str(p["eval"]["sequences"]),
                             "--mc-limit", str(p["eval"]["mc_limit"]), "--chunk-size", str(p["eval"]["chunk_size"])]),
        "diagnose": lambda: cli(["diagnose", str(run), "--sequences", str(p["diagnose"]["sequences"]),
                                 "--sample-tokens", str(p["diagnose"]["sample_tokens"])]),
        "report": lambda: cli(["report", str(run)]),
    }
    for i, stage in enumerate(STAGES, start=1):
        if stage in state["finished"]:
            print(f"[{i}/{len(STAGES)}] {stage}: already finished", flush=True)
            continue
        print(f"[{i}/{len(STAGES)}] {stage} ...", flush=True)
        t = time.time()
        code = commands[stage]()
        if code != 0:
            raise ReskipError(f"stage {stage} failed (exit {code}); fix it and continue with: reskip run --resume {run}")
        state["finished"].append(stage)
        state["timings"][stage] = time.time() - t
        atomic_write_json(run / "pipeline.json", state)
        print(f"[{i}/{len(STAGES)}] {stage}: done in {state['timings'][stage]:.0f} s", flush=True)
    return state
