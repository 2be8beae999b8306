"""A healing run's record and its loader: what `reskip experiment baselines` trains beside the recipe (a LoRA on
the frozen backbone, or on the backbone with layers removed: healed static pruning), how its config.yaml says so,
and how a healing run opens as a model (scoring: `evaluate.scorers`; export: `compress.export`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import yaml
from peft import PeftModel
from safetensors import SafetensorError

from ..backbones.loading import load_backbone, load_config
from ..config_fields import described
from ..errors import ReskipError
from ..reading import read_yaml
from ..run_folder import RunFolder
from ..train_config import TrainConfig, load_yaml
from .blocks import prune
from .healing_files import check_adapter_files, check_layers, check_loaded, typed_healing_config
from .objectives import parse_objective


@dataclass
class HealingConfig:
    """What a baseline trains, beside the shared TrainConfig (`TrainConfig.lr` etc.; its retrofit keys unused)."""

    params: int = described(help="trainable parameters to match (the side-channel's count on this backbone)",
                            default=0)
    drop_layers: list[int] = described(help="decoder layers removed before healing (empty: a plain LoRA)",
                                       default_factory=list)
    drop_blocks: list[int] = described(help="the blocks those layers form (for the record)", default_factory=list)
    objective: str = described("ce", "the healing objective, one of `compress.objectives.OBJECTIVES`: ce (cross-entropy "
                                     "on the mix), kd (KL(backbone || model), the backbone as the teacher), rkl, "
                                     "jsd[:beta] or kd+ce")
    temperature: float = described(1.0, "kd's temperature T (the KL of logits / T, scaled by T^2)", low=0.05,
                                   high=100.0)
    full_layers: int = described(0, "kept decoder layers next to the cut trained in full, with the final norm, "
                                    "beside the LoRA of `params` on the other layers (0: a LoRA only)", low=0)
    full_lr_mult: float = described(0.1, "the full layers' learning rate as a multiple of lr (the LoRA's)",
                                    above=0.0)
    nested_blocks: list[int] = described(
        help="nested depths: the blocks removed one after another (depth k removes the first k), in the order of "
             "their cost to the backbone; one LoRA trains at every depth 1..k, each step at one depth, distilled "
             "from the whole backbone (empty: one depth, drop_layers)", default_factory=list)
    nested_layers: list[list[int]] = described(help="the decoder layers of each nested block, in the same order",
                                               default_factory=list)
    positions: str = described("all", "the positions the divergence reads: all, or replies (on chat data the "
                                      "assistant's replies only)", choices=("all", "replies"))
    on_policy: float = described(0.0, "the share of steps whose batch the student samples itself (replies to the "
                                      "training data's chat prompts), scored by the teacher (0: none)",
                                 low=0.0, high=1.0)
    on_policy_tokens: int = described(128, "new tokens the student samples per reply on an on-policy step", low=1)

    @property
    def nested(self) -> bool:
        return bool(self.nested_blocks)

    @property
    def depths(self) -> int:
        """The deepest cut a nested healing run serves (its depths are 0..depths); 0 for a one-depth healing run."""
        return len(self.nested_blocks)

    def layers_at(self, depth: int) -> list[int]:
        """The decoder layers removed at nested depth `depth` (the first `depth` blocks of the order)."""
        if not 0 <= depth <= self.depths:
            raise ReskipError(f"depth {depth}: this healing run serves depths 0 to {self.depths}")
        return sorted(i for layers in self.nested_layers[:depth] for i in layers)

    def check(self, where: str) -> None:
        """One clear error for a record no trainer writes (`where` names the file)."""
        if self.nested and self.drop_layers:
            raise ReskipError(f"{where}: lora.nested_blocks and lora.drop_layers both set; a nested healing run removes its "
                              "layers per depth (nested_layers)")
        if len(self.nested_layers) != len(self.nested_blocks):
            raise ReskipError(f"{where}: lora.nested_layers has {len(self.nested_layers)} entries for "
                              f"{len(self.nested_blocks)} nested_blocks: one list of layers per block")
        if self.full_layers and (self.nested or not self.drop_layers):
            raise ReskipError(f"{where}: lora.full_layers trains the layers next to a cut: it needs drop_layers and "
                              "one depth (not nested)")
        try:
            loss = parse_objective(self.objective)
        except ReskipError as e:
            raise ReskipError(f"{where}: lora.objective: {e}") from None
        if self.on_policy and (self.nested or not loss.needs_teacher):
            raise ReskipError(f"{where}: lora.on_policy needs a teacher (not ce) and one depth (not nested)")
        flat = [i for layers in self.nested_layers for i in layers]
        if len(set(flat)) != len(flat) or len(set(self.nested_blocks)) != len(self.nested_blocks):
            raise ReskipError(f"{where}: lora.nested_blocks/nested_layers repeat a block or a layer")


def healing_config_text(cfg: TrainConfig, healing: HealingConfig) -> str:
    return yaml.safe_dump({"train": cfg.to_dict(), "lora": dataclasses.asdict(healing)}, sort_keys=False)


def is_healing_run(run_dir: Path) -> bool:
    """The folder is a healing run (its config.yaml holds `lora:`), not a retrofit run."""
    path = RunFolder(run_dir).config
    if not path.is_file():
        return False
    data = read_yaml(path, load_yaml)
    return isinstance(data, dict) and "lora" in data


def read_healing_run(run_dir: Path) -> tuple[TrainConfig, HealingConfig]:
    """A baseline run's config.yaml -> (TrainConfig, HealingConfig)."""
    if not RunFolder(run_dir).config.is_file():
        raise ReskipError(f"{run_dir} is not a finished baseline run (no config.yaml): a LoRA or healed arm of "
                          "`reskip experiment baselines` has one")
    data = read_yaml(RunFolder(run_dir).config, load_yaml)
    if not isinstance(data, dict) or not {"train", "lora"} <= set(data):
        raise ReskipError(f"{run_dir} is not a finished baseline run: its config.yaml has no train: and lora: (a "
                          "LoRA or healed arm of `reskip experiment baselines` has)")
    where = str(RunFolder(run_dir).config)
    healing = typed_healing_config(HealingConfig, data["lora"], where)
    healing.check(where)
    return TrainConfig.from_dict(data["train"]), healing


def load_healed_model(run_dir: Path, dtype: str | None = None, device: str = "auto", trust_remote_code: bool = False,
                   depth: int | None = None):
    """A trained baseline run as (model with its LoRA, tokenizer) on `device`: the backbone loaded, pruned as
    recorded (a nested healing run: at `depth`, which it needs) and the PEFT adapter applied, its files checked before and
    as they load (`healing_files`). A nested healing run at depth 0 is the backbone itself, without its LoRA: exactly the model it
    distils from. The model's own Python code runs only with the caller's `trust_remote_code` (the user's flag),
    never because the healing's config.yaml says so: a healing run someone shared runs no code on the machine that opens it."""
    cfg, healing = read_healing_run(run_dir)
    drop = layers_removed_by(healing, run_dir, depth)
    folder = RunFolder(run_dir).adapter
    n_layers = load_config(cfg.model, trust_remote_code).num_hidden_layers
    check_layers(healing, n_layers, str(RunFolder(run_dir).config))
    trained_without = healing.layers_at(healing.depths) if healing.nested else drop  # a nested LoRA covers every layer
    check_adapter_files(folder, healing, n_layers - (0 if healing.nested else len(trained_without)))
    base, tokenizer = load_backbone(cfg.model, dtype or cfg.dtype, trust_remote_code, device)
    if healing.nested and depth == 0:  # the backbone, bit for bit: its LoRA is not applied
        base.eval()
        return base, tokenizer
    if drop and not healing.nested:  # a LoRA trained on the pruned model: its keys number the kept layers
        prune(base, set(drop))
    try:
        model = PeftModel.from_pretrained(base, folder, autocast_adapter_dtype=True)
    except (SafetensorError, RuntimeError, ValueError, KeyError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ReskipError(f"{folder}: the adapter does not load onto this healing run's model ({first[:300]}); train the healing "
                          "again") from None
    check_loaded(model, folder)
    if drop and healing.nested:  # a nested LoRA trained on every layer: loaded whole, then its depth's layers removed
        prune(model.get_base_model(), set(drop))
    model.eval()
    return model, tokenizer


def layers_removed_by(healing: HealingConfig, run_dir: Path, depth: int | None) -> list[int]:
    """The layers a healing run's model removes: a nested healing run's at `depth` (which it needs), any other's own."""
    if healing.nested:
        if depth is None:
            raise ReskipError(f"{run_dir} is a nested-depths healing run (depths 0 to {healing.depths}): say which depth "
                              "(--depth K, or nested:K:RUN)")
        return healing.layers_at(depth)
    if depth is not None and depth != len(healing.drop_blocks):
        raise ReskipError(f"{run_dir} serves one depth ({len(healing.drop_blocks)} blocks removed); --depth {depth} needs "
                          "a nested-depths healing run (`reskip experiment nested`)")
    return list(healing.drop_layers)
