"""Tokenising documents and packing them into fixed-length sequences.

Plain text trains on every token. Chat documents go through the tokenizer's chat
template and train on the assistant's answers only (labels -100 elsewhere, the
role headers included). Documents are joined with EOS and cut into `seq_len` pieces.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from ..errors import ReskipError
from .documents import Document

IGNORE = -100


@dataclass
class Packed:
    input_ids: torch.Tensor  # (N, T) long
    labels: torch.Tensor  # (N, T) long, IGNORE where no loss
    sources: list[str]  # (N,) which mix part each sequence came from

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def n_tokens(self) -> int:
        return self.input_ids.numel()

    def batches(self, batch_size: int, device: torch.device | str | None = None):
        """(input_ids, labels) of `batch_size` sequences at a time, in order (the last batch may be smaller), on
        `device` (default: where they are, the host)."""
        for i in range(0, len(self), batch_size):
            ids, labels = self.input_ids[i : i + batch_size], self.labels[i : i + batch_size]
            yield (ids, labels) if device is None else (ids.to(device), labels.to(device))


def _render(tokenizer, messages, generation_prompt=False) -> str:
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    return text + ("assistant: " if generation_prompt else "")


def chat_tokens(tokenizer, messages: list[dict], open_end: bool = False) -> tuple[list[int], list[int]]:
    """Token ids and labels of one conversation; labels only on assistant content (and its end tag). An assistant
    turn that opens the conversation answers nothing: it is context, not trained (and a chat template cannot
    render the empty conversation before it). `open_end`: the last turn (an assistant's) was cut at a token limit:
    its content is trained, its end tag is not written."""
    ids, labels, done = [], [], ""

    def add(piece: str, train: bool):
        toks = tokenizer(piece, add_special_tokens=False).input_ids if piece else []
        ids.extend(toks)
        labels.extend(toks if train else [IGNORE] * len(toks))

    for i, m in enumerate(messages):
        answers = m["role"] == "assistant" and i > 0
        if answers:
            header = _render(tokenizer, messages[:i], generation_prompt=True)
            if header.startswith(done):
                add(header[len(done):], False)
                done = header
        if open_end and answers and i == len(messages) - 1 and done == header:
            add(m["content"], True)  # the reply as far as it was written: no end tag after it
            return ids, labels
        full = _render(tokenizer, messages[: i + 1])
        if not full.startswith(done):  # a template that rewrites earlier turns: train on nothing unsafe
            raise ReskipError("the chat template does not render conversations prefix by prefix; use plain text data")
        add(full[len(done):], answers)
        done = full
    return ids, labels


def document_tokens(tokenizer, doc: Document) -> tuple[list[int], list[int]]:
    if doc.messages is not None:
        ids, labels = chat_tokens(tokenizer, doc.messages, doc.open_end)
    else:
        ids = tokenizer(doc.text, add_special_tokens=False).input_ids
        labels = list(ids)
    eos = tokenizer.eos_token_id
    return ids + [eos], labels + [IGNORE if doc.open_end else eos]


def pack(tokenizer, docs: list[Document], seq_len: int, n_sequences: int | None, seed: int,
         weights: dict[str, float] | None = None) -> Packed:
    """Pack up to `n_sequences` sequences (all when None), interleaving sources by `weights`.

    Each source's documents are shuffled with `seed`, tokenised lazily and cut into
    `seq_len` pieces; the sources are then interleaved so every stretch of the stream
    holds the mix in proportion (default: equal shares). Deterministic given the arguments.
    """
    if seq_len < 2:
        raise ReskipError(f"seq_len must be >= 2, got {seq_len}")
    by_source: dict[str, list[Document]] = {}
    for d in docs:
        by_source.setdefault(d.source, []).append(d)
    if not by_source:
        raise ReskipError("the data set is empty: no documents to train on")
    names = sorted(by_source)
    weights = weights or {s: 1.0 for s in names}
    rng = random.Random(seed)
    streams = {}
    for s in names:
        order = list(by_source[s])
        rng.shuffle(order)
        streams[s] = _sequences(tokenizer, order, seq_len)
    out_ids, out_labels, out_src = [], [], []
    credit = {s: 0.0 for s in names}
    total_w = sum(weights.get(s, 0.0) for s in names)
    while streams and (n_sequences is None or len(out_ids) < n_sequences):
        for s in list(streams):
            credit[s] += weights.get(s, 0.0) / total_w
        s = max(streams, key=lambda k: (credit[k], k))
        credit[s] -= 1.0
        nxt = next(streams[s], None)
        if nxt is None:
            del streams[s]
            continue
        out_ids.append(nxt[0])
        out_labels.append(nxt[1])
        out_src.append(s)
    if not out_ids:
        raise ReskipError(f"the data holds fewer than {seq_len} tokens: nothing to pack")
    return Packed(torch.tensor(out_ids), torch.tensor(out_labels), out_src)


def _sequences(tokenizer, docs, seq_len):
    buf_ids, buf_labels = [], []
    for d in docs:
        ids, labels = document_tokens(tokenizer, d)
        buf_ids.extend(ids)
        buf_labels.extend(labels)
        while len(buf_ids) >= seq_len:
            chunk_labels = buf_labels[:seq_len]
            if any(x != IGNORE for x in chunk_labels[1:]):
                yield buf_ids[:seq_len], chunk_labels
            buf_ids, buf_labels = buf_ids[seq_len:], buf_labels[seq_len:]
