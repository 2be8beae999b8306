"""`reskip compress`'s options: one typed object, each field with its help, default and range (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config_fields import described
from ..stages.options import PRESET_HELP, PRESETS, BackboneOptions

OBJECTIVES = ("ce", "kd", "kd+ce")


@dataclass
class CompressOptions(BackboneOptions):
    model: str | None = described(None, "the model to compress: a Hugging Face id in the cache, a local folder or a "
                                        ".gguf (None: the bundled SmolLM2-135M-Instruct)")
    out: str | None = described(None, "the folder compress owns: model/ (the plain Hugging Face model), report.md "
                                      "and report.json, and its work (heal/, blocks.json); rerun the same command to "
                                      "resume", required=True)
    drop: int | None = described(None, "blocks of layers to remove (the model's cheapest by its own ablation cost "
                                       "A(n) on the calibration split); default 1 unless --keep-flops is given",
                                 low=1)
    keep_flops: float | None = described(None, "instead of --drop: the share of layer FLOPs to keep at most (e.g. "
                                               "0.8): the fewest blocks removed that reach it", low=0.05, high=0.999)
    block_size: int = described(4, "layers per block (the unit removed)", low=1)
    choose: str = described("ppl", "how the cheapest blocks are ranked on the calibration split: ppl (the ablation "
                                   "cost A(n): perplexity with the block removed / without), kl (the same ablation "
                                   "read as KL to the model) or influence (ShortGPT: the block whose output is most "
                                   "like its input)", choices=("ppl", "kl", "influence"))
    data: list[str] = described(default_factory=lambda: ["default"],
                                help="the text healing distils on (distillation needs no labels; default: the "
                                     "bundled mix); its test split and --heldout are where the report measures")
    objective: str = described("kd", "the healing objective: kd (KL(original || compressed) on every position: the "
                                     "measured best), ce (cross-entropy on the data) or kd+ce", choices=OBJECTIVES)
    preset: str = described("standard", "the healing's length (steps x batch x tokens), one of the presets: "
                                        + PRESET_HELP, choices=tuple(PRESETS))
    lr: float = described(0.002, "peak learning rate of the healing LoRA (the rate the kd arms were measured at)",
                          low=1e-8, high=1.0)
    params: int | None = described(None, "the healing LoRA's trainable parameters (None: the side-channel's count at "
                                         "the recipe's rank on this model, 982,663 on SmolLM2-135M)", low=1)
    full_layers: int = described(0, "kept layers next to the cut trained in full, with the final norm (their "
                                    "learning rate a tenth of --lr), beside the LoRA on the other layers (0: the "
                                    "LoRA only)", low=0)
    heldout: list[str] = described(default_factory=lambda: ["kjv"],
                                   help="text no stage saw, where the report measures too (empty: none)")
    sequences: int = described(16, "test (and held-out) sequences the report scores, of the healing's length (256 "
                                   "tokens at the standard preset)", low=1)
    mc_limit: int = described(50, "MMLU questions answered by both models (0: none)", low=0)
    no_speed: bool = described(False, "do not time the compressed model against the original (by default: batch 1 "
                                      "and 8 decode and a 512-token prefill in transformers)")
    quiet: bool = described(False, "no progress bar")
