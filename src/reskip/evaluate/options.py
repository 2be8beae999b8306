"""The evaluate stage's options: one typed object whose defaults are the CLI's (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..skip.spec import METHOD_KINDS, Spec, parse_specs

# The budgeted frontier (when the policy file has one) and the source design's quantile rule at about one
# block per step, each with static, influence and random at its measured mean skips.
DEFAULT_METHODS = ("backbone", "retrofit", "budgets", "reskip:0.5:1", "matched")
DEFAULT_MC_METHODS = ("backbone", "retrofit", "reskip")


def _specs(texts) -> list[Spec]:
    return parse_specs(list(texts), METHOD_KINDS)


@dataclass
class EvalOptions:
    """methods / mc_methods: parsed specs (`skip.spec`). benchmarks: "mmlu", "bigbench:TASK"; empty:
    no multiple choice. sequences x seq_len: test data (seq_len None: the run's, else 256), scored in
    chunks of chunk_size tokens (one step per chunk). window None: the policy file's. out: folder
    for results.json / results.md (None: RUN/eval). heldout: data specs of a source kept out of
    training and calibration (e.g. ["kjv"]); every method is evaluated on its test split too."""

    methods: list[Spec] = field(default_factory=lambda: _specs(DEFAULT_METHODS))
    benchmarks: list[str] = field(default_factory=lambda: ["mmlu"])
    mc_methods: list[Spec] = field(default_factory=lambda: _specs(DEFAULT_MC_METHODS))
    mc_limit: int = 50
    sequences: int = 16
    seq_len: int | None = None
    chunk_size: int = 32
    window: int | None = None
    seed: int = 0
    data: list[str] | None = None
    model: str | None = None
    dtype: str = "auto"  # the backbone's compute dtype: auto (bfloat16 on fast hardware), float32, bfloat16
    trust_remote_code: bool = False
    out: str | None = None
    quiet: bool = False
    heldout: list[str] | None = None
