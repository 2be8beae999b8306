"""The held-out chat prompt sets the project owns (`prompt_sets.json`, shipped in the package): `test` (the sixteen
fixed prompts and requests the bundled SmolLM2-135M-Instruct wrote itself under a seed no healing uses) for final
figures, and `val` (requests under another seed) for choosing settings. Each set is saved with the sha256 of its
prompts, checked on every load. Healing data is written deduplicated against both (`held_out_keys`).

Made by `python scripts/make_chat_prompt_sets.py` (the bundled model in float32, `user_turns.sample_user_batch`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources

from ..errors import ReskipError
from .template import normalized

FILE = "prompt_sets.json"
SET_NAMES = ("test", "val")
# The fixed prompts: short instructions of the kinds the bundled mix holds (explanation, advice, code, story, facts,
# reasoning), written by hand; the first sixteen of the test set.
FIXED_PROMPTS = (
    "Explain photosynthesis in two sentences.",
    "What is the capital of France, and why is it famous?",
    "Write a Python function that reverses a string.",
    "Give me three tips for sleeping better.",
    "Tell a short story about a cat who learns to swim.",
    "Why is the sky blue?",
    "How do I boil an egg?",
    "Summarise the plot of Romeo and Juliet.",
    "What is the difference between a list and a tuple in Python?",
    "Describe the water cycle.",
    "Write a haiku about autumn.",
    "What causes earthquakes?",
    "How can I be more productive when working from home?",
    "Translate 'good morning' into French and Spanish.",
    "If I have 3 apples and eat one, how many are left? Explain.",
    "What are the main ingredients of bread?",
)


def digest(prompts: list[str]) -> str:
    return hashlib.sha256(json.dumps(list(prompts), ensure_ascii=False).encode()).hexdigest()


@dataclass(frozen=True)
class PromptSet:
    name: str
    prompts: tuple[str, ...]
    digest: str
    seed: int | None  # the seed its self-written requests were sampled with

    def __len__(self) -> int:
        return len(self.prompts)

    def first(self, n: int | None) -> "PromptSet":
        """Its first `n` prompts (all when None or larger), under the digest of those."""
        if n is None or n >= len(self.prompts):
            return self
        prompts = self.prompts[:n]
        return PromptSet(self.name, prompts, digest(list(prompts)), self.seed)


def _read() -> dict:
    return json.loads(resources.files(__package__).joinpath(FILE).read_text(encoding="utf-8"))


def prompt_set(name: str) -> PromptSet:
    """A shipped set by name, its digest checked."""
    if name not in SET_NAMES:
        raise ReskipError(f"chat prompt set {name!r}: one of {', '.join(SET_NAMES)}")
    entry = _read()["sets"][name]
    prompts = tuple(entry["prompts"])
    if digest(list(prompts)) != entry["sha256"]:
        raise ReskipError(f"the chat prompt set {name!r} in the installed package does not match its sha256: "
                          "reinstall reskip")
    return PromptSet(name, prompts, entry["sha256"], entry.get("seed"))


def held_out_keys() -> set[str]:
    """The normalised text of every held-out prompt (both sets): healing data never holds one."""
    return {normalized(p) for name in SET_NAMES for p in prompt_set(name).prompts}
