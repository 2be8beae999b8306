"""The experiments' options: one typed object (no torch here, so the CLI reads the defaults cheaply)."""

from __future__ import annotations

from dataclasses import dataclass, field

EXPERIMENTS = ("variants", "block-size", "mix", "placement", "scale", "baselines")
# The second source document's instance: 48 layers of d = 4096 at 4,096 tokens in bf16, 256 MiB of depth states.
SOURCE_BUDGET_BYTES = 256 * 2**20


@dataclass
class ExperimentOptions:
    """preset: the pipeline preset whose training budget every arm gets (`pipeline.PRESETS`).
    model, data: the backbone and data specs (None: the bundled model; the bundled mix).
    overrides: TrainConfig values for every arm (and RetrofitConfig keys by name), on top of the preset.
    calib_sequences / test_sequences: calibration and test sequences per arm (None: the preset's).
    boundaries: explicit block starts, one more arm of `block-size`.
    arms: run only these arms now (names or their folder slugs; `scale`: presets; None: every arm). results.json is written
        once every arm of the experiment has finished, in this process or another sharing `out`.
    budget_bytes / context / dtype_bytes: `placement`'s memory budget and the user's model's context
        (None: its max_position_embeddings, capped at 8,192) and state width in bytes.
    lrs: `baselines`' learning-rate sweep, the same for every method (None: 0.5, 1 and 2 x the recipe's lr).
    variants: `baselines` also trains and measures these of the recipe's variants (side+lora, full-teacher; an
        empty list: both; None: neither)."""

    name: str = "variants"
    preset: str = "quick"
    model: str | None = None
    data: list[str] = field(default_factory=lambda: ["default"])
    out: str | None = None
    seed: int = 0
    overrides: dict = field(default_factory=dict)
    calib_sequences: int | None = None
    test_sequences: int | None = None
    boundaries: list[int] | None = None
    arms: list[str] | None = None
    budget_bytes: int = SOURCE_BUDGET_BYTES
    context: int | None = None
    dtype_bytes: int = 2
    lrs: list[float] | None = None  # baselines: the learning-rate sweep of every method (None: 0.5, 1, 2 x the recipe's)
    variants: list[str] | None = None  # baselines: the recipe's variants beside the methods ([]: every one)
    dtype: str = "auto"  # the backbone's compute dtype in every arm (auto: bfloat16 where the hardware is fast)
    quiet: bool = False
