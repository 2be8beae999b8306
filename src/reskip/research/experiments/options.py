"""The experiments' options: one typed object, each field with its help, default and range (no torch here, so the
CLI builds its flags from them cheaply)."""

from __future__ import annotations

from dataclasses import dataclass

from ...config_fields import SEED_MAX, described
from ...device_names import DEVICE_HELP, DEVICE_PATTERN
from ...options import DTYPE_HELP, DTYPE_NAMES, PRESET_HELP, PRESETS, BackboneOptions

EXPERIMENTS = ("variants", "block-size", "mix", "placement", "scale", "baselines", "nested", "stacked", "frontier", "depth-request")
# The second source document's instance: 48 layers of d = 4096 at 4,096 tokens in bf16, 256 MiB of depth states.
SOURCE_MEMORY_BYTES = 256 * 2**20


@dataclass
class ExperimentOptions(BackboneOptions):
    model: str | None = described(None, "the backbone (None: the bundled SmolLM2-135M-Instruct)")
    dtype: str = described("auto", DTYPE_HELP + ", in every arm", choices=DTYPE_NAMES)
    device: str = described("auto", DEVICE_HELP + ", for every arm", pattern=DEVICE_PATTERN)
    name: str = described("variants", "the experiment", choices=EXPERIMENTS)
    preset: str = described("quick", "the training length of every arm, one of the pipeline's presets (`scale`'s "
                                     "arms are presets themselves): " + PRESET_HELP, choices=tuple(PRESETS))
    data: list[str] = described(default_factory=lambda: ["default"], help="data specs (default: the bundled mix)")
    out: str | None = described(None, "the run folder OUT/experiments/NAME is written into; `reskip report OUT` "
                                      "shows every experiment there (None: runs/experiments)")
    seed: int = described(0, "the seed of every arm's training and data (0 to 2^63 - 1)", low=0, high=SEED_MAX)
    overrides: dict = described(default_factory=dict, help="TrainConfig values for every arm (and RetrofitConfig "
                                                           "keys by name), on top of the preset")
    calib_sequences: int | None = described(None, "calibration sequences per arm (None: the preset's)", low=1)
    test_sequences: int | None = described(None, "test sequences per arm, for the signal test (None: twice the "
                                                 "preset's diagnose sequences)", low=1)
    boundaries: list[int] | None = described(None, "explicit block starts: one more arm of `block-size`")
    arms: list[str] | None = described(
        None, "run only these arms now (names, e.g. 'dialogue only', or folder names, dialogue-only), e.g. one "
              "process per core; results.json is written once every arm of the experiment has finished, in this "
              "process or another sharing OUT; `scale`: presets among standard, long, large (None: every arm)")
    memory_bytes: int = described(SOURCE_MEMORY_BYTES, "placement: the memory the depth states may take, in bytes "
                                                       "(the second source document's 256 MiB)", low=1)
    context: int | None = described(None, "placement: your context length (None: the model's, at most 8,192)",
                                    low=1)
    dtype_bytes: int = described(2, "placement: bytes per state value (2: bfloat16)", low=1)
    lrs: list[float] | None = described(None, "baselines: the learning rates every method is trained at, the best "
                                              "on validation kept (None: 0.5, 1 and 2 x the recipe's)", low=1e-12)
    variants: list[str] | None = described(
        None, "baselines, stacked: also these of the recipe's variants (stacked: backbone-teacher); baselines: at the "
              "same total trainable parameters (empty: every one; "
              "None: none): side+lora (the side-channel at half its rank and a LoRA inside the blocks), full-teacher "
              "(the skip branch distilled toward the full path) and backbone-teacher (the full path distilled toward "
              "the backbone instead of CE on the mix)")
    heal: list[str] = described(default_factory=lambda: ["ce"],
                                help="baselines: the healing objectives of the healed arms, each its own arms: ce "
                                     "(cross-entropy on the mix: healed:K), kd (KL(backbone || model) on every "
                                     "position: healed:K:kd), kd+ce")
    depths: int = described(3, "nested: the deepest cut of the nested model (blocks removed; it serves 0 to this)",
                            low=1)
    nested_sum: bool = described(False, "nested: also train the nested model on the separate models' summed tokens "
                                        "(depths x the steps), scored beside the one at one model's tokens")
    quiet: bool = described(False, "print only the results")
