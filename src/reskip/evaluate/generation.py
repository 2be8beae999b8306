"""Generation agreement: does a method write what the backbone writes? Greedy continuations of fixed prompts by the
backbone and by the method, compared token by token: the share of each continuation's tokens equal to the
backbone's before the first divergence, and the share of prompts whose first sentence comes out the same.

The prompts (`PROMPTS`) are sixteen short instructions of the kinds the bundled mix holds (explanation, advice,
code, story, facts, reasoning), each put through the tokenizer's chat template when it has one, so an instruct
model answers as it is deployed. Greedy decoding with the KV cache, `max_new_tokens` new tokens, a batch at once
(left padding); a model that stops early (end of sequence) is compared on what it wrote.
"""

from __future__ import annotations

import re

import torch

from ..backbones.devices import model_device

PROMPTS = (
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
SENTENCE_END = re.compile(r"[.!?\n]")


def _inputs(tokenizer, prompts) -> dict:
    texts = []
    for p in prompts:
        if getattr(tokenizer, "chat_template", None):
            texts.append(tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                       add_generation_prompt=True))
        else:
            texts.append(p)
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    pad = tokenizer.pad_token
    if pad is None:
        tokenizer.pad_token = tokenizer.eos_token
    try:
        return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side, tokenizer.pad_token = side, pad


@torch.no_grad()
def greedy_continuations(model, tokenizer, prompts=PROMPTS, max_new_tokens: int = 48) -> list[list[int]]:
    """Each prompt's greedy continuation (token ids, up to and without the end-of-sequence token) by a plain or
    PEFT model (its own `generate`, the KV cache on)."""
    batch = {k: v.to(model_device(model)) for k, v in _inputs(tokenizer, prompts).items()}
    out = model.generate(**batch, do_sample=False, max_new_tokens=max_new_tokens,
                         pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    new = out[:, batch["input_ids"].shape[1]:].tolist()  # (P, <= max_new_tokens)
    eos = tokenizer.eos_token_id
    return [row[: row.index(eos)] if eos in row else row for row in new]


def first_sentence(tokenizer, ids: list[int]) -> str:
    text = tokenizer.decode(ids, skip_special_tokens=True).strip()
    m = SENTENCE_END.search(text)
    return text[: m.end()] if m else text


def agreement(tokenizer, reference: list[list[int]], other: list[list[int]]) -> dict:
    """Per prompt: tokens equal to the reference's before the first divergence, as a share of the reference's
    continuation; and whether the first sentences are the same text. Means over prompts."""
    prefix, same = [], []
    for a, b in zip(reference, other):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefix.append(n / max(1, len(a), len(b)))  # 1 only when the two continuations are the same
        same.append(first_sentence(tokenizer, a) == first_sentence(tokenizer, b))
    return {"prompts": len(reference), "prefix_share": sum(prefix) / len(prefix),
            "same_first_sentence": sum(same) / len(same), "per_prompt_prefix": prefix}
