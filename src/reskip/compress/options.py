"""`reskip compress`'s options: one typed object, each field with its help, default and range (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config_fields import SEED_MAX, described
from ..options import HELDOUT, PRESET_HELP, PRESETS, BackboneOptions

# `compress.objectives.OBJECTIVES`, named here without importing torch (a test holds the two lists equal)
OBJECTIVE_NAMES = ("kd", "rkl", "jsd[:beta]", "ce", "kd+ce")


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
    blocks: list[int] | None = described(None, "instead of --drop: the blocks to remove, by number (1 is the first "
                                               "block; the first and last are kept)")
    block_size: int = described(4, "layers per block (the unit removed)", low=1)
    choose: str = described("ppl", "how the cheapest blocks are ranked on the calibration split: ppl (the ablation "
                                   "cost A(n): perplexity with the block removed / without), kl (the same ablation "
                                   "read as KL to the model) or influence (ShortGPT: the block whose output is most "
                                   "like its input)", choices=("ppl", "kl", "influence"))
    data: list[str] = described(default_factory=lambda: ["default"],
                                help="what healing distils on: default (the bundled text mix), files or folders of "
                                     "text or chat JSONL, and self or self:N (N conversations the model writes "
                                     "itself from its chat template, 400 by default); the text's test split and "
                                     "--heldout are where the report measures raw text")
    prompts: str | None = described(None, "your own prompts (a file, one a line, or JSONL with a `prompt` field), "
                                           "answered by the model and healed on beside --data")
    chat_share: float = described(0.5, "mixed with text, the share of training sequences from the model's own "
                                       "conversations (self, --prompts)", low=0.0, high=1.0)
    reply: str = described("greedy", "how the model writes the replies it heals on: greedy (its replies as a chat "
                                     "endpoint serves them; measured closer on held-out replies than sampled) or "
                                     "sample (temperature 0.7)", choices=("greedy", "sample"))
    data_seed: int = described(1, "the seed of the conversations the model writes, 0 to 2^63 - 1 (the held-out chat "
                                  "prompts were written under 7001 and 7002, and are never healed on)",
                               low=0, high=SEED_MAX)
    objective: str = described("kd", "the healing objective: " + ", ".join(OBJECTIVE_NAMES) + " (kd: KL(original "
                                     "|| compressed), the measured best; rkl the reverse KL; jsd GKD's generalised "
                                     "JSD; ce cross-entropy on the data)")
    positions: str = described("all", "the positions the divergence reads: all, or replies (on chat data the "
                                      "replies only)", choices=("all", "replies"))
    on_policy: float = described(0.0, "the share of healing steps on which the compressed model samples its own "
                                      "replies to the data's chat prompts and the original scores them (GKD)",
                                 low=0.0, high=1.0)
    on_policy_tokens: int = described(128, "new tokens the model samples per reply on an on-policy step", low=1,
                                      high=4096)
    preset: str = described("standard", "the healing's length (steps x batch x tokens), one of the presets: "
                                        + PRESET_HELP, choices=tuple(PRESETS))
    steps: int | None = described(None, "healing steps instead of the preset's (its batch and sequence length kept)",
                                  low=1, high=10_000_000)
    lr: float = described(0.002, "peak learning rate of the healing LoRA (the rate the kd arms were measured at)",
                          low=1e-8, high=1.0)
    params: int | None = described(None, "the healing LoRA's trainable parameters (None: the healing's own rule, "
                                         "0.73% of the model's parameters: 982,663 on SmolLM2-135M)", low=1)
    full_layers: int = described(0, "kept layers next to the cut trained in full, with the final norm (their "
                                    "learning rate a tenth of --lr), beside the LoRA on the other layers (0: the "
                                    "LoRA only)", low=0)
    heldout: list[str] = described(default_factory=lambda: [HELDOUT],
                                   help="text no stage saw, where the report measures too (empty: none)")
    sequences: int = described(16, "test (and held-out) sequences the report scores, of the healing's length (256 "
                                   "tokens at the standard preset)", low=1)
    chat_prompts: int = described(112, "held-out chat prompts the report reads the replies of (the test set's first "
                                       "N: the sixteen fixed ones, then requests the original wrote itself; 0: none)",
                                  low=0, high=112)
    mc_limit: int = described(50, "MMLU questions answered by the original, and by the compressed model where the "
                                  "original scores above chance (0: none)", low=0)
    no_speed: bool = described(False, "do not time the compressed model against the original (by default: batch 1 "
                                      "and 8 decode and a 512-token prefill in transformers)")
    quiet: bool = described(False, "no progress bar")
