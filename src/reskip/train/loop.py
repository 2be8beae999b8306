"""The one training loop's machinery (its entry and the loop itself: `stages.train.train_run`): a run folder's
identity, resume, checkpoints, log, progress, learning-rate schedule,
batches, data-parallel (accelerate), FSDP2 sharding and trackers, around a *trainee* (`train.trainee`): the
retrofit's side-channel (CE(full) + lambda_kl KL(teacher || skip) - lambda_ent H(alpha), the default trainee) or a
LoRA healing run (`compress.trainee`).

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

import torch
from accelerate import Accelerator

from ..ar_retrofit.blocks import retrofit_blocks
from ..ar_retrofit.config import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME
from ..ar_retrofit.model import ReskipModel
from ..ar_retrofit.model_card import CARD_NAME
from ..backbones.devices import device_name, resolve_device
from ..backbones.dtypes import describe, resolve_dtype_name
from ..backbones.loading import load_backbone, load_config
from ..data.packing import Packed, pack
from ..data.sources import load_splits
from ..errors import ReskipError
from ..io_atomic import atomic_write_json, atomic_write_text
from ..progress import Progress
from ..run_folder import RunFolder
from ..train_config import TrainConfig
from .checkpoint import CHECKPOINT_NAME, checkpoints_dir, latest_checkpoint, load_checkpoint
from .log import append_record, read_log, truncate_after
from .process_group import check_launch, launched_processes
from .schedules import learning_rate
from .sharding import average_gradients, shard_backbone
from .trackers import TRACKER_RUN, hyperparameters, scalars
from .trainee import Counts, RetrofitBuilder, RetrofitTrainee, Trainee


class TrainingDiverged(ReskipError):
    pass


RETROFIT = RetrofitBuilder()  # the default builder: the source design


def prepare_data(cfg: TrainConfig, tokenizer, splits) -> tuple[Packed, Packed]:
    n_train = cfg.steps * cfg.batch_size
    train = pack(tokenizer, splits["train"], cfg.seq_len, n_train, cfg.seed, cfg.data_weights)
    if not splits["val"]:
        raise ReskipError("the validation split is empty: give more documents")
    val = pack(tokenizer, splits["val"], cfg.seq_len, cfg.eval_sequences, cfg.seed)
    return train, val


def check_weights(cfg: TrainConfig, record: dict) -> None:
    """`data_weights` name the data's own sources and give one of them a share (a name the data does not have would
    leave every share 0, or a part of the data at none without a word)."""
    if not cfg.data_weights:
        return
    sources = sorted(record["splits"]["train"]["by_source"])
    unknown = sorted(set(cfg.data_weights) - set(sources))
    if unknown:
        raise ReskipError(f"data_weights names {', '.join(map(repr, unknown))}, which the data does not have; its "
                          f"sources are {', '.join(sources)}")
    if not any(cfg.data_weights.get(s, 0) > 0 for s in sources):
        raise ReskipError(f"data_weights gives every source of the data weight 0 ({cfg.data_weights})")


def parameter_groups(model: ReskipModel, cfg: TrainConfig) -> list[dict]:
    """The side-channel's parameters in its optimizer groups (`RetrofitTrainee.parameter_groups`)."""
    return RetrofitTrainee(model, cfg).parameter_groups(cfg)


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
    trainee: Trainee
    objective: torch.nn.Module  # the trainee's, as the engine prepared it
    optimizer: torch.optim.Optimizer
    train_data: Packed
    val_data: Packed
    files: RunFolder
    builder: object = RETROFIT
    step: int = 0
    tokens_seen: int = 0
    teacher_states: dict = field(default_factory=dict)  # the backbone's final hidden states on val_data, kept

    @property
    def model(self):
        return self.trainee.model

    @property
    def main(self) -> bool:
        return self.accelerator.is_main_process

    def log(self, rec: dict) -> None:
        if self.main:
            append_record(self.files.train_log, rec)
            if self.cfg.report_to:
                self.accelerator.log(scalars(rec), step=rec["step"])


TRAINING_FILES = ("config", "train_log", "checkpoints", "adapter", "summary")  # `RunFolder` names a run's training owns


def check_identity(cfg: TrainConfig, files: RunFolder, resume: bool, overwrite: bool, remove: bool = True,
                   builder=None) -> None:
    """Refuse to train over another run (unless `overwrite`: its training files are removed), and to resume a
    run with settings that contradict its own config.yaml."""
    builder = builder or RETROFIT
    if resume:
        if not files.config.is_file():
            raise ReskipError(f"{files.root} is not a training run folder (no config.yaml): nothing to resume")
        ours, asked = builder.recorded_identity(files.config), builder.identity(cfg)  # the retrofit keys resolved
        ours["dtype"] = resolve_dtype_name(ours["dtype"])
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
    foreign = not_written_by_training(files, builder)
    if foreign:
        raise ReskipError(f"{files.root} holds files that are not a reskip training run's ({', '.join(foreign[:5])}): "
                          "--overwrite removes only a run's own files; move those away or choose another --out")
    for path in held if remove else ():  # one process removes them
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


OWN_ADAPTER_FILES = {ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, CARD_NAME}
# what a process killed while writing a checkpoint leaves: `checkpoint.save_checkpoint`'s `.tmp-step-N` folder and
# `io_atomic`'s temporaries (of the pointer, a checkpoint, or that folder): the run's own too
OWN_TEMPORARY = re.compile(r"\.tmp-step-\d{6}|\.(latest|step-\d{6}|\.tmp-step-\d{6})\..+\.(tmp|old)")


def not_written_by_training(files: RunFolder, builder=None) -> list[str]:
    """The paths among a folder's training files that training did not write (a config.yaml that is not this
    recipe's, anything in checkpoints/ or adapter/ but the run's own), which --overwrite must not remove."""
    out = []
    if files.config.is_file():
        try:
            (builder or RETROFIT).recorded_identity(files.config)
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


def _engine(cfg: TrainConfig, run_dir: Path, builder) -> Accelerator:
    """The distributed engine for this process, after the checks that need its process count (the config's and
    the recipe's own, sharding's)."""
    # cpu=True on the CPU: under torchrun this gives gloo data-parallel on CPU processes; on CUDA each process
    # takes its local rank's GPU (one process: the one --device names).
    check_launch()
    device = training_device(cfg.device)
    accelerator = Accelerator(gradient_accumulation_steps=cfg.grad_accum, cpu=device.type == "cpu",
                              log_with=cfg.report_to, project_dir=run_dir if cfg.report_to else None)
    cfg.validate(world_size=accelerator.num_processes)
    builder.check(cfg)
    if cfg.shard and accelerator.num_processes < 2:
        raise ReskipError("--shard splits the backbone over several processes: launch with torchrun --nproc_per_node N "
                          "or accelerate launch --multi_gpu --num_processes N")
    if cfg.shard and cfg.retrofit_config().inner_lora:
        raise ReskipError("--shard keeps the decoder layers frozen and sharded: it does not train a LoRA inside them "
                          "(inner_lora)")
    return accelerator


def open_training(cfg: TrainConfig, run_dir: Path, resume: bool, show_progress: bool,
                  overwrite: bool = False, builder=None) -> TrainingRun:
    """Check the config, load the backbone and data, build the model, objective and optimizer (restored from
    the last checkpoint on `resume`), and write config.yaml and splits.json."""
    builder = builder or RETROFIT
    accelerator = _engine(cfg, run_dir, builder)
    # config.yaml, the adapter and a resumed run keep the dtype 'auto' resolved to on this hardware
    asked, cfg = cfg.dtype, dataclasses.replace(cfg, dtype=resolve_dtype_name(cfg.dtype, accelerator.device))
    files = RunFolder(run_dir)
    check_identity(cfg, files, resume, overwrite, remove=accelerator.is_main_process, builder=builder)
    splits, record = load_splits(cfg.data)  # cheap; an empty data set fails here, before the model
    check_weights(cfg, record)
    if builder.adds_side_channel:  # the retrofit's blocks and skip branch against the backbone's config
        check_against_backbone(cfg)
    else:  # a recipe that adds no side-channel: only the sequence length against the backbone's positions
        cfg.check_against_model(load_config(cfg.model, cfg.trust_remote_code), n_blocks=None)
    torch.manual_seed(cfg.seed)
    if accelerator.is_main_process and show_progress:
        print(f"[train] {builder.name}: {cfg.steps} steps x {cfg.batch_size} x {cfg.seq_len} tokens, backbone in "
              f"{describe(asked)}", flush=True)
    # sharded: loaded on the host, then each layer's shard goes to this process's device
    base, tokenizer = load_backbone(cfg.model, cfg.dtype, cfg.trust_remote_code,
                                    "cpu" if cfg.shard else accelerator.device)
    if cfg.shard:
        shard_backbone(base, accelerator.device)
    train_data, val_data = prepare_data(cfg, tokenizer, splits)
    trainee = builder.build(base, cfg, val_data, tokenizer=tokenizer, train_docs=splits["train"])
    optimizer = torch.optim.AdamW(trainee.parameter_groups(cfg), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start, tokens_seen = 0, 0
    if resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise ReskipError(f"{run_dir} has no checkpoint to resume from")
        if checkpoints_dir(run_dir).is_symlink():
            raise ReskipError(f"{checkpoints_dir(run_dir)} is a link: a run resumes from its own checkpoints only; "
                              "remove the link, or train into another --out")
        state = load_checkpoint(ckpt, trainee, optimizer, builder.identity(cfg))
        start = state["step"]
        tokens_seen = state["tokens_seen"] if state["tokens_seen"] is not None else start * cfg.batch_size * cfg.seq_len
        if not 0 < start <= cfg.steps:
            raise ReskipError(f"{ckpt} is at step {start}, outside this run's 1..{cfg.steps}: it is not this run's "
                              "checkpoint; train into another --out")
    objective = trainee.objective
    if cfg.shard:  # no DDP around sharded layers: the side-channel's gradients are averaged by `average_gradients`
        optimizer = accelerator.prepare(optimizer)
    else:
        objective, optimizer = accelerator.prepare(objective, optimizer)
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(files.config, builder.config_text(cfg))
        record["packed"] = {"train_sequences": len(train_data), "val_sequences": len(val_data), "seq_len": cfg.seq_len}
        atomic_write_json(files.splits, record)
        if resume:
            truncate_after(files.train_log, start)
        elif files.train_log.exists():
            files.train_log.unlink()
    if cfg.report_to:
        accelerator.init_trackers(TRACKER_RUN, config=hyperparameters(cfg.to_dict()))
    return TrainingRun(cfg, accelerator, trainee, objective, optimizer, train_data, val_data, files, builder, start,
                       tokens_seen)


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
    cfg, step = run.cfg, run.step
    if not run.main and not cfg.shard:  # sharded layers run only when every process runs them
        return 0.0
    t0 = time.time()
    bar = Progress(len(run.val_data), f"validate at step {step}", unit="seq", enabled=show)
    metrics = run.trainee.validate(run.val_data, step, cfg, run.teacher_states, bar)
    bar.close()
    run.log({"kind": "eval", "step": step, **({"c": metrics.pop("c")} if "c" in metrics else {}),
             "tokens_seen": run.tokens_seen, **metrics})
    return time.time() - t0


def optimizer_step(run: TrainingRun, bar: Progress) -> dict:
    """One optimizer step at run.step (its micro-batches on every process); advances the run and returns the
    step's train record, its terms averaged over processes and micro-batches."""
    cfg, acc, step, trainee = run.cfg, run.accelerator, run.step, run.trainee
    world, rank = acc.num_processes, acc.process_index
    lr = learning_rate(step, cfg.steps, cfg.lr, cfg.warmup_frac, cfg.min_lr_frac)
    for group in run.optimizer.param_groups:
        group["lr"] = lr * group["lr_mult"]
    # The global batch of this step, the same on every process; data cycles when exhausted.
    idx = [(step * cfg.batch_size + j) % len(run.train_data) for j in range(cfg.batch_size)]
    ids, labels = run.train_data.input_ids[idx], run.train_data.labels[idx]
    plan = trainee.plan(step, cfg, tuple(ids.shape))  # c(t), the drawn block, ...: pure functions of the step
    if plan.batch is not None:  # the trainee's own batch this step (the student's samples)
        ids, labels = plan.batch
    counts = Counts(max(1, int((labels[:, 1:] != -100).sum())), ids.numel(), world, cfg.grad_accum)  # on the host
    ids, labels = ids.to(acc.device), labels.to(acc.device)
    micro = cfg.batch_size // (world * cfg.grad_accum)
    totals = torch.zeros(len(trainee.terms), device=acc.device)
    for m in range(cfg.grad_accum):
        lo = (m * world + rank) * micro
        with acc.accumulate(run.objective):
            terms = trainee.micro(run.objective, ids[lo : lo + micro], labels[lo : lo + micro], plan, lo, micro, counts)
            bad = (~torch.isfinite(terms["loss"].detach())).float().reshape(1)
            if acc.reduce(bad, "sum").item() > 0:  # every process stops together
                bar.close()
                last = latest_checkpoint(run.files.root)
                raise TrainingDiverged(
                    f"loss became {terms['loss'].item()} at step {step} ({_plan_text(plan)}lr={lr:.2e}); the run "
                    f"stopped. Last good checkpoint: {last or 'none'}. Lower --lr or --lambda-kl and resume."
                )
            acc.backward(terms["loss"])
            if acc.sync_gradients and cfg.shard:
                average_gradients(trainee.trainable_parameters())
            if acc.sync_gradients:
                acc.clip_grad_norm_(trainee.trainable_parameters(), cfg.clip_norm)
            run.optimizer.step()
            run.optimizer.zero_grad()
        totals += torch.stack([terms[x].detach().float() for x in trainee.terms])
    values = dict(zip(trainee.terms, (acc.reduce(totals, "sum") / (world * cfg.grad_accum)).tolist()))
    run.tokens_seen += ids.numel()
    run.step = step + 1
    names = trainee.record_names()
    record = {"kind": "train", "step": run.step, **{k: v for k, v in plan.record.items() if k == "c"}, "lr": lr,
              **{names[k]: values[k] for k in trainee.terms if k in names},
              **{k: v for k, v in plan.record.items() if k != "c"}}
    return {**record, "tokens_seen": run.tokens_seen, "processes": world}


def _plan_text(plan) -> str:
    return f"c={plan.record['c']:.3f}, " if "c" in plan.record else ""


def finish(run: TrainingRun, wall_s: float) -> dict:
    """The trainee's final files (adapter/) and summary.json; returns the summary."""
    summary = {}
    if run.main:
        summary = run.trainee.finish(run.files.adapter, run.cfg, run.files.train_log, wall_s,
                                     device_name(run.accelerator.device), run.tokens_seen)
        atomic_write_json(run.files.summary, summary)
    if run.cfg.report_to:
        run.accelerator.end_training()
    run.accelerator.wait_for_everyone()
    return summary
