"""What every stage's options share, and the names the command line offers, in one torch-free module: the
options base (each field with its help, its default and its range, as TrainConfig's fields), the compute dtypes'
names, and the presets (each stage's option values by name). The CLI imports these instead of copying them."""

from __future__ import annotations

from dataclasses import dataclass

from .ar_retrofit.config import RetrofitConfig
from .config_fields import described
from .device_names import DEVICE_HELP, DEVICE_PATTERN
from .train_config import RECIPE_RETROFIT, TrainConfig

# A block is eligible for skipping when its ablation cost A(n) < 1 + DELTA: 1.0 admits every block whose skipping at
# most doubles perplexity (the main job's calibration, and `reskip calibrate`'s)
DELTA = 1.0
# The held-out source of every figure (`data.heldout`: the King James Bible), text no stage trains or calibrates on
HELDOUT = "kjv"
# `backbones.dtypes` resolves these (auto: bfloat16 where the hardware computes it fast, float32 elsewhere)
DTYPE_NAMES = ("auto", "float32", "bfloat16")
DTYPE_HELP = ("the backbone's compute dtype: auto is bfloat16 on CUDA and on CPUs with AMX or AVX512-BF16, "
              "float32 elsewhere")

PRESETS = {
    # Fits in well under 20 minutes on a 2-core CPU with the bundled model: a smoke run of the
    # whole pipeline, too short for the retrofit to learn much.
    "quick": {"train": {"steps": 30, "batch_size": 4, "seq_len": 128, "eval_every": 10, "save_every": 10,
                        "eval_sequences": 4},
              "calibrate": {"sequences": 8}, "eval": {"sequences": 4, "mc_limit": 10, "chunk_size": 32},
              "diagnose": {"sequences": 2, "sample_tokens": 64, "signal_sequences": 4, "probe_sequences": 8}},
    # A screening preset between the two (the notebook's "medium"): 100 steps at the quick preset's
    # batch (51k training tokens); for comparing settings, not for final figures.
    "medium": {"train": {"steps": 100, "batch_size": 4, "seq_len": 128, "eval_every": 25, "save_every": 25,
                         "eval_sequences": 8},
               "calibrate": {"sequences": 16}, "eval": {"sequences": 8, "mc_limit": 20, "chunk_size": 32},
               "diagnose": {"sequences": 2, "sample_tokens": 64, "signal_sequences": 8, "probe_sequences": 16}},
    # The default recipe (TrainConfig defaults): 0.2M training tokens, about 8 minutes of training on a 2-core CPU
    # with AMX in bfloat16 (19 in float32).
    "standard": {"train": {}, "calibrate": {"sequences": 32}, "eval": {"sequences": 16, "mc_limit": 50, "chunk_size": 32},
                 "diagnose": {"sequences": 4, "sample_tokens": 96, "signal_sequences": 8, "probe_sequences": 128}},
}
# The standard recipe at 4x and 10x its training tokens (same batch, peak learning rate, and c(t) and warm-up
# over the same shares of the run; four validations spaced over it); every later stage as the standard's.
for _name, _times in (("long", 4), ("large", 10)):
    _steps = TrainConfig.steps * _times
    PRESETS[_name] = {**PRESETS["standard"],
                      "train": {"steps": _steps, "eval_every": _steps // 4, "save_every": _steps // 8}}
PRESET_HELP = ("the sizes of every stage: quick (a smoke run), medium (screening), standard (the default recipe, "
               "0.2M training tokens), long and large (the standard recipe at 4x and 10x the tokens)")


@dataclass
class BackboneOptions:
    """What every command that loads a backbone takes: which model, in which dtype, on which device, and whether its
    own Python code may run. Every options class derives from it (redefining a field only for its default or help)."""

    model: str | None = described(None, "the backbone: a Hugging Face id, a local folder or a .gguf (None: the "
                                        "run's, else the bundled SmolLM2-135M-Instruct)")
    dtype: str = described("auto", DTYPE_HELP, choices=DTYPE_NAMES)
    device: str = described("auto", DEVICE_HELP, pattern=DEVICE_PATTERN)
    trust_remote_code: bool = described(False, "allow the model's own Python code to run")
    threads: int | None = described(None, "CPU threads torch computes with (None: torch's own choice, every core it "
                                          "sees); 1 where other jobs share the cores", low=1, high=4096)


@dataclass
class StageOptions(BackboneOptions):
    """The options every stage that opens a trained run takes; a stage's own class adds its fields and may
    redefine these with its own default or help."""

    data: list[str] | None = described(None, "data specs (None: the run's own)")
    sequences: int = described(16, "sequences read from the stage's split", low=1)
    seq_len: int | None = described(None, "tokens per sequence (None: the run's training seq_len, else 256)", low=8)
    out: str | None = described(None, "where the stage writes (None: inside the run folder)")


@dataclass
class RunOptions(BackboneOptions):
    """What a run of the main job is made of (recorded in pipeline.json, so a resumed run is the same); the pipeline's
    `PipelineConfig` adds the stages' options derived from them."""

    model: str | None = described(None, "the backbone (None: the bundled SmolLM2-135M-Instruct)")
    dtype: str = described("auto", DTYPE_HELP + "; every stage's ('auto' is resolved once, when the run starts)",
                           choices=DTYPE_NAMES)
    device: str = described("auto", DEVICE_HELP + "; every stage's", pattern=DEVICE_PATTERN)
    preset: str = described("standard", PRESET_HELP, choices=tuple(PRESETS))
    data: list[str] = described(default_factory=lambda: ["default"], help="training data specs (default: the "
                                                                          "bundled mix)")
    overrides: dict = described(default_factory=dict, help="training values over the preset's (TrainConfig keys; "
                                                           "block_size, rank, boundaries, ... set the retrofit)")
    delta: float = described(DELTA, "calibration: a block is eligible for skipping when its ablation cost A(n) "
                                  "(perplexity with the block skipped / without) < 1 + delta; 1.0 admits every block "
                                  "whose skipping at most doubles perplexity", low=0.0)


@dataclass
class ParityOptions:
    """The parity stage's options: the backbone, and the retrofit whose step-zero parity is checked."""

    model: str | None = described(None, "the backbone: a Hugging Face id, a local folder or a .gguf (None: the "
                                        "bundled SmolLM2-135M-Instruct)")
    device: str = described("auto", DEVICE_HELP, pattern=DEVICE_PATTERN)
    trust_remote_code: bool = described(False, "allow the model's own Python code to run")
    retrofit: RetrofitConfig = described(default_factory=lambda: RetrofitConfig(**RECIPE_RETROFIT),
                                         help="the retrofit checked (default: the training recipe's)")
