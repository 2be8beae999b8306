"""The evaluate stage's options: one typed object, each field with its help, default and range (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config_fields import SEED_MAX, described
from ..options import StageOptions
from ..skip.spec import METHOD_GRAMMAR, METHOD_KINDS, Spec, parse_specs

# The budgeted frontier (when the policy file has one) and the source design's quantile rule at about one
# block per step, each with static, influence and random at its measured mean skips.
DEFAULT_METHODS = ("backbone", "retrofit", "budgets", "reskip:0.5:1", "matched")
DEFAULT_MC_METHODS = ("backbone", "retrofit", "reskip")


def _specs(texts) -> list[Spec]:
    return parse_specs(list(texts), METHOD_KINDS)


@dataclass
class EvalOptions(StageOptions):
    data: list[str] | None = described(None, "data specs (None: the run's own); the test split is used")
    sequences: int = described(16, "test sequences (and held-out ones)", low=1)
    out: str | None = described(None, "the folder of results.json and results.md (None: RUN/eval)")
    methods: list[Spec] = described(default_factory=lambda: _specs(DEFAULT_METHODS),
                                    help=f"the methods scored side by side: {METHOD_GRAMMAR}")
    benchmarks: list[str] = described(default_factory=lambda: ["mmlu"],
                                      help="multiple choice: mmlu and/or bigbench:TASK (e.g. bigbench:social_iqa); "
                                           "empty (or none): no multiple choice")
    mc_methods: list[Spec] = described(default_factory=lambda: _specs(DEFAULT_MC_METHODS),
                                       help="the methods the multiple-choice benchmarks are answered with")
    mc_limit: int = described(50, "questions per benchmark (a deterministic sample)", low=1)
    generation: int = described(0, "generation agreement: greedy continuations of sixteen fixed chat prompts, this many "
                                   "new tokens each, by every method beside the backbone's (0: none)", low=0)
    chat: int = described(0, "chat fidelity: every method answers the first N held-out chat prompts (the `test` "
                              "set: the sixteen fixed ones, then requests the original wrote itself) beside the "
                              "original's own greedy replies (reply KL and top-1, greedy agreement, loops; float32; "
                              "0: none)", low=0, high=112)
    calib_sequences: int = described(32, "calibration sequences that rank the backbone's blocks for pruned:K "
                                         "(its own A(n), as `reskip experiment baselines` ranks them)", low=1)
    chunk_size: int = described(32, "tokens per step when scoring (one skip decision per block and step)", low=1)
    window: int | None = described(None, "W, tokens in w_recent (None: the policy file's)", low=1)
    seed: int = described(0, "the seed of random skipping and of the benchmark sample (0 to 2^63 - 1)", low=0,
                          high=SEED_MAX)
    quiet: bool = described(False, "no progress bar")
    heldout: list[str] | None = described(None, "data specs of a source kept out of training and calibration "
                                                "(e.g. kjv): every method on its test split too (the policy's drift)")
    reference: str | None = described(None, "compare with this model instead of the run's backbone (the original "
                                            "a pruned or healed backbone came from: a folder, a Hugging Face id in "
                                            "the cache, a .gguf or smollm2-135m-instruct): its logits are the "
                                            "references of KL, top-1 agreement, perplexity ratio and generation, its "
                                            "layers the unit of compute; it must share the backbone's tokenizer")
