"""Training the side-channel: CE(full) + lambda_kl KL(teacher || skip) - lambda_ent H(alpha).

Runs on one process, or data-parallel under `accelerate launch` with no code change.
Everything that varies per step (c(t), learning rate, drawn block, batch) is a pure
function of the step and the seed, so a resumed run continues exactly.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import torch
from accelerate import Accelerator
from torch import nn
from tqdm.auto import tqdm

from .adapter_io import save_adapter
from .backbones import load_backbone, load_config
from .blocks import partition_layers
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .data.packing import Packed, pack
from .data.sources import load_splits
from .errors import ReskipError
from .io_atomic import atomic_write_json, atomic_write_text
from .losses import ce_sum, entropy_sum, kl_sum, teacher_targets
from .model import ReskipModel, retrofit
from .schedules import curriculum, drawn_block, learning_rate
from .train_config import TrainConfig


class TrainingDiverged(ReskipError):
    pass


class RetrofitObjective(nn.Module):
    """One micro-batch of the three-term loss. Wrapping it (not the model) in DDP keeps the
    teacher, full and skip passes inside a single forward, so gradients sync once."""

    def __init__(self, model: ReskipModel, lambda_kl: float, lambda_ent: float):
        super().__init__()
        self.model = model
        self.lambda_kl = lambda_kl
        self.lambda_ent = lambda_ent

    def forward(self, input_ids, labels, skip_block: int, target_scale: float, position_scale: float):
        """Loss terms as sums over this micro-batch times the given scales (1 / global counts)."""
        rm = self.model
        with torch.no_grad(), rm.side_channel_disabled(), rm.capturing() as captured:
            teacher = teacher_targets(rm(input_ids=input_ids, use_cache=False).logits)  # p: (B, T, V)
            teacher_pass = captured()
        # Block 1 has no side-channel: its output h_1 is the teacher's, so it is not rerun.
        with rm.capturing() as captured, rm.continuing(teacher_pass, 1):
            full = rm(input_ids=input_ids, use_cache=False, output_alphas=True)
            cap = captured()
        # Skip branch: blocks before `skip_block` are the full pass's own (shared, not recomputed).
        with rm.replaying(cap, skip_block):
            skip = rm(input_ids=input_ids, use_cache=False).logits
        ce = ce_sum(full.logits, labels) * target_scale
        kl = kl_sum(teacher, skip) * position_scale
        ent = entropy_sum(full.alphas) * position_scale
        loss = ce + self.lambda_kl * kl - self.lambda_ent * ent
        return {"loss": loss, "ce": ce.detach(), "kl": kl.detach(), "ent": ent.detach()}


def _append_jsonl(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def _truncate_log(path: Path, step: int) -> None:
    """On resume, drop log records after the checkpoint so the log reads as one run."""
    if path.exists():
        keep = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= step]
        atomic_write_text(path, "".join(line + "\n" for line in keep))


def prepare_data(cfg: TrainConfig, tokenizer, splits) -> tuple[Packed, Packed]:
    n_train = cfg.steps * cfg.batch_size
    train = pack(tokenizer, splits["train"], cfg.seq_len, n_train, cfg.seed, cfg.data_weights)
    if not splits["val"]:
        raise ReskipError("the validation split is empty: give more documents")
    val = pack(tokenizer, splits["val"], cfg.seq_len, cfg.eval_sequences, cfg.seed)
    return train, val


def train(
    cfg: TrainConfig,
    run_dir: Path,
    resume: bool = False,
    on_step_end: Callable[[int, ReskipModel], None] | None = None,
    show_progress: bool = True,
) -> dict:
    """Train into `run_dir` (config.yaml, splits.json, train_log.jsonl, checkpoints/, adapter/, summary.json)."""
    from .validation import evaluate

    # cpu=True when there is no GPU: under torchrun this gives gloo data-parallel on CPU processes.
    accelerator = Accelerator(gradient_accumulation_steps=cfg.grad_accum, cpu=not torch.cuda.is_available())
    world, rank = accelerator.num_processes, accelerator.process_index
    cfg.validate(world_size=world)
    run_dir = Path(run_dir)
    log_path = run_dir / "train_log.jsonl"
    splits, record = load_splits(cfg.data)  # cheap; an empty data set fails here, before the model
    model_config = load_config(cfg.model, cfg.trust_remote_code)
    rcfg = cfg.retrofit_config()
    n_blocks = len(partition_layers(model_config.num_hidden_layers, rcfg.block_size, rcfg.boundaries))
    cfg.check_against_model(model_config, n_blocks)
    drawable = cfg.drawable_blocks(n_blocks)

    torch.manual_seed(cfg.seed)
    base, tokenizer = load_backbone(cfg.model, getattr(torch, cfg.dtype), cfg.trust_remote_code)
    model = retrofit(base, rcfg, seed=cfg.seed)
    train_data, val_data = prepare_data(cfg, tokenizer, splits)
    optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    start, tokens_seen = 0, 0
    if resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise ReskipError(f"{run_dir} has no checkpoint to resume from")
        state = load_checkpoint(ckpt, model, optimizer)
        start, tokens_seen = state["step"], state["tokens_seen"]
    objective = RetrofitObjective(model, cfg.lambda_kl, cfg.lambda_ent)
    objective, optimizer = accelerator.prepare(objective, optimizer)
    main = accelerator.is_main_process
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / "config.yaml", cfg.to_yaml())
        record["packed"] = {"train_sequences": len(train_data), "val_sequences": len(val_data), "seq_len": cfg.seq_len}
        atomic_write_json(run_dir / "splits.json", record)
        if resume:
            _truncate_log(log_path, start)
        elif log_path.exists():
            log_path.unlink()

    def log(rec):
        if main:
            _append_jsonl(log_path, rec)

    def run_eval(step):
        if main:
            model.set_curriculum(curriculum(step, cfg.steps, cfg.hold_frac, cfg.ramp_end_frac))
            log({"kind": "eval", "step": step, "c": model.side_channel.curriculum, "tokens_seen": tokens_seen,
                 **evaluate(model, val_data, batch_size=max(1, cfg.batch_size // max(1, cfg.grad_accum)))})

    if start == 0:
        run_eval(0)
    micro = cfg.batch_size // (world * cfg.grad_accum)
    n_train = len(train_data)
    bar = tqdm(total=cfg.steps, initial=start, disable=not (main and show_progress), desc="train", unit="step")
    t0 = time.time()
    for step in range(start, cfg.steps):
        c = curriculum(step, cfg.steps, cfg.hold_frac, cfg.ramp_end_frac)
        lr = learning_rate(step, cfg.steps, cfg.lr, cfg.warmup_frac, cfg.min_lr_frac)
        model.set_curriculum(c)
        for group in optimizer.param_groups:
            group["lr"] = lr
        k = drawn_block(step, cfg.seed, drawable)
        # The global batch of this step, the same on every process; data cycles when exhausted.
        idx = [(step * cfg.batch_size + j) % n_train for j in range(cfg.batch_size)]
        ids, labels = train_data.input_ids[idx], train_data.labels[idx]
        n_targets = int((labels[:, 1:] != -100).sum())
        # Each micro-batch contributes sum / global count; DDP averages over processes and
        # accelerate divides by grad_accum, hence the factor world * grad_accum.
        target_scale = world * cfg.grad_accum / max(n_targets, 1)
        position_scale = world * cfg.grad_accum / ids.numel()
        totals = torch.zeros(4)
        for m in range(cfg.grad_accum):
            lo = (m * world + rank) * micro
            with accelerator.accumulate(objective):
                terms = objective(ids[lo : lo + micro], labels[lo : lo + micro], k, target_scale, position_scale)
                bad = (~torch.isfinite(terms["loss"].detach())).float().reshape(1)
                if accelerator.reduce(bad, "sum").item() > 0:  # every process stops together
                    bar.close()
                    last = latest_checkpoint(run_dir)
                    raise TrainingDiverged(
                        f"loss became {terms['loss'].item()} at step {step} (c={c:.3f}, lr={lr:.2e}); the run "
                        f"stopped. Last good checkpoint: {last or 'none'}. Lower --lr or --lambda-kl and resume."
                    )
                accelerator.backward(terms["loss"])
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.trainable_parameters(), cfg.clip_norm)
                optimizer.step()
                optimizer.zero_grad()
            totals += torch.stack([terms[x].float() for x in ("loss", "ce", "kl", "ent")])
        totals = accelerator.reduce(totals, "sum") / (world * cfg.grad_accum)
        tokens_seen += ids.numel()
        done = step + 1
        loss, ce, kl, ent = totals.tolist()
        if done % cfg.log_every == 0 or done == cfg.steps:
            log({"kind": "train", "step": done, "c": c, "lr": lr, "loss": loss, "ce": ce, "kl": kl,
                 "entropy": ent, "skip_block": k, "tokens_seen": tokens_seen, "processes": world, "elapsed_s": time.time() - t0})
        bar.set_postfix(loss=f"{loss:.3f}", ce=f"{ce:.3f}", kl=f"{kl:.3f}", c=f"{c:.2f}")
        bar.update(1)
        if done % cfg.eval_every == 0 or done == cfg.steps:
            run_eval(done)
        if done % cfg.save_every == 0 or done == cfg.steps:
            if main:
                save_checkpoint(run_dir, done, model, optimizer, tokens_seen)
            accelerator.wait_for_everyone()
        if on_step_end is not None:
            on_step_end(done, model)
    bar.close()
    summary = {}
    if main:
        model.set_curriculum(1.0 if cfg.steps else 0.0)
        save_adapter(model, run_dir / "adapter", metadata={"steps": cfg.steps, "tokens_seen": tokens_seen})
        summary = summarize(log_path, wall_s=time.time() - t0)
        atomic_write_json(run_dir / "summary.json", summary)
    accelerator.wait_for_everyone()
    return summary


def summarize(log_path: Path, wall_s: float) -> dict:
    """First and last evaluation side by side (read from the log only)."""
    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    trains = [r for r in records if r["kind"] == "train"]
    first, last = evals[0], evals[-1]
    return {
        "steps": trains[-1]["step"] if trains else 0,
        "tokens_seen": last["tokens_seen"],
        "wall_s_this_session": wall_s,
        "ppl_backbone": last["ppl_backbone"],
        "ppl_full": {"start": first["ppl_full"], "end": last["ppl_full"]},
        "kl_full": {"start": first["kl_full"], "end": last["kl_full"]},
        "entropy": {"start": first["entropy"], "end": last["entropy"], "max": last["entropy_max"]},
        "skip_kl": {"start": first.get("skip_kl"), "end": last.get("skip_kl")},
    }


def format_summary(s: dict) -> str:
    lines = [
        f"steps {s['steps']}, tokens {s['tokens_seen']:,}, wall {s['wall_s_this_session']:.0f} s",
        f"validation perplexity: backbone {s['ppl_backbone']:.3f} | retrofit {s['ppl_full']['start']:.3f} -> "
        f"{s['ppl_full']['end']:.3f}   KL(backbone||retrofit) {s['kl_full']['end']:.4f}",
        "block  entropy start -> end (max log n)   skip-branch KL start -> end",
    ]
    for n in sorted(s["skip_kl"]["end"] or {}, key=int):
        e0, e1, em = (s["entropy"][x].get(n) for x in ("start", "end", "max"))
        ent = f"{e0:.3f} -> {e1:.3f} ({em:.3f})" if e0 is not None else "-  (no router)"
        lines.append(f"{n:>5}  {ent:<32} {s['skip_kl']['start'][n]:.4f} -> {s['skip_kl']['end'][n]:.4f}")
    return "\n".join(lines)

