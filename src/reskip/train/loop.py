"""Training the side-channel: CE(full) + lambda_kl KL(teacher || skip) - lambda_ent H(alpha).

Runs on one process, or data-parallel under `accelerate launch` with no code change.
Everything that varies per step (c(t), learning rate, drawn block, batch) is a pure
function of the step and the seed, so a resumed run continues exactly.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from accelerate import Accelerator

from ..backbones.devices import device_name, resolve_device
from ..backbones.dtypes import describe, resolve_dtype_name
from ..backbones.loading import DEFAULT_BACKBONE, load_backbone, load_config
from ..data.packing import Packed, pack
from ..data.sources import load_splits
from ..errors import ReskipError
from ..io_atomic import atomic_write_json, atomic_write_text
from ..ar_retrofit.blocks import retrofit_blocks
from ..ar_retrofit.config import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME
from ..ar_retrofit.model_card import CARD_NAME
from ..ar_retrofit.model import ReskipModel, retrofit
from ..progress import Progress
from ..run_lock import writing
from ..runs import RunFolder
from .checkpoint import CHECKPOINT_NAME, latest_checkpoint, load_checkpoint, save_checkpoint
from ..train_config import TrainConfig
from .log import append_record, last_eval, read_log, summarize, truncate_after
from .objective import RetrofitObjective
from .process_group import check_launch, launched_processes
from .sharding import average_gradients, shard_backbone
from .schedules import curriculum, drawn_blocks, learning_rate, skipped_positions
from .trackers import TRACKER_RUN, hyperparameters, scalars
from .validation import validation_metrics


class TrainingDiverged(ReskipError):
    pass


def prepare_data(cfg: TrainConfig, tokenizer, splits) -> tuple[Packed, Packed]:
    n_train = cfg.steps * cfg.batch_size
    train = pack(tokenizer, splits["train"], cfg.seq_len, n_train, cfg.seed, cfg.data_weights)
    if not splits["val"]:
        raise ReskipError("the validation split is empty: give more documents")
    val = pack(tokenizer, splits["val"], cfg.seq_len, cfg.eval_sequences, cfg.seed)
    return train, val


def parameter_groups(model: ReskipModel, cfg: TrainConfig) -> list[dict]:
    """The side-channel's parameters in three optimizer groups, chosen by structure (the routers'
    query and source-bias parameters, and everything else), each with its learning-rate multiple."""
    routers = model.side_channel.routers()
    query = [r.query for r in routers]
    bias = [r.source_bias for r in routers]
    chosen = {id(p) for p in query + bias}
    rest = [p for p in model.trainable_parameters() if id(p) not in chosen]
    return [{"params": query, "lr_mult": cfg.router_lr_mult, "name": "router query"},
            {"params": bias, "lr_mult": cfg.source_bias_lr_mult, "name": "router source bias"},
            {"params": rest, "lr_mult": 1.0, "name": "corrections and gates"}]


def check_against_backbone(cfg: TrainConfig) -> int:
    """Check the config against the backbone's own config (no weights load); returns the block count."""
    model_config = load_config(cfg.model, cfg.trust_remote_code)
    rcfg = cfg.retrofit_config()
    n_blocks = len(retrofit_blocks(model_config.num_hidden_layers, rcfg.block_size, rcfg.boundaries))
    cfg.check_against_model(model_config, n_blocks)
    return n_blocks


@dataclass
class TrainingRun:
    """What one training process holds while it trains: the resolved config, the distributed engine, the model
    and its objective and optimizer, the packed data, the run folder's files and where the run stands."""

    cfg: TrainConfig
    accelerator: Accelerator
    model: ReskipModel
    objective: torch.nn.Module
    optimizer: torch.optim.Optimizer
    train_data: Packed
    val_data: Packed
    files: RunFolder
    step: int = 0
    tokens_seen: int = 0
    teacher_states: dict = field(default_factory=dict)  # the backbone's final hidden states on val_data, kept

    @property
    def main(self) -> bool:
        return self.accelerator.is_main_process

    def log(self, rec: dict) -> None:
        if self.main:
            append_record(self.files.train_log, rec)
            if self.cfg.report_to:
                self.accelerator.log(scalars(rec), step=rec["step"])


def train_run(
    run_dir: Path,
    cfg: TrainConfig,
    resume: bool = False,
    on_step_end: Callable[[int, ReskipModel], None] | None = None,
    show_progress: bool = True,
    overwrite: bool = False,
) -> Path | None:
    """Train into `run_dir` (config.yaml, splits.json, train_log.jsonl, checkpoints/, adapter/, summary.json);
    returns summary.json's path (None in the other processes of a data-parallel job, where rank 0 writes).

    A folder that holds another training run is refused unless `overwrite` (its training files are then
    removed); `resume` continues the folder's own run, and settings that contradict it are refused."""
    with writing(Path(run_dir)):
        summary = _train(cfg, Path(run_dir), resume, on_step_end, show_progress, overwrite)
    return RunFolder(run_dir).summary if summary else None


def _train(cfg: TrainConfig, run_dir: Path, resume: bool, on_step_end, show_progress: bool, overwrite: bool) -> dict:
    run = open_training(cfg, run_dir, resume, show_progress, overwrite)
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
        bar.update(1, **{x: f"{record[x]:.3f}" for x in ("loss", "ce", "kl")}, c=f"{record['c']:.2f}")
        if done % cfg.eval_every == 0 or done == cfg.steps:
            val_s.append(validate(run, show))
            bar.set_aside(val_s[-1], sum(val_s) / len(val_s) * validations_after(done, cfg))
        if done % cfg.save_every == 0 or done == cfg.steps:
            if run.main:
                save_checkpoint(run.files.root, done, run.model, run.optimizer, run.tokens_seen)
            run.accelerator.wait_for_everyone()
        if on_step_end is not None:
            on_step_end(done, run.model)
    bar.close()
    last = last_eval(run.files.train_log)
    if last is None or last["step"] != cfg.steps:  # resumed at its end with the last validation's line lost
        validate(run, show)
    return finish(run, wall_s=time.time() - t0)


TRAINING_FILES = ("config", "train_log", "checkpoints", "adapter", "summary")  # `RunFolder` names a run's training owns


def check_identity(cfg: TrainConfig, files: RunFolder, resume: bool, overwrite: bool, remove: bool = True) -> None:
    """Refuse to train over another run (unless `overwrite`: its training files are removed), and to resume a
    run with settings that contradict its own config.yaml."""
    if resume:
        if not files.config.is_file():
            raise ReskipError(f"{files.root} is not a training run folder (no config.yaml): nothing to resume")
        recorded = TrainConfig.from_file(files.config)
        recorded = dataclasses.replace(recorded, dtype=resolve_dtype_name(recorded.dtype))
        ours, asked = recorded.what_it_trains(), cfg.what_it_trains()  # the retrofit keys compared resolved
        diffs = [f"{k}: the run's {ours[k]!r}, asked {asked[k]!r}" for k in ours if ours[k] != asked[k]]
        if diffs:
            raise ReskipError(f"--resume {files.root} keeps the run's own settings, and these differ: "
                              + "; ".join(diffs) + ". Drop those flags, or train into another --out")
        if latest_checkpoint(files.root) is None:
            raise ReskipError(f"{files.root} has no checkpoint to resume from (it stopped before its first): start "
                              "it again with the same flags and --overwrite")
        read_log(files.train_log)  # a corrupt log is refused now, before any weights load
        return
    held = [getattr(files, name) for name in TRAINING_FILES if getattr(files, name).exists()]
    if held and not overwrite:
        raise ReskipError(f"{files.root} already holds a training run ({', '.join(p.name for p in held)}): "
                          "--resume it, pass --overwrite to replace it, or choose another --out")
    foreign = not_written_by_training(files)
    if foreign:
        raise ReskipError(f"{files.root} holds files that are not a reskip training run's ({', '.join(foreign[:5])}): "
                          "--overwrite removes only a run's own files; move those away or choose another --out")
    for path in held if remove else ():  # one process removes them
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


OWN_ADAPTER_FILES = {ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, CARD_NAME}
# what a process killed while writing a checkpoint leaves: `checkpoint.save_checkpoint`'s `.tmp-step-N` folder and
# `io_atomic`'s temporaries (of the pointer, a checkpoint, or that folder): the run's own too
OWN_TEMPORARY = re.compile(r"\.tmp-step-\d{6}|\.(latest|step-\d{6}|\.tmp-step-\d{6})\..+\.(tmp|old)")


def not_written_by_training(files: RunFolder) -> list[str]:
    """The paths among a folder's training files that training did not write (a config.yaml that is not a
    training config, anything in checkpoints/ or adapter/ but the run's own), which --overwrite must not remove."""
    out = []
    if files.config.is_file():
        try:
            TrainConfig.from_file(files.config)
        except ReskipError:
            out.append(str(files.config))
    elif files.config.exists():
        out.append(str(files.config))
    for folder, own in ((files.checkpoints, lambda p: p.name == "latest" or CHECKPOINT_NAME.fullmatch(p.name)
                         or OWN_TEMPORARY.fullmatch(p.name)),
                        (files.adapter, lambda p: p.name in OWN_ADAPTER_FILES)):
        if folder.is_dir():
            out += [str(p) for p in sorted(folder.iterdir()) if not own(p)]
    return out


def open_training(cfg: TrainConfig, run_dir: Path, resume: bool, show_progress: bool,
                  overwrite: bool = False) -> TrainingRun:
    """Check the config, load the backbone and data, build the model, objective and optimizer (restored from
    the last checkpoint on `resume`), and write config.yaml and splits.json."""
    # cpu=True on the CPU: under torchrun this gives gloo data-parallel on CPU processes; on CUDA each process
    # takes its local rank's GPU (one process: the one --device names).
    check_launch()
    device = training_device(cfg.device)
    accelerator = Accelerator(gradient_accumulation_steps=cfg.grad_accum, cpu=device.type == "cpu",
                              log_with=cfg.report_to, project_dir=run_dir if cfg.report_to else None)
    cfg.validate(world_size=accelerator.num_processes)
    if cfg.shard and accelerator.num_processes < 2:
        raise ReskipError("--shard splits the backbone over several processes: launch with torchrun --nproc_per_node N "
                          "or accelerate launch --multi_gpu --num_processes N")
    if cfg.shard and cfg.retrofit_config().inner_lora:
        raise ReskipError("--shard keeps the decoder layers frozen and sharded: it does not train a LoRA inside them "
                          "(inner_lora)")
    # config.yaml, the adapter and a resumed run keep the dtype 'auto' resolved to on this hardware
    asked, cfg = cfg.dtype, dataclasses.replace(cfg, dtype=resolve_dtype_name(cfg.dtype, accelerator.device))
    files = RunFolder(run_dir)
    check_identity(cfg, files, resume, overwrite, remove=accelerator.is_main_process)
    splits, record = load_splits(cfg.data)  # cheap; an empty data set fails here, before the model
    check_against_backbone(cfg)
    torch.manual_seed(cfg.seed)
    if accelerator.is_main_process and show_progress:
        print(f"[train] {cfg.steps} steps x {cfg.batch_size} x {cfg.seq_len} tokens, backbone in {describe(asked)}",
              flush=True)
    # sharded: loaded on the host, then each layer's shard goes to this process's device
    base, tokenizer = load_backbone(cfg.model, cfg.dtype, cfg.trust_remote_code,
                                    "cpu" if cfg.shard else accelerator.device)
    if cfg.shard:
        shard_backbone(base, accelerator.device)
    model = retrofit(base, cfg.retrofit_config(), seed=cfg.seed)
    train_data, val_data = prepare_data(cfg, tokenizer, splits)
    optimizer = torch.optim.AdamW(parameter_groups(model, cfg), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start, tokens_seen = 0, 0
    if resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise ReskipError(f"{run_dir} has no checkpoint to resume from")
        state = load_checkpoint(ckpt, model, optimizer)
        start, tokens_seen = state["step"], state["tokens_seen"]
        if not 0 < start <= cfg.steps:
            raise ReskipError(f"{ckpt} is at step {start}, outside this run's 1..{cfg.steps}: it is not this run's "
                              "checkpoint; train into another --out")
    objective = RetrofitObjective.of(model, cfg)
    if cfg.shard:  # no DDP around sharded layers: the side-channel's gradients are averaged by `average_gradients`
        optimizer = accelerator.prepare(optimizer)
    else:
        objective, optimizer = accelerator.prepare(objective, optimizer)
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(files.config, cfg.to_yaml())
        record["packed"] = {"train_sequences": len(train_data), "val_sequences": len(val_data), "seq_len": cfg.seq_len}
        atomic_write_json(files.splits, record)
        if resume:
            truncate_after(files.train_log, start)
        elif files.train_log.exists():
            files.train_log.unlink()
    if cfg.report_to:
        accelerator.init_trackers(TRACKER_RUN, config=hyperparameters(cfg.to_dict()))
    return TrainingRun(cfg, accelerator, model, objective, optimizer, train_data, val_data, files, start, tokens_seen)


def training_device(name: str) -> torch.device:
    """The device --device names for this training process, before the engine starts: under a launcher each process
    takes its local rank's GPU, so a numbered GPU is refused there; one process on cuda:N makes it the current one."""
    device = resolve_device(name)
    if device.type == "cuda" and device.index is not None:
        if launched_processes() > 1:
            raise ReskipError(f"--device {name}: under torchrun or accelerate launch each process takes its own GPU "
                              "(its local rank); pass --device cuda (or auto) and choose the GPUs with "
                              "CUDA_VISIBLE_DEVICES")
        torch.cuda.set_device(device)
    return device


def validations_after(step: int, cfg: TrainConfig) -> int:
    """The validations training still runs after `step`: every eval_every steps, and at the last."""
    return len({s for s in range(step + 1, cfg.steps + 1) if s % cfg.eval_every == 0} | ({cfg.steps} - {step}))


def validate(run: TrainingRun, show: bool = False) -> float:
    """One validation record at the run's step (main process only), with its own progress; returns its seconds."""
    cfg, model, step = run.cfg, run.model, run.step
    if not run.main and not cfg.shard:  # sharded layers run only when every process runs them
        return 0.0
    t0 = time.time()
    model.set_curriculum(curriculum(step, cfg.steps, cfg.hold_frac, cfg.ramp_end_frac))
    # With chunked losses (the memory-lean recipe) validation scores one sequence at a time, so it holds
    # (1, T, V) logits, not the micro-batch's (B, T, V): otherwise it would set the run's peak.
    val_batch = 1 if cfg.loss_chunk else max(1, cfg.batch_size // max(1, cfg.grad_accum))
    skip_kl = cfg.skip_kl_curve or step in (0, cfg.steps)
    bar = Progress(len(run.val_data), f"validate at step {step}", unit="seq", enabled=show)
    metrics = validation_metrics(model, run.val_data, batch_size=val_batch, skip_kl=skip_kl,
                                 teacher_states=run.teacher_states, progress=bar.update)
    bar.close()
    run.log({"kind": "eval", "step": step, "c": model.side_channel.curriculum, "tokens_seen": run.tokens_seen,
             **metrics})
    return time.time() - t0


def optimizer_step(run: TrainingRun, bar: Progress) -> dict:
    """One optimizer step at run.step (its micro-batches on every process); advances the run and returns the
    step's train record, its terms averaged over processes and micro-batches."""
    cfg, acc, step = run.cfg, run.accelerator, run.step
    world, rank = acc.num_processes, acc.process_index
    c = curriculum(step, cfg.steps, cfg.hold_frac, cfg.ramp_end_frac)
    lr = learning_rate(step, cfg.steps, cfg.lr, cfg.warmup_frac, cfg.min_lr_frac)
    run.model.set_curriculum(c)
    for group in run.optimizer.param_groups:
        group["lr"] = lr * group["lr_mult"]
    dropped = drawn_blocks(step, cfg.seed, cfg.drawable_blocks(run.model.n_blocks), cfg.skip_max_blocks)
    k, also = dropped[0], tuple(dropped[1:])
    # The global batch of this step, the same on every process; data cycles when exhausted.
    idx = [(step * cfg.batch_size + j) % len(run.train_data) for j in range(cfg.batch_size)]
    ids, labels = run.train_data.input_ids[idx], run.train_data.labels[idx]
    positions = skipped_positions(step, cfg.seed, tuple(ids.shape), cfg.skip_fraction)
    n_targets = int((labels[:, 1:] != -100).sum())  # counted on the host, before the batch moves
    ids, labels = ids.to(acc.device), labels.to(acc.device)
    positions = None if positions is None else positions.to(acc.device)
    # Each micro-batch contributes sum / global count; DDP averages over processes and
    # accelerate divides by grad_accum, hence the factor world * grad_accum.
    target_scale = world * cfg.grad_accum / max(n_targets, 1)
    position_scale = world * cfg.grad_accum / ids.numel()
    micro = cfg.batch_size // (world * cfg.grad_accum)
    totals = torch.zeros(6, device=acc.device)
    for m in range(cfg.grad_accum):
        lo = (m * world + rank) * micro
        with acc.accumulate(run.objective):
            mask = None if positions is None else positions[lo : lo + micro]
            terms = run.objective(ids[lo : lo + micro], labels[lo : lo + micro], k, target_scale, position_scale,
                                  mask, also)
            bad = (~torch.isfinite(terms["loss"].detach())).float().reshape(1)
            if acc.reduce(bad, "sum").item() > 0:  # every process stops together
                bar.close()
                last = latest_checkpoint(run.files.root)
                raise TrainingDiverged(
                    f"loss became {terms['loss'].item()} at step {step} (c={c:.3f}, lr={lr:.2e}); the run "
                    f"stopped. Last good checkpoint: {last or 'none'}. Lower --lr or --lambda-kl and resume."
                )
            acc.backward(terms["loss"])
            if acc.sync_gradients and cfg.shard:
                average_gradients(run.model.trainable_parameters())
            if acc.sync_gradients:
                acc.clip_grad_norm_(run.model.trainable_parameters(), cfg.clip_norm)
            run.optimizer.step()
            run.optimizer.zero_grad()
        totals += torch.stack([terms[x].float() for x in ("loss", "ce", "kl", "ent", "sig", "local")])
    loss, ce, kl, ent, sig, local = (acc.reduce(totals, "sum") / (world * cfg.grad_accum)).tolist()
    run.tokens_seen += ids.numel()
    run.step = step + 1
    return {"kind": "train", "step": run.step, "c": c, "lr": lr, "loss": loss, "ce": ce, "kl": kl,
            "entropy": ent, "signal_corr": sig, "skip_block": k,
            **({"skip_blocks": dropped} if cfg.skip_max_blocks > 1 else {}),
            **({"local": local} if cfg.lambda_local > 0 else {}), "tokens_seen": run.tokens_seen, "processes": world}


def finish(run: TrainingRun, wall_s: float) -> dict:
    """The final adapter (with its model card's figures) and summary.json; returns the summary."""
    cfg, model = run.cfg, run.model
    summary = {}
    if run.main:
        model.set_curriculum(1.0 if cfg.steps else 0.0)
        summary = summarize(run.files.train_log, wall_s=wall_s)
        summary["device"] = device_name(run.accelerator.device)
        # What the adapter's model card tells (`ar_retrofit.model_card`), kept with it in adapter_config.json.
        card = {"model": cfg.model or DEFAULT_BACKBONE, "dtype": cfg.dtype, "device": summary["device"],
                "training": {"data": list(cfg.data), "data_weights": cfg.data_weights, "steps": cfg.steps,
                             "batch_size": cfg.batch_size, "seq_len": cfg.seq_len, "lr": cfg.lr},
                "measured": {"ppl_backbone": summary["ppl_backbone"], "ppl_start": summary["ppl_full"]["start"],
                             "ppl_end": summary["ppl_full"]["end"], "kl_end": summary["kl_full"]["end"]}}
        model.save_adapter(run.files.adapter, metadata={"steps": cfg.steps, "tokens_seen": run.tokens_seen, **card})
        atomic_write_json(run.files.summary, summary)
    if cfg.report_to:
        run.accelerator.end_training()
    run.accelerator.wait_for_everyone()
    return summary
