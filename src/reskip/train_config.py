"""The training configuration, a run's config.yaml: defaults, YAML + flag overrides, and validation before any
model loads. Outside train/ because inference reads a run's model, data and sequence length from it too."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass

import yaml

from .ar_retrofit.config import RetrofitConfig, check_rank, reject_unknown_keys
from .config_fields import SEED_MAX, described
from .device_names import DEVICE_HELP, DEVICE_PATTERN
from .errors import ReskipError
from .reading import read_yaml


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading numbers as YAML 1.2 and JSON do: in YAML 1.1 a float needs a dot, so
    `1e-3` would be the string '1e-3' (and `lr: 1e-3` refused as not a number). Aliases (`*name`) are refused:
    a config needs none, and a few hundred bytes of nested aliases expand to gigabytes. A key given twice is refused
    (PyYAML keeps the second one without a word)."""

    def construct_mapping(self, node, deep=False):
        """A key given twice is refused (PyYAML would keep the second silently)."""
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def compose_node(self, parent, index):
        if self.check_event(yaml.events.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed in a reskip config",
                                              event.start_mark)
        return super().compose_node(parent, index)


_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))
# YAML 1.1 also reads 0x10, 0o10, 010, 0b10 and 1:30 as integers (`--lr 0x10` would be 16); JSON and YAML 1.2 read
# decimal digits only, and so does reskip: anything else stays a string, which validation refuses by name.
for _first, _resolvers in list(_Yaml12Loader.yaml_implicit_resolvers.items()):
    _Yaml12Loader.yaml_implicit_resolvers[_first] = [r for r in _resolvers if r[0] != "tag:yaml.org,2002:int"]
_Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
_Yaml12Loader.add_constructor("tag:yaml.org,2002:int", lambda loader, node: int(loader.construct_scalar(node), 10))


def load_yaml(text: str):
    """A YAML document (a config file, or one flag's value) with YAML 1.2 numbers; raises yaml.YAMLError."""
    return yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 - a SafeLoader subclass


# The training recipe's retrofit, where it differs from RetrofitConfig's (the source design's, which a bare
# `retrofit(model)` keeps): a skipped block goes through a learned shortcut.
RECIPE_RETROFIT = {"skip_path": "shortcut"}
REPORT_TO = (None, "tensorboard")
PLACEMENT_FIELDS = ("device", "shard")  # where a run computes, not what it trains
SKIP_TEACHERS = ("backbone", "full")
FULL_OBJECTIVES = ("ce", "kd")

@dataclass
class TrainConfig:
    """Everything a training run needs; written resolved into the run folder as config.yaml. Each field's help
    text (`config_fields.described`) is what `reskip train --help` and docs/guide.md's table say of it.

    Why the routers' queries have a learning-rate multiple of their own: a router moves its logits by at most
    |w_n|, and Adam moves each coordinate by about lr per step, so at the default lr a query can hardly grow
    within a retrofit's training run; the multipliers let it (the lab notebook measures them).
    """

    model: str | None = described(None, "the backbone: null (the bundled SmolLM2-135M-Instruct), a packaged name, a "
                                        "hub id, a folder or a .gguf")
    dtype: str = described("auto", "the frozen backbone's compute dtype: auto (bfloat16 on CUDA and on CPUs with AMX "
                                   "or AVX512-BF16, else float32; written resolved), float32 or bfloat16; the "
                                   "side-channel stays float32")
    device: str = described("auto", DEVICE_HELP + " (under torchrun or accelerate launch: each process its own "
                                                  "GPU, or the CPU); not part of the run's identity: a run may "
                                                  "resume on another device", pattern=DEVICE_PATTERN)
    trust_remote_code: bool = described(False, "let a model's own Python code run (off: it never does)")
    data: list[str] = described(help="training data specs: default (the bundled mix), text files or folders, JSONL, "
                                     "chat JSONL, a dataset id", default_factory=lambda: ["default"])
    data_weights: dict[str, float] | None = described(None, "the share of each part of the data (null: equal shares)")
    seq_len: int = described(256, "tokens per training sequence", low=8)
    steps: int = described(100, "optimizer steps", low=1)
    batch_size: int = described(8, "sequences per optimizer step (global, over processes and accumulation)", low=1)
    grad_accum: int = described(1, "micro-steps per optimizer step on each process", low=1)
    lr: float = described(2e-3, "peak learning rate (AdamW), linear warm-up then cosine decay", above=0.0)
    router_lr_mult: float = described(1.0, "the routers' queries w_n learn at this multiple of lr", above=0.0)
    source_bias_lr_mult: float = described(1.0, "the routers' per-source biases b_i learn at this multiple of lr", above=0.0)
    weight_decay: float = described(0.0, "AdamW weight decay", low=0.0)
    warmup_frac: float = described(0.05, "share of the steps of linear learning-rate warm-up", low=0.0, high=1.0)
    min_lr_frac: float = described(0.1, "the cosine decay ends at this multiple of lr", low=0.0, high=1.0)
    clip_norm: float = described(1.0, "gradient norm clipping", above=0.0)
    lambda_kl: float = described(1.0, "weight of KL(teacher || skip branch)", low=0.0)
    skip_teacher: str = described("backbone", "the skip branch's teacher: backbone (the frozen backbone, the source "
                                              "design's) or full (the retrofit's own full path, detached: a departure "
                                              "that pulls the skip branch toward what CE teaches the full path)")
    full_objective: str = described("ce", "the full path's term: ce (cross-entropy on the mix, the source design's) or "
                                          "kd (KL(backbone || full path) on every position: the backbone as the only "
                                          "teacher, a named variant)")
    lambda_ent: float = described(0.01, "weight of the routers' entropy (subtracted: it keeps routing spread)", low=0.0)
    lambda_signal: float = described(1.0, "weight of the signal term: corr(alpha on h_{n-1}, the measured per-token "
                                          "cost of skipping n) for the drawn block; 0 is the source design's loss", low=0.0)
    lambda_local: float = described(1.0, "with skip shortcuts, weight of the local regression of x_n + S_n(x_n) onto "
                                         "the block's real output h_n; 0: shortcuts learn from the skip branch only", low=0.0)
    hold_frac: float = described(0.02, "c(t) is 0 (exact parity) for this share of the steps", low=0.0, high=1.0)
    ramp_end_frac: float = described(0.3, "c(t) rises linearly to 1 at this share of the steps", low=0.0, high=1.0)
    skip_blocks: list[int] | None = described(None, "blocks the skip branch may draw (null: every block but the first "
                                                    "and the last)")
    skip_fraction: float = described(1.0, "share of positions at which the drawn block is skipped (1: the whole "
                                          "block; below 1 a token-level skip branch)", above=0.0, high=1.0)
    skip_max_blocks: int = described(1, "the skip branch drops 1..this many distinct blocks together", low=1)
    loss_chunk: int | None = described(64, "CE and KL from the LM head this many positions at a time (null: whole "
                                           "(B, T, V) logits); the step's peak memory 4.25 against 6.02 GiB at 8 x 256")
    recompute: bool = described(False, "activation checkpointing of the frozen layers: less memory, one more forward")
    shard: bool = described(False, "shard the frozen decoder layers over the processes with FSDP2 (a backbone that "
                                   "does not fit one device; under torchrun or accelerate launch --multi_gpu); not "
                                   "part of the run's identity: the same training as data-parallel")
    report_to: str | None = described(None, "null, or tensorboard: every logged record also goes to RUN/tensorboard/")
    eval_every: int = described(25, "steps between validations", low=1)
    eval_sequences: int = described(16, "validation sequences", low=1)
    skip_kl_curve: bool = described(True, "the skip-branch KL of every block at every validation (false: at the "
                                          "first and the last only; one pass per block fewer)")
    save_every: int = described(25, "steps between checkpoints (the two newest are kept)", low=1)
    log_every: int = described(1, "steps between train records in train_log.jsonl", low=1)
    seed: int = described(0, "the random seed: initialisation, data order, drawn blocks and positions (0 to 2^63 - 1)",
                          low=0, high=SEED_MAX)
    retrofit: dict = described(help="RetrofitConfig keys (block_size, rank, skip_path, ...) over the recipe's",
                               default_factory=dict)

    def retrofit_config(self) -> RetrofitConfig:
        return RetrofitConfig.from_dict(self.resolved_retrofit())

    def resolved_retrofit(self) -> dict:
        """The retrofit keys given, over the training recipe's own defaults (`RECIPE_RETROFIT`)."""
        return {**RECIPE_RETROFIT, **self.retrofit}

    def validate(self, world_size: int = 1) -> None:
        """Refuse bad values with one clear message (called before any model loads)."""

        def need(cond, msg):
            if not cond:
                raise ReskipError(f"bad training config: {msg}")

        self._check_types(need)
        self._check_ranges(need)
        need(self.hold_frac <= self.ramp_end_frac, "hold_frac must not exceed ramp_end_frac")
        need(self.skip_teacher in SKIP_TEACHERS,
             f"skip_teacher must be one of {', '.join(SKIP_TEACHERS)}, got {self.skip_teacher!r}")
        need(self.full_objective in FULL_OBJECTIVES,
             f"full_objective must be one of {', '.join(FULL_OBJECTIVES)}, got {self.full_objective!r}")
        need(not (self.full_objective == "kd" and self.skip_teacher == "full"),
             "full_objective kd makes the backbone the only teacher: it does not go with skip_teacher full")
        need(bool(self.data), "data is empty: use ['default'] or files / dataset ids")
        per_step = world_size * self.grad_accum
        need(self.batch_size % per_step == 0,
             f"batch_size {self.batch_size} must be divisible by processes x grad_accum = {per_step}")
        need(self.loss_chunk is None or (isinstance(self.loss_chunk, int) and not isinstance(self.loss_chunk, bool)
                                         and self.loss_chunk > 0),
             f"loss_chunk must be a positive integer or null, got {self.loss_chunk!r}")
        if self.skip_blocks is not None:
            need(len(self.skip_blocks) > 0 and all(isinstance(b, int) and b >= 1 for b in self.skip_blocks),
                 f"skip_blocks must be a non-empty list of block numbers >= 1, got {self.skip_blocks!r}")
        try:
            self.retrofit_config()
        except (ValueError, TypeError) as e:  # the retrofit's own refusal, with its message
            raise ReskipError(f"bad training config: retrofit: {e}") from e

    def _check_types(self, need) -> None:
        # Types first, so that every later comparison is between numbers (a YAML value such as
        # `nan` or `1e-3x` arrives as a string). Which fields are numbers comes from their declared types.
        hints = typing.get_type_hints(TrainConfig)
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if hints[f.name] is float:
                need(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
                     f"{f.name} must be a finite number, got {v!r}")
            elif hints[f.name] is int:
                need(isinstance(v, int) and not isinstance(v, bool), f"{f.name} must be an integer, got {v!r}")
        need(isinstance(self.trust_remote_code, bool), f"trust_remote_code must be true or false, got {self.trust_remote_code!r}")
        need(isinstance(self.recompute, bool), f"recompute must be true or false, got {self.recompute!r}")
        need(isinstance(self.shard, bool), f"shard must be true or false, got {self.shard!r}")
        need(isinstance(self.skip_kl_curve, bool), f"skip_kl_curve must be true or false, got {self.skip_kl_curve!r}")
        need(self.report_to in REPORT_TO, f"report_to must be one of {REPORT_TO} (null: none), got {self.report_to!r}")
        need(self.model is None or isinstance(self.model, str), f"model must be a name or path, got {self.model!r}")
        need(isinstance(self.data, list) and all(isinstance(d, str) for d in self.data),
             f"data must be a list of data specs, got {self.data!r}")
        need(self.data_weights is None or (isinstance(self.data_weights, dict) and all(
            isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w >= 0
            for w in self.data_weights.values())), f"data_weights must map sources to weights >= 0, got {self.data_weights!r}")
        need(not self.data_weights or sum(self.data_weights.values()) > 0,
             f"data_weights gives every source weight 0 ({self.data_weights!r}): at least one must be > 0")
        need(isinstance(self.retrofit, dict), f"retrofit must be a mapping of retrofit keys, got {self.retrofit!r}")
        need(self.dtype in ("auto", "float32", "bfloat16"), f"dtype must be auto, float32 or bfloat16, got {self.dtype!r}")
        need(isinstance(self.device, str) and DEVICE_PATTERN.fullmatch(self.device) is not None,
             f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")

    def _check_ranges(self, need) -> None:
        """Every field against the range declared on it (`described`'s low, high and above)."""
        for f in dataclasses.fields(self):
            lo, hi = f.metadata.get("range", (None, None))
            above, v = f.metadata.get("above"), getattr(self, f.name)
            if lo is None and hi is None and above is None:
                continue
            if lo == 1 and hi is None and isinstance(v, int):
                need(v >= 1, f"{f.name} must be a positive integer, got {v!r}")
            elif above is not None:
                need(v > above and (hi is None or v <= hi),
                     f"{f.name} must be > {above:g}" + ("" if hi is None else f" and <= {hi:g}") + f", got {v!r}")
            elif hi is not None:
                need(lo <= v <= hi, f"{f.name} must lie in [{lo:g}, {hi:g}], got {v!r}")
            else:
                need(v >= lo, f"{f.name} must be >= {lo:g}, got {v!r}")

    def check_against_model(self, model_config, n_blocks: int | None) -> None:
        """The sequence length against the model's positions, and (n_blocks given: a retrofit) the blocks the skip
        branch may draw against its partition."""
        limit = getattr(model_config, "max_position_embeddings", None)
        if limit is not None and self.seq_len > limit:
            raise ReskipError(f"seq_len {self.seq_len} exceeds the model's limit of {limit} positions")
        if n_blocks is None:
            return
        if self.skip_blocks is not None and max(self.skip_blocks) > n_blocks:
            raise ReskipError(f"skip_blocks {self.skip_blocks} reach beyond the model's {n_blocks} blocks")
        if self.skip_blocks is None and n_blocks < 3:
            raise ReskipError(f"with {n_blocks} blocks there is no middle block to skip: set skip_blocks")
        drawable = len(set(self.drawable_blocks(n_blocks)))
        if self.skip_max_blocks > drawable:
            raise ReskipError(f"skip_max_blocks {self.skip_max_blocks} exceeds the {drawable} blocks the skip branch "
                              "may draw: at most that many can be dropped together")
        check_rank(self.retrofit_config(), model_config.hidden_size)

    def drawable_blocks(self, n_blocks: int) -> list[int]:
        return list(self.skip_blocks) if self.skip_blocks is not None else list(range(2, n_blocks))

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "retrofit": self.resolved_retrofit()}  # config.yaml says which skip path

    def what_it_trains(self) -> dict:
        """`to_dict` without the fields that say where a run computes (`PLACEMENT_FIELDS`): two configs equal here
        train the same run, so one may resume or reuse the other's on another device or sharding."""
        return {k: v for k, v in self.to_dict().items() if k not in PLACEMENT_FIELDS}

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        reject_unknown_keys(cls, data, "training config", ReskipError)
        return cls(**data)

    @classmethod
    def from_yaml(cls, text: str, overrides: dict | None = None) -> "TrainConfig":
        try:
            data = load_yaml(text) or {}
        except yaml.YAMLError as e:
            raise ReskipError(f"the config is not valid YAML ({getattr(e, 'problem', None) or e})") from None
        return cls._from_mapping(data, overrides)

    @classmethod
    def from_file(cls, path, overrides: dict | None = None) -> "TrainConfig":
        """A config file (a run's config.yaml, or --config), every error naming it."""
        data = read_yaml(path, load_yaml) or {}
        try:
            return cls._from_mapping(data, overrides)
        except ReskipError as e:
            raise ReskipError(f"{path}: {e}") from None

    @classmethod
    def _from_mapping(cls, data, overrides: dict | None) -> "TrainConfig":
        if not isinstance(data, dict):
            raise ReskipError("the config must be a YAML mapping of keys to values")
        # a flag given as null (or '') sets null: the field's own check then takes it (loss_chunk: whole logits)
        # or refuses it (device: a name) instead of the run quietly keeping another value
        data.update(overrides or {})
        return cls.from_dict(data)
