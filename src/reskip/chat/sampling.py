"""Batched generation from a chat model: what it writes after a list of texts, sampled or greedy, `batch_size` texts
at a time with left padding, with a progress bar. Each batch's draws are a pure function of (seed, batch index), so
a caller that stops between batches and starts again gets the same text (resumable caches rely on it).

Greedy decoding in bfloat16 depends on the batch's shape: on SmolLM2-135M-Instruct the original's own greedy replies
to sixteen prompts were the same first sentence on only 12-13 of 16 when batched 16, 8 or 1 at a time (in float32:
16 of 16, identical). Measures of greedy agreement therefore decode in float32 (`evaluate.chat_fidelity`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..backbones.devices import model_device
from ..progress import Progress


@dataclass(frozen=True)
class Sampling:
    """How the model writes: temperature 0 is greedy; otherwise nucleus sampling at `top_p`."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 128

    def kwargs(self) -> dict:
        if self.temperature == 0:
            return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        return {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p, "top_k": None}


@dataclass
class Written:
    """What the model wrote after one text: token ids without the token that ended it, and that stop token (None:
    it reached `max_new_tokens`)."""

    ids: list[int]
    stop: int | None

    @property
    def ended(self) -> bool:
        return self.stop is not None

    @property
    def tokens(self) -> list[int]:
        """The ids with the stop token that ended them: ending where another reply ends is part of agreeing."""
        return self.ids + ([self.stop] if self.stop is not None else [])


def batch_seed(seed: int, index: int) -> int:
    """The RNG seed of batch `index` of a run seeded `seed` (distinct runs draw distinct streams)."""
    return (seed * 1_000_003 + index) % (2**63)


@torch.no_grad()
def write_batch(model, tokenizer, texts: list[str], sampling: Sampling, stop_ids: list[int],
                seed: int | None = None) -> list[Written]:
    """The model's continuation of each text (one batch, left-padded), cut at the first stop token. The process's
    random state is left as it was."""
    device = model_device(model)
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    finally:
        tokenizer.padding_side = side
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    was = model.training
    model.eval()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        if seed is not None:
            torch.manual_seed(seed)
        out = model.generate(**enc, max_new_tokens=sampling.max_new_tokens, eos_token_id=stop_ids, pad_token_id=pad,
                             **sampling.kwargs())
    model.train(was)
    stops = set(stop_ids)
    written = []
    for row in out[:, enc.input_ids.shape[1]:].tolist():
        end = next((i for i, t in enumerate(row) if t in stops), None)
        written.append(Written(row, None) if end is None else Written(row[:end], row[end]))
    return written


def write_all(model, tokenizer, texts: list[str], sampling: Sampling, stop_ids: list[int], seed: int | None = None,
              batch_size: int = 16, desc: str = "generate", show_progress: bool = True) -> list[Written]:
    """`write_batch` over every text, `batch_size` at a time, in order (batch i seeded `batch_seed(seed, i)`)."""
    out: list[Written] = []
    with Progress(len(texts), desc, unit="text", enabled=show_progress) as bar:
        for i in range(0, len(texts), batch_size):
            chunk = texts[i: i + batch_size]
            out += write_batch(model, tokenizer, chunk, sampling, stop_ids,
                               None if seed is None else batch_seed(seed, i // batch_size))
            bar.update(len(chunk))
    return out
