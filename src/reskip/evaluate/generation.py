"""Generation agreement: does a method write what the backbone writes? Greedy continuations of fixed prompts by the
backbone and by the method, compared token by token: the share of each continuation's tokens equal to the
backbone's before the first divergence, and the share of prompts whose first sentence comes out the same.

The prompts (`PROMPTS`) are the sixteen fixed prompts of the held-out chat prompt set (`chat.prompt_sets`), each put
through the tokenizer's chat template when it has one, so an instruct model answers as it is deployed. Greedy decoding with the KV cache, `max_new_tokens` new tokens, one prompt at a
time (no padding); a model that stops early (end of sequence) is compared on what it wrote.
"""

from __future__ import annotations

import re

import torch

from ..backbones.devices import model_device
from ..chat.prompt_sets import FIXED_PROMPTS

PROMPTS = FIXED_PROMPTS  # the held-out chat test set's first sixteen (`chat.prompt_sets`)
SENTENCE_END = re.compile(r"[.!?\n]")


def prompt_ids(tokenizer, prompts=PROMPTS) -> list[torch.Tensor]:
    """Each prompt as the model is asked it: through the chat template when the tokenizer has one; (1, T) each."""
    out = []
    for p in prompts:
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                 add_generation_prompt=True)
            out.append(tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids)
        else:
            out.append(tokenizer(p, return_tensors="pt").input_ids)
    return out


@torch.no_grad()
def continuations(generate_one, tokenizer, prompts: list[torch.Tensor], max_new_tokens: int = 48) -> list[list[int]]:
    """Each prompt's greedy continuation (token ids, up to and without the end-of-sequence token), one prompt at a
    time (no padding: every method decodes the same inputs the same way). generate_one(ids (1, T), **kwargs) ->
    (1, T + new): a plain or PEFT model's `generate`, the backbone's, or the retrofit's under a policy."""
    eos = tokenizer.eos_token_id
    out = []
    for ids in prompts:
        full = generate_one(ids, do_sample=False, max_new_tokens=max_new_tokens,
                            pad_token_id=tokenizer.pad_token_id or eos)
        row = full[0, ids.shape[1]:].tolist()
        out.append(row[: row.index(eos)] if eos in row else row)
    return out


def greedy_continuations(model, tokenizer, prompts=PROMPTS, max_new_tokens: int = 48) -> list[list[int]]:
    """A plain or PEFT model's (or a retrofit's, its own `generate`) greedy continuations of `prompts`."""
    def one(ids, **kwargs):
        ids = ids.to(model_device(model))
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)

    return continuations(one, tokenizer, prompt_ids(tokenizer, prompts), max_new_tokens)


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
            "same_first_sentence": sum(same) / len(same), "per_prompt_prefix": prefix,
            "per_prompt_same": [int(x) for x in same]}
