"""On-policy distillation (GKD, Agarwal et al. 2024; TRL's GKDTrainer): at a share of the healing steps the student
writes its own replies to chat prompts of the training data and the teacher scores them, so the student learns where
its own free-running generation goes, not only where the original's text goes (the gap that makes small students
loop).

Which steps: step s is on-policy when floor((s + 1) share) > floor(s share), a pure function of the step (the same
steps on every resume). Which prompts: `batch_size` of the pool drawn by the step's seed. The student samples at
temperature 1 (its own distribution, as GKD does) up to `reply_tokens` new tokens; each prompt and its sample become
one right-padded row whose labels are the sample's tokens (and the token that ended it), so the divergence reads the
sample's positions only. Under data-parallel every process samples the whole global batch with the same seed and
trains on its share of it."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from ..chat.sampling import Sampling, batch_seed, write_batch
from ..chat.self_data import OWN_SOURCES
from ..chat.template import end_of_turn_ids, has_chat_template
from ..data.documents import Document
from ..data.packing import IGNORE
from ..errors import ReskipError


def on_policy_step(step: int, share: float) -> bool:
    return share > 0 and math.floor((step + 1) * share) > math.floor(step * share)


@dataclass
class PromptPool:
    """Chat prompts of the training data, each as the model is asked it (its template up to the assistant's header
    for the first reply), no longer than `max_prompt_tokens`."""

    texts: list[str]
    ids: list[list[int]]


def prompt_pool(tokenizer, docs: list[Document], max_prompt_tokens: int) -> PromptPool:
    """The pool from the training split's chat documents (the turns before their first assistant reply): those of the
    model's own conversations (`self`, `prompts`: the requests it is deployed for) when the data has any, else every
    chat document (a chat JSONL of the user's, the default mix's dialogue)."""
    if not has_chat_template(tokenizer):
        raise ReskipError("on-policy healing samples chat replies: this tokenizer has no chat template")
    own = [d for d in docs if d.source in OWN_SOURCES and d.messages is not None]
    seen, texts, ids = set(), [], []
    for d in own or docs:
        if d.messages is None:
            continue
        first = next((i for i, m in enumerate(d.messages) if m["role"] == "assistant" and i > 0), None)
        if first is None:
            continue
        text = tokenizer.apply_chat_template(d.messages[:first], tokenize=False, add_generation_prompt=True)
        if text in seen:
            continue
        seen.add(text)
        row = tokenizer(text, add_special_tokens=False).input_ids
        if len(row) <= max_prompt_tokens:
            texts.append(text)
            ids.append(row)
    if not texts:
        raise ReskipError("on-policy healing needs chat prompts in the training data (chat JSONL, `self` or "
                          f"--prompts data) of at most {max_prompt_tokens} tokens; the data holds none")
    return PromptPool(texts, ids)


@torch.no_grad()
def sampled_batch(model, tokenizer, pool: PromptPool, step: int, seed: int, batch_size: int,
                  reply_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The student's samples for step `step`: (ids, labels) (B, T) on the host, right-padded, labels on the samples."""
    rng = random.Random(batch_seed(seed, step))
    picks = rng.sample(range(len(pool.texts)), batch_size) if batch_size <= len(pool.texts) else \
        [rng.randrange(len(pool.texts)) for _ in range(batch_size)]
    written = write_batch(model, tokenizer, [pool.texts[i] for i in picks], Sampling(1.0, 1.0, reply_tokens),
                          end_of_turn_ids(tokenizer), batch_seed(seed, step))
    rows = [(pool.ids[i], w.tokens) for i, w in zip(picks, written)]
    width = max(len(p) + len(r) for p, r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((batch_size, width), pad, dtype=torch.long)
    labels = torch.full((batch_size, width), IGNORE, dtype=torch.long)
    for b, (p, r) in enumerate(rows):
        ids[b, : len(p) + len(r)] = torch.tensor(p + r)
        if r:
            labels[b, len(p): len(p) + len(r)] = torch.tensor(r)
    return ids, labels
