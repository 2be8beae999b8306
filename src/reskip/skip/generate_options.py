"""`reskip generate`'s options: one typed object, each field with its help, default and range (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config_fields import SEED_MAX, described
from ..options import BackboneOptions
from .spec import GRAMMAR


@dataclass
class GenerateOptions(BackboneOptions):
    model: str | None = described(None, "the backbone (None: the run's, else the bundled SmolLM2-135M-Instruct)")
    policy: str = described("reskip", f"the skip policy: {GRAMMAR}, or a policy.json (a retrofit run's; a trained "
                                      "healing run or an exported folder has none); or a model of its own opened from the "
                                      "run's backbone: pruned:K, export:DIR, lora:RUN, healed:RUN, nested:K:RUN")
    depth: int | None = described(None, "RUN is a healing run (`reskip experiment baselines`, `nested`): serve it as "
                                        "its plain model; a nested healing run at this depth (its first K blocks removed, 0: "
                                        "the backbone itself)", low=0)
    window: int | None = described(None, "W, tokens in w_recent (None: the policy file's)", low=1)
    max_new_tokens: int = described(40, "tokens generated at most", low=1)
    sample: bool = described(False, "sample instead of greedy decoding")
    temperature: float = described(1.0, "with sample: the logits are divided by it (at least 0.01: a smaller one "
                                        "divides the logits past the largest float)", low=0.01, high=100.0)
    top_p: float = described(1.0, "with sample: nucleus sampling over the smallest set of tokens of this much "
                                  "probability (1: every token; > 0)", low=0.0, high=1.0)
    seed: int = described(0, "the seed of sampling and of random skipping (0 to 2^63 - 1)", low=0, high=SEED_MAX)
    raw: bool = described(False, "do not apply the chat template")
    prompt: str = described("", "the text to answer (the command line's positional argument)")
