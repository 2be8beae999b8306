"""What the one training loop (`train.loop`) trains: a *trainee*. The loop owns everything a run has whatever it
trains (the run folder's identity, resume, checkpoints, the log, progress, the schedule of the learning rate, the
batches, data-parallel, FSDP2, trackers, the summary's file); a trainee owns what is its own (torchtune's recipe
interface is the model: one shape, several trainees):

- `model`, `objective` (the nn.Module the engine wraps: one micro-batch's loss terms), its trainable parameters in
  optimizer groups, the step's plan (what varies per step beside the batch: a pure function of the step and seed);
- its validation record, its summary, its final files (adapter/), and the weights a checkpoint holds.

A *builder* makes a trainee from the loaded backbone and says what identifies its runs (what config.yaml holds).
Two builders: the retrofit (`RetrofitBuilder`: the side-channel, the source design's three-term objective) and a LoRA
on the frozen backbone, with or without layers removed (`compress.trainee.LoraBuilder`: healing by `ce`, `kd`,
`kd+ce`). A new trained method adds a builder (and its row in `skip.spec.KINDS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from torch import nn

from ..ar_retrofit.adapter_io import check_backbone, read_adapter_config, read_adapter_weights, save_adapter
from ..ar_retrofit.model import ReskipModel, retrofit
from ..backbones.loading import DEFAULT_BACKBONE
from ..data.packing import Packed
from ..progress import Progress
from ..train_config import TrainConfig
from .log import summarize
from .objective import RetrofitObjective
from .schedules import curriculum, drawn_blocks, skipped_positions
from .validation import validation_metrics


@dataclass
class StepPlan:
    """What a trainee does at one step beside the batch: keyword arguments of its micro-batch call (tensors on the
    host; `Trainee.micro` moves them), the fields its step's record carries, and a batch of its own instead of the
    data's (ids, labels on the host; on-policy healing's samples), or None."""

    arguments: dict = field(default_factory=dict)
    record: dict = field(default_factory=dict)
    batch: tuple | None = None


class Trainee(Protocol):
    model: nn.Module
    objective: nn.Module
    terms: tuple[str, ...]  # the loss terms it reports per step, "loss" first (record names: `record_names`)

    def parameter_groups(self, cfg: TrainConfig) -> list[dict]: ...

    def trainable_parameters(self) -> list[nn.Parameter]: ...

    def plan(self, step: int, cfg: TrainConfig, batch_shape: tuple[int, ...]) -> StepPlan: ...

    def micro(self, objective: nn.Module, ids, labels, plan: StepPlan, lo: int, n: int, counts: "Counts") -> dict: ...

    def validate(self, data: Packed, step: int, cfg: TrainConfig, cache: dict, bar: Progress) -> dict: ...

    def save_weights(self, folder: Path, step: int) -> None: ...

    def load_weights(self, folder: Path) -> None: ...

    def finish(self, folder: Path, cfg: TrainConfig, log_path: Path, wall_s: float, device: str, tokens: int) -> dict: ...


@dataclass(frozen=True)
class Counts:
    """The step's global counts and the factor that makes each micro-batch's sum a share of the step's mean: DDP
    averages over `world` processes and the engine divides by `grad_accum`, hence sum * world * grad_accum / count."""

    targets: int  # labelled targets of the whole batch
    positions: int  # positions of the whole batch
    world: int
    grad_accum: int

    @property
    def target_scale(self) -> float:
        return self.world * self.grad_accum / max(self.targets, 1)

    @property
    def position_scale(self) -> float:
        return self.world * self.grad_accum / self.positions


class RetrofitBuilder:
    """Builds the source design's trainee: the side-channel on the frozen backbone, CE(full) + lambda_kl KL(teacher ||
    skip) - lambda_ent H(alpha) (+ the signal and local terms), config.yaml the TrainConfig itself."""

    name = "retrofit"
    adds_side_channel = True  # its blocks and skip branch are checked against the backbone's config

    def build(self, base: nn.Module, cfg: TrainConfig, val_data: Packed, tokenizer=None,
              train_docs: list | None = None) -> "RetrofitTrainee":
        return RetrofitTrainee(retrofit(base, cfg.retrofit_config(), seed=cfg.seed), cfg)

    def config_text(self, cfg: TrainConfig) -> str:
        return cfg.to_yaml()

    def recorded_identity(self, path: Path) -> dict:
        """The identity of the run whose config.yaml is `path` (an error if it is not this builder's)."""
        return self.identity(TrainConfig.from_file(path))

    def identity(self, cfg: TrainConfig) -> dict:
        """What must match for a run to be resumed or reused: what it trains (placement aside), resolved."""
        return cfg.what_it_trains()

    def check(self, cfg: TrainConfig) -> None:
        """What this builder refuses of a config beyond `TrainConfig.validate` (before any weights load)."""


class RetrofitTrainee:
    terms = ("loss", "ce", "kl", "ent", "sig", "local", "kd")

    def __init__(self, model: ReskipModel, cfg: TrainConfig):
        self.model = model
        self.objective = RetrofitObjective.of(model, cfg)
        self.cfg = cfg

    def trainable_parameters(self) -> list[nn.Parameter]:
        return self.model.trainable_parameters()

    def parameter_groups(self, cfg: TrainConfig) -> list[dict]:
        """The side-channel's parameters in three optimizer groups, chosen by structure (the routers' query and
        source-bias parameters, and everything else), each with its learning-rate multiple."""
        routers = self.model.side_channel.routers()
        query = [r.query for r in routers]
        bias = [r.source_bias for r in routers]
        chosen = {id(p) for p in query + bias}
        rest = [p for p in self.model.trainable_parameters() if id(p) not in chosen]
        return [{"params": query, "lr_mult": cfg.router_lr_mult, "name": "router query"},
                {"params": bias, "lr_mult": cfg.source_bias_lr_mult, "name": "router source bias"},
                {"params": rest, "lr_mult": 1.0, "name": "corrections and gates"}]

    def plan(self, step: int, cfg: TrainConfig, batch_shape: tuple[int, ...]) -> StepPlan:
        """c(t), the drawn block(s) and the skipped positions of this step: pure functions of the step and seed."""
        c = curriculum(step, cfg.steps, cfg.hold_frac, cfg.ramp_end_frac)
        self.model.set_curriculum(c)
        dropped = drawn_blocks(step, cfg.seed, cfg.drawable_blocks(self.model.n_blocks), cfg.skip_max_blocks)
        positions = skipped_positions(step, cfg.seed, batch_shape, cfg.skip_fraction)
        record = {"c": c, "skip_block": dropped[0], **({"skip_blocks": dropped} if cfg.skip_max_blocks > 1 else {})}
        return StepPlan({"k": dropped[0], "also": tuple(dropped[1:]), "positions": positions}, record)

    def micro(self, objective, ids, labels, plan: StepPlan, lo: int, n: int, counts: Counts) -> dict:
        positions = plan.arguments["positions"]
        mask = None if positions is None else positions[lo : lo + n].to(ids.device)
        return objective(ids, labels, plan.arguments["k"], counts.target_scale, counts.position_scale, mask,
                         plan.arguments["also"])

    def record_names(self) -> dict[str, str]:
        names = {"loss": "loss", "ce": "ce", "kl": "kl", "ent": "entropy", "sig": "signal_corr"}
        return {**names, **({"local": "local"} if self.cfg.lambda_local > 0 else {}),
                **({"kd": "kl_full_train"} if self.cfg.full_objective == "kd" else {})}

    def validate(self, data: Packed, step: int, cfg: TrainConfig, cache: dict, bar: Progress) -> dict:
        self.model.set_curriculum(curriculum(step, cfg.steps, cfg.hold_frac, cfg.ramp_end_frac))
        # With chunked losses (the memory-lean setting) validation scores one sequence at a time, so it holds
        # (1, T, V) logits, not the micro-batch's (B, T, V): otherwise it would set the run's peak.
        val_batch = 1 if cfg.loss_chunk else max(1, cfg.batch_size // max(1, cfg.grad_accum))
        skip_kl = cfg.skip_kl_curve or step in (0, cfg.steps)
        metrics = validation_metrics(self.model, data, batch_size=val_batch, skip_kl=skip_kl, teacher_states=cache,
                                     progress=bar.update)
        return {"c": self.model.side_channel.curriculum, **metrics}

    def save_weights(self, folder: Path, step: int) -> None:
        save_adapter(self.model, folder, metadata={"step": step})

    def load_weights(self, folder: Path) -> None:
        check_backbone(read_adapter_config(folder)["backbone"], self.model.base_model)
        self.model.load_adapter_state(read_adapter_weights(folder))

    def finish(self, folder: Path, cfg: TrainConfig, log_path: Path, wall_s: float, device: str, tokens: int) -> dict:
        """The final adapter (with its model card's figures); returns the summary."""
        self.model.set_curriculum(1.0 if cfg.steps else 0.0)
        summary = summarize(log_path, wall_s=wall_s)
        summary["device"] = device
        # What the adapter's model card tells (`ar_retrofit.model_card`), kept with it in adapter_config.json.
        card = {"model": cfg.model or DEFAULT_BACKBONE, "dtype": cfg.dtype, "device": device,
                "training": {"data": list(cfg.data), "data_weights": cfg.data_weights, "steps": cfg.steps,
                             "batch_size": cfg.batch_size, "seq_len": cfg.seq_len, "lr": cfg.lr},
                "measured": {"ppl_backbone": summary["ppl_backbone"], "ppl_start": summary["ppl_full"]["start"],
                             "ppl_end": summary["ppl_full"]["end"], "kl_end": summary["kl_full"]["end"]}}
        save_adapter(self.model, folder, metadata={"steps": cfg.steps, "tokens_seen": tokens, **card})
        return summary
