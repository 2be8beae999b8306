"""The LoRA builder of the one training loop: a parameter-matched PEFT LoRA on the frozen backbone, with the
backbone's chosen layers removed first (healed static pruning) or none (a plain LoRA), healed by `ce`, `kd` or
`kd+ce` (`compress.objectives`).

Everything a user would do instead gets what the retrofit gets: the same packed training and validation sequences,
the same batch at every step, the same schedule, optimizer (AdamW), clipping, compute dtype, checkpoints, resume,
log and progress (`train.loop`). Its run folder: config.yaml (`train:` the TrainConfig, `lora:` the HealingConfig),
train_log.jsonl, checkpoints/ (the newest two), adapter/ (a PEFT folder) and summary.json.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch
from peft import set_peft_model_state_dict
from safetensors.torch import load_file
from torch import nn

from .. import compat
from ..backbones.devices import model_device
from ..data.packing import Packed
from ..errors import ReskipError
from ..io_atomic import atomic_folder
from ..lora_ranks import matched_lora_config
from ..losses import ce_tokens, head_logits, kl_sum, teacher_targets
from ..progress import Progress
from ..train.log import read_log, records
from ..train.schedules import nested_depth
from ..train.trainee import Counts, StepPlan
from ..train_config import TrainConfig
from .blocks import prune_keeping
from .full_layers import layers_next_to_cut, train_in_float32
from .healing_files import write_trained_on
from .healing_run import HealingConfig, healing_config_text, read_healing_run
from .lora import add_lora, trainable_parameters
from .objectives import HealingObjective
from .on_policy import PromptPool, on_policy_step, prompt_pool, sampled_batch

ADAPTER_WEIGHTS = "adapter_model.safetensors"


class LoraBuilder:
    """A LoRA healing run (`HealingConfig`: the parameters to match, the layers to remove, the healing objective)."""

    name = "lora"
    adds_side_channel = False  # only its sequence length is checked against the backbone's positions

    def __init__(self, healing: HealingConfig):
        self.healing = healing

    def build(self, base: nn.Module, cfg: TrainConfig, val_data: Packed, tokenizer=None,
              train_docs: list | None = None) -> "LoraTrainee":
        # a nested healing run keeps every layer: its student leaves some out per step (`HealingObjective.student`)
        removed = prune_keeping(base, set(self.healing.drop_layers)) if self.healing.drop_layers else None
        full = (layers_next_to_cut(removed.n_layers, self.healing.drop_layers, self.healing.full_layers)
                if self.healing.full_layers else [])
        lora_config, accounting = matched_lora_config(base, self.healing.params, full)
        model = add_lora(base, lora_config)
        full_params = train_in_float32(model)
        accounting = {**accounting, "full_layers": full, "full_parameters": sum(p.numel() for p in full_params)}
        objective = HealingObjective(model, self.healing.objective, self.healing.temperature, cfg.loss_chunk, removed,
                                     self.healing.positions)
        pool = (prompt_pool(tokenizer, train_docs or [], cfg.seq_len - self.healing.on_policy_tokens)
                if self.healing.on_policy else None)
        return LoraTrainee(model, objective, self.healing, accounting, full_params, tokenizer, pool)

    def config_text(self, cfg: TrainConfig) -> str:
        return healing_config_text(cfg, self.healing)

    def identity(self, cfg: TrainConfig) -> dict:
        return {**cfg.what_it_trains(), "lora": dataclasses.asdict(self.healing)}

    def recorded_identity(self, path: Path) -> dict:
        cfg, healing = read_healing_run(path.parent)  # compared as configs: a field added since reads as its default
        return LoraBuilder(healing).identity(cfg)

    def check(self, cfg: TrainConfig) -> None:
        if cfg.shard:
            raise ReskipError("--shard keeps the decoder layers frozen and sharded: a LoRA trains inside them, so its "
                              "healing runs train data-parallel only")


class LoraTrainee:
    terms = ("loss", "ce", "kl")

    def __init__(self, model, objective: HealingObjective, healing: HealingConfig, accounting: dict,
                 full_params: list[nn.Parameter] = (), tokenizer=None, pool: PromptPool | None = None):
        self.model = model
        self.tokenizer, self.pool = tokenizer, pool  # the chat prompts the student answers on on-policy steps
        self.full_params = list(full_params)  # the layers trained in full: their own learning rate
        self.objective = objective
        self.healing = healing
        self.accounting = accounting

    def trainable_parameters(self) -> list[nn.Parameter]:
        return trainable_parameters(self.model)

    def parameter_groups(self, cfg: TrainConfig) -> list[dict]:
        full = {id(p) for p in self.full_params}
        lora = [p for p in self.trainable_parameters() if id(p) not in full]
        return [{"params": lora, "lr_mult": 1.0, "name": "lora"},
                *([{"params": self.full_params, "lr_mult": self.healing.full_lr_mult, "name": "full layers"}]
                  if self.full_params else [])]

    def plan(self, step: int, cfg: TrainConfig, batch_shape: tuple[int, ...]) -> StepPlan:
        self.model.train()  # validation leaves it in eval mode
        if self.pool is not None and on_policy_step(step, self.healing.on_policy):
            ids, labels = sampled_batch(self.model, self.tokenizer, self.pool, step, cfg.seed, cfg.batch_size,
                                        self.healing.on_policy_tokens)
            return StepPlan({"on_policy": True}, {"on_policy": 1, "sampled_tokens": int((labels != -100).sum())},
                            batch=(ids, labels))
        if not self.healing.nested:
            return StepPlan()
        depth = nested_depth(step, cfg.seed, self.healing.depths)
        return StepPlan({"drop": self.healing.layers_at(depth)}, {"depth": depth})

    def micro(self, objective, ids, labels, plan: StepPlan, lo: int, n: int, counts: Counts) -> dict:
        # divided by its count (not multiplied by 1 / count): with one process and no accumulation the loss is
        # ce_sum / n_targets, as the healing runs trained before the one loop computed it
        return objective(ids, labels, counts.targets / (counts.world * counts.grad_accum),
                         counts.positions / (counts.world * counts.grad_accum), plan.arguments.get("drop"),
                         plan.arguments.get("on_policy", False))

    def record_names(self) -> dict[str, str]:
        loss = self.objective.loss
        return {"loss": "loss", "ce": "ce", **({"kl": loss.record_name} if loss.needs_teacher else {})}

    def depths(self) -> list[int]:
        """The depths validation reads: a nested healing run's 1..K (their mean KL is `kl_full`, what its sweep chooses
        by); one depth (the model as it is) otherwise."""
        return list(range(1, self.healing.depths + 1)) if self.healing.nested else [0]

    @torch.no_grad()
    def validate(self, data: Packed, step: int, cfg: TrainConfig, cache: dict, bar: Progress) -> dict:
        """Perplexity on the validation split (the backbone's from the teacher's pass: `ppl_backbone`) and
        KL(backbone || model) per position: the teacher's final hidden states (1, T, d) computed once per sequence
        and kept, its logits reapplied by the head (the same operations as its forward). A nested healing run: at each
        depth (`ppl_depth`, `kl_depth`), their means as `ppl_full` (geometric) and `kl_full`."""
        model, base = self.model, self.model.get_base_model()
        was = model.training
        model.eval()
        per = {d: [0.0, 0, 0.0, 0] for d in self.depths()}  # depth -> [nll, targets, kl, positions]
        back = [0.0, 0]  # the backbone's nll and targets
        for i, (ids, labels) in enumerate(data.batches(1, model_device(model))):
            if i not in cache:
                with self.objective.teacher():
                    cache[i] = compat.decoder_body(base)(input_ids=ids, use_cache=False).last_hidden_state
            z_teacher = head_logits(cache[i], compat.output_head(base))  # (1, T, V): the backbone's logits
            # in the model's dtype, as its `.logits` and the student's below are read
            back[0] += ce_tokens(z_teacher.to(cache[i].dtype), labels).double().sum().item()
            back[1] += int((labels[:, 1:] != -100).sum())
            teacher = teacher_targets(z_teacher)  # p: (1, T, V)
            for depth, sums in per.items():
                with self.objective.student(self.healing.layers_at(depth) if self.healing.nested else None):
                    z = model(input_ids=ids, use_cache=False).logits  # (1, T, V)
                sums[0] += ce_tokens(z, labels).double().sum().item()
                sums[1] += int((labels[:, 1:] != -100).sum())
                sums[2] += kl_sum(teacher, z).item()
                sums[3] += ids.numel()
            bar.update(1)
        model.train(was)
        ppl = {d: math.exp(nll / t) for d, (nll, t, _, _) in per.items()}
        kl = {d: k / n for d, (_, _, k, n) in per.items()}
        out = {"ppl_full": math.exp(sum(math.log(p) for p in ppl.values()) / len(ppl)),
               "ppl_backbone": math.exp(back[0] / back[1]), "kl_full": sum(kl.values()) / len(kl)}
        if self.healing.nested:
            out.update(ppl_depth={str(d): p for d, p in ppl.items()}, kl_depth={str(d): k for d, k in kl.items()})
        return out

    def save_weights(self, folder: Path, step: int) -> None:
        self.model.save_pretrained(folder)

    def load_weights(self, folder: Path) -> None:
        set_peft_model_state_dict(self.model, load_file(folder / ADAPTER_WEIGHTS))

    def finish(self, folder: Path, cfg: TrainConfig, log_path: Path, wall_s: float, device: str, tokens: int) -> dict:
        log = read_log(log_path) or []
        evals, trains = records(log, "eval"), records(log, "train")
        summary = {"steps": trains[-1]["step"] if trains else 0, "tokens_seen": tokens, "wall_s_process": wall_s,
                   "train_wall_s": trains[-1]["elapsed_s"] if trains else 0.0, "ppl_backbone": evals[0]["ppl_backbone"],
                   "ppl_full": {"start": evals[0]["ppl_full"], "end": evals[-1]["ppl_full"]},
                   "kl_full": {"start": evals[0].get("kl_full"), "end": evals[-1].get("kl_full")},
                   "lora": self.accounting, "drop_layers": self.healing.drop_layers, "drop_blocks": self.healing.drop_blocks,
                   **({"nested_blocks": self.healing.nested_blocks, "kl_depth": evals[-1].get("kl_depth"),
                       "ppl_depth": evals[-1].get("ppl_depth")} if self.healing.nested else {}),
                   "objective": self.healing.objective, "temperature": self.healing.temperature, "lr": cfg.lr,
                   "dtype": cfg.dtype, "device": device}
        def write(tmp: Path) -> None:
            self.model.save_pretrained(tmp)
            write_trained_on(tmp, self.healing.drop_layers, self.healing.nested_layers)

        atomic_folder(folder, write)
        return summary
