"""Training a baseline: a parameter-matched LoRA on the frozen backbone, or on the backbone with its cheapest
blocks removed (healed static pruning), with plain next-token cross-entropy and the recipe's loss mask.

Everything a user would do instead gets what the recipe gets: the same packed training and validation
sequences (`train.loop.prepare_data`), the same batch at every step, the same schedule (`train.schedules`:
warm-up, cosine decay), optimizer (AdamW), clipping and compute dtype. Only the method differs.

The run folder: config.yaml (the training config and the LoRA's), train_log.jsonl, checkpoints/ (the newest
two), adapter/ (a PEFT folder: adapter_config.json + adapter_model.safetensors) and summary.json.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import PeftModel, set_peft_model_state_dict
from safetensors.torch import load_file

from ..backbones.devices import device_name, model_device
from ..backbones.dtypes import resolve_dtype_name
from ..backbones.loading import load_backbone
from ..data.packing import Packed
from ..data.sources import load_splits
from ..errors import ReskipError
from ..io_atomic import atomic_folder, atomic_write_json, atomic_write_text
from .. import compat
from ..losses import ce_sum, ce_tokens, head_ce
from ..progress import Progress
from ..reading import read_json
from ..run_lock import writing
from ..runs import RunFolder
from ..train_config import TrainConfig
from ..train.log import append_record, last_eval, read_log, records, truncate_after
from ..train.checkpoint import latest_checkpoint
from ..train.loop import check_against_backbone, prepare_data
from ..train.schedules import learning_rate
from ..lora_ranks import matched_lora_config
from .arms import LoraArm, arm_config_text, read_arm
from .lora import add_lora, trainable_parameters
from .pruning import prune

STATE_NAME = "trainer_state.pt"


@torch.no_grad()
def sequence_nll(model, data: Packed, batch_size: int = 4) -> tuple[list[float], list[int]]:
    """Per sequence: the next-token NLL summed over its labelled targets (float32), and their count."""
    was = model.training
    model.eval()
    nll, targets = [], []
    for ids, labels in data.batches(batch_size, model_device(model)):
        per = ce_tokens(model(input_ids=ids, use_cache=False).logits, labels)  # (B, T)
        nll += per.double().sum(-1).tolist()
        targets += (labels[:, 1:] != -100).sum(-1).tolist()
    model.train(was)
    return nll, targets


def perplexity(nll: list[float], targets: list[int]) -> float:
    return math.exp(sum(nll) / sum(targets))


@dataclass
class LoraRun:
    cfg: TrainConfig
    arm: LoraArm
    model: PeftModel
    optimizer: torch.optim.Optimizer
    train_data: Packed
    val_data: Packed
    files: RunFolder
    accounting: dict
    step: int = 0
    ppl_backbone: float | None = None


def train_lora(cfg: TrainConfig, arm: LoraArm, run_dir: Path, show_progress: bool = True) -> dict:
    """Train the arm into `run_dir`; a finished run with the same config is returned as it is, a stopped one
    resumed from its newest checkpoint. Returns summary.json's content."""
    files = RunFolder(run_dir)
    cfg = dataclasses.replace(cfg, dtype=resolve_dtype_name(cfg.dtype))
    text = arm_config_text(cfg, arm)
    if files.config.is_file():
        old_cfg, old_arm = read_arm(files.root)  # compared as configs: a field added since reads as its default
        if old_cfg.what_it_trains() != cfg.what_it_trains() or old_arm != arm:
            raise ReskipError(f"{files.root} holds a baseline run of other settings (its config.yaml differs): "
                              "choose another folder or remove it")
        if files.summary.is_file() and (files.adapter / "adapter_model.safetensors").is_file():
            return read_json(files.summary)
    cfg.validate()
    check_against_backbone(cfg)
    splits, _ = load_splits(cfg.data)
    with writing(files.root):
        return _train(cfg, arm, files, splits, text, show_progress)


def _train(cfg: TrainConfig, arm: LoraArm, files: RunFolder, splits, text: str, show_progress: bool) -> dict:
    run = _open(cfg, arm, files, splits)
    files.root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(files.config, text)
    _resume(run)
    if run.step == 0:
        _validate(run)
    bar = Progress(cfg.steps, "lora", initial=run.step, enabled=show_progress)
    t0 = time.time()
    while run.step < cfg.steps:
        rec = _optimizer_step(run)
        rec["elapsed_s"] = time.time() - t0
        append_record(files.train_log, rec)
        bar.update(1, loss=f"{rec['ce']:.3f}")
        if run.step % cfg.eval_every == 0 or run.step == cfg.steps:
            _validate(run)
        if run.step % cfg.save_every == 0 or run.step == cfg.steps:
            _save_checkpoint(run)
    bar.close()
    last = last_eval(files.train_log)
    if last is None or last["step"] != cfg.steps:  # resumed at its end with the last validation's line lost
        _validate(run)
    return _finish(run, time.time() - t0)


def _open(cfg: TrainConfig, arm: LoraArm, files: RunFolder, splits) -> LoraRun:
    torch.manual_seed(cfg.seed)
    base, tokenizer = load_backbone(cfg.model, cfg.dtype, cfg.trust_remote_code, cfg.device)
    train_data, val_data = prepare_data(cfg, tokenizer, splits)
    ppl_backbone = perplexity(*sequence_nll(base, val_data, 1))
    if arm.drop_layers:
        prune(base, set(arm.drop_layers))
    lora_config, accounting = matched_lora_config(base, arm.params)
    model = add_lora(base, lora_config)
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=cfg.lr, weight_decay=cfg.weight_decay)
    return LoraRun(cfg, arm, model, optimizer, train_data, val_data, files, accounting, ppl_backbone=ppl_backbone)


def _optimizer_step(run: LoraRun) -> dict:
    """One optimizer step: the recipe's batch of this step, its micro-batches, CE over the labelled targets."""
    cfg, step = run.cfg, run.step
    lr = learning_rate(step, cfg.steps, cfg.lr, cfg.warmup_frac, cfg.min_lr_frac)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    idx = [(step * cfg.batch_size + j) % len(run.train_data) for j in range(cfg.batch_size)]
    ids, labels = run.train_data.input_ids[idx], run.train_data.labels[idx]
    n_targets = max(1, int((labels[:, 1:] != -100).sum()))
    ids, labels = ids.to(model_device(run.model)), labels.to(model_device(run.model))
    micro = cfg.batch_size // cfg.grad_accum
    total = 0.0
    run.model.train()
    body, head = compat.decoder_body(run.model.get_base_model()), compat.output_head(run.model.get_base_model())
    for m in range(cfg.grad_accum):
        sl = slice(m * micro, (m + 1) * micro)
        # the recipe's head: CE a chunk of positions at a time (`losses.head_ce`), so both methods pay the same
        # for the LM head; whole logits with loss_chunk null
        if cfg.loss_chunk:
            h = body(input_ids=ids[sl], use_cache=False).last_hidden_state  # (b, T, d), through the LoRA layers
            loss = head_ce(h, head, labels[sl], cfg.loss_chunk) / n_targets
        else:
            loss = ce_sum(run.model(input_ids=ids[sl], use_cache=False).logits, labels[sl]) / n_targets
        if not torch.isfinite(loss):
            raise ReskipError(f"loss became {loss.item()} at step {step} (lr={lr:.2e}): lower --lr")
        loss.backward()
        total += loss.item()
    torch.nn.utils.clip_grad_norm_(trainable_parameters(run.model), cfg.clip_norm)
    run.optimizer.step()
    run.optimizer.zero_grad()
    run.step = step + 1
    return {"kind": "train", "step": run.step, "lr": lr, "ce": total, "loss": total,
            "tokens_seen": run.step * cfg.batch_size * cfg.seq_len}


def _validate(run: LoraRun) -> None:
    nll, targets = sequence_nll(run.model, run.val_data, 1)
    append_record(run.files.train_log, {"kind": "eval", "step": run.step, "ppl_full": perplexity(nll, targets),
                                        "ppl_backbone": run.ppl_backbone,
                                        "tokens_seen": run.step * run.cfg.batch_size * run.cfg.seq_len})


def _save_checkpoint(run: LoraRun) -> None:
    root = run.files.checkpoints

    def write(tmp: Path) -> None:
        run.model.save_pretrained(tmp)
        torch.save({"step": run.step, "optimizer": run.optimizer.state_dict()}, tmp / STATE_NAME)

    final = atomic_folder(root / f"step-{run.step:06d}", write)
    atomic_write_text(root / "latest", final.name)
    for old in sorted(p for p in root.glob("step-*") if p != final)[:-1]:
        shutil.rmtree(old)


def _resume(run: LoraRun) -> None:
    ckpt = latest_checkpoint(run.files.root, STATE_NAME)
    if ckpt is None:
        if run.files.train_log.exists():
            run.files.train_log.unlink()
        return
    set_peft_model_state_dict(run.model, load_file(ckpt / "adapter_model.safetensors"))
    state = torch.load(ckpt / STATE_NAME, weights_only=True, map_location="cpu")  # the optimizer moves it to its parameters
    run.optimizer.load_state_dict(state["optimizer"])
    if not 0 < state["step"] <= run.cfg.steps:
        raise ReskipError(f"{ckpt} is at step {state['step']}, outside this run's 1..{run.cfg.steps}: remove the "
                          f"folder {run.files.root} to train the arm anew")
    run.step = state["step"]
    truncate_after(run.files.train_log, run.step)


def _finish(run: LoraRun, wall_s: float) -> dict:
    log = read_log(run.files.train_log) or []
    evals, trains = records(log, "eval"), records(log, "train")
    summary = {"steps": run.step, "tokens_seen": run.step * run.cfg.batch_size * run.cfg.seq_len,
               "wall_s_process": wall_s, "train_wall_s": trains[-1]["elapsed_s"] if trains else 0.0,
               "ppl_backbone": run.ppl_backbone,
               "ppl_full": {"start": evals[0]["ppl_full"], "end": evals[-1]["ppl_full"]},
               "lora": run.accounting, "drop_layers": run.arm.drop_layers, "drop_blocks": run.arm.drop_blocks,
               "lr": run.cfg.lr, "dtype": run.cfg.dtype, "device": device_name(model_device(run.model))}
    atomic_folder(run.files.adapter, lambda tmp: run.model.save_pretrained(tmp))
    atomic_write_json(run.files.summary, summary)
    return summary
