"""Requests a chat model writes itself (Magpie, Xu et al. 2024): its template up to where a user's turn starts, then
sampled until the turn ends. No data set is needed; an aligned model writes requests of the kinds it was tuned on.

A request is kept when the model ended the turn itself (not cut at the token limit), it has at least `MIN_WORDS`
words and at most `MAX_CHARS` characters, and its normalised text (`template.normalized`) is new: neither seen in
this set nor among the texts to exclude (the held-out prompt sets, when healing data is written)."""

from __future__ import annotations

from .sampling import Sampling, Written, write_batch
from .template import end_of_turn_ids, normalized, user_turn_prefix

USER_SAMPLING = Sampling(temperature=1.0, top_p=0.95, max_new_tokens=96)
MIN_WORDS, MAX_CHARS = 3, 600


def sample_user_batch(model, tokenizer, batch_size: int, seed: int, sampling: Sampling = USER_SAMPLING) -> list[Written]:
    """One batch of `batch_size` requests the model writes from its template's user-turn prefix."""
    prefix = user_turn_prefix(tokenizer)
    return write_batch(model, tokenizer, [prefix] * batch_size, sampling, end_of_turn_ids(tokenizer), seed)


def keep(tokenizer, written: Written, seen: set[str]) -> str | None:
    """The request's text if it is kept (and its normalised form added to `seen`), else None."""
    text = tokenizer.decode(written.ids, skip_special_tokens=True).strip()
    key = normalized(text)
    if not written.ended or len(text.split()) < MIN_WORDS or len(text) > MAX_CHARS or not key or key in seen:
        return None
    seen.add(key)
    return text
