"""`reskip train`: the training stage's entry, the loop on one screen. Everything around it (the run folder's
identity, resume, the engine, one optimizer step, validation, the summary) is the one loop's machinery
(`train.loop`), for every trainee: the retrofit's side-channel or a LoRA healing run (`compress.trainee`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from ..ar_retrofit.model import ReskipModel
from ..progress import Progress
from ..run_folder import RunFolder
from ..run_folder.lock import writing
from ..train_config import TrainConfig
from .checkpoint import save_checkpoint
from .log import last_eval
from .loop import RETROFIT, finish, open_training, optimizer_step, validate, validations_after


def train_run(
    run_dir: Path,
    cfg: TrainConfig,
    resume: bool = False,
    on_step_end: Callable[[int, ReskipModel], None] | None = None,
    show_progress: bool = True,
    overwrite: bool = False,
    builder=None,
) -> Path | None:
    """Train into `run_dir` (config.yaml, splits.json, train_log.jsonl, checkpoints/, adapter/, summary.json);
    returns summary.json's path (None in the other processes of a data-parallel job, where rank 0 writes).
    builder: what trains (`RetrofitBuilder`, the default, or `lora_trainee.LoraBuilder`).

    A folder that holds another training run is refused unless `overwrite` (its training files are then
    removed); `resume` continues the folder's own run, and settings that contradict it are refused."""
    with writing(Path(run_dir)):
        summary = _train(cfg, Path(run_dir), resume, on_step_end, show_progress, overwrite, builder or RETROFIT)
    return RunFolder(run_dir).summary if summary else None


def _train(cfg: TrainConfig, run_dir: Path, resume: bool, on_step_end, show_progress: bool, overwrite: bool,
           builder) -> dict:
    run = open_training(cfg, run_dir, resume, show_progress, overwrite, builder)
    cfg = run.cfg
    show = run.main and show_progress
    val_s = [validate(run, show)] if run.step == 0 else []  # seconds per validation: the time left counts them
    bar = Progress(cfg.steps, "train", initial=run.step, enabled=show)
    bar.set_aside(0.0, (val_s or [0.0])[0] * validations_after(run.step, cfg))
    t0 = time.time()
    while run.step < cfg.steps:
        record = optimizer_step(run, bar)
        record["elapsed_s"] = time.time() - t0
        done = run.step
        if done % cfg.log_every == 0 or done == cfg.steps:
            run.log(record)
        bar.update(1, **{x: f"{record[x]:.3f}" for x in ("loss", "ce", "kl") if x in record},
                   **({"c": f"{record['c']:.2f}"} if "c" in record else {}))
        if done % cfg.eval_every == 0 or done == cfg.steps:
            val_s.append(validate(run, show))
            bar.set_aside(val_s[-1], sum(val_s) / len(val_s) * validations_after(done, cfg))
        if done % cfg.save_every == 0 or done == cfg.steps:
            if run.main:
                save_checkpoint(run.files.root, done, run.trainee, run.optimizer, run.tokens_seen,
                                run.builder.identity(cfg))
            run.accelerator.wait_for_everyone()
        if on_step_end is not None:
            on_step_end(done, run.model)
    bar.close()
    last = last_eval(run.files.train_log)
    if last is None or last["step"] != cfg.steps:  # resumed at its end with the last validation's line lost
        validate(run, show)
    return finish(run, wall_s=time.time() - t0)
