"""Chat fidelity: does a method answer as the original does, behind a chat endpoint? Measured on the original's own
greedy replies to a held-out chat prompt set (`chat.prompt_sets`), on reply tokens only:

- teacher-forced on the original's reply (its prompt through the chat template, then its reply and the token that
  ended it): KL(original || method) per reply position and top-1 agreement with the original, by the one evaluator
  (`methods.evaluate_methods` with `positions="labelled"`), so every kind of method has the same columns;
- free-running: the method's own greedy reply beside the original's: the share of the reply before the first
  divergence (of the longer of the two; ending where the original ends counts as agreeing), the first 32 tokens
  identical, the same first sentence, and a reply loop (`loops`) where the original's reply has none;
- 95% bootstrap intervals over prompts for each.

The whole measure runs in float32: greedy decoding in bfloat16 depends on the batch's shape (the original's own
replies change with it, `chat.sampling`), so agreement there measures rounding as much as the model. In float32 the
original's greedy replies are the same batched or one at a time, so they are computed once per model and cached
(`chat.reply_cache`), and each method may decode in batches or one prompt at a time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..ar_retrofit.adapter_io import fingerprint
from ..backbones.devices import device_name, model_device
from ..backbones.dtypes import resolve_dtype_name
from ..chat.prompt_sets import PromptSet
from ..chat.reply_cache import read_replies, write_replies
from ..chat.sampling import Sampling, Written, write_all
from ..chat.template import end_of_turn_ids, prompt_text
from ..data.packing import IGNORE, Packed
from ..statistics import bootstrap_mean
from .generation import first_sentence
from .loops import loops
from .methods import evaluate_methods

REPLY_TOKENS = 128  # the original's reply length (new tokens) the measure reads
FIRST_TOKENS = 32
BATCH = 16  # prompts decoded together (left-padded): float32 decoding is the same at any batch


@dataclass
class OriginalReplies:
    """The original's greedy replies to `prompts` (`replies[i]` answers `prompts.prompts[i]`), each prompt's token
    ids as the model is asked it, and how they were made."""

    prompts: PromptSet
    prompt_ids: list[list[int]]
    replies: list[Written]
    max_new_tokens: int
    key: dict

    def texts(self, tokenizer) -> list[str]:
        return [prompt_text(tokenizer, p) for p in self.prompts.prompts]


def original_replies(original, tokenizer, prompts: PromptSet, max_new_tokens: int = REPLY_TOKENS,
                     batch_size: int = BATCH, show_progress: bool = True) -> OriginalReplies:
    """The original's (a plain model in float32) greedy replies, from the cache when it holds them."""
    dtype = resolve_dtype_name(next(original.parameters()).dtype)
    key = {"model": fingerprint(original), "prompts": prompts.digest, "max_new_tokens": max_new_tokens,
           "dtype": dtype, "device": device_name(model_device(original)).split(":")[0]}
    texts = [prompt_text(tokenizer, p) for p in prompts.prompts]
    ids = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    replies = read_replies(key)
    if replies is None or len(replies) != len(texts):
        replies = write_all(original, tokenizer, texts, Sampling(max_new_tokens=max_new_tokens),
                            end_of_turn_ids(tokenizer), batch_size=batch_size, desc="chat: the original's replies",
                            show_progress=show_progress)
        write_replies(key, replies)
    return OriginalReplies(prompts, ids, replies, max_new_tokens, key)


def reply_sequences(replies: OriginalReplies, pad_id: int) -> Packed:
    """Each prompt and the original's reply as one right-padded row (N, T): labels on the reply's tokens and the token
    that ended it (IGNORE on the prompt and the padding), so the scored positions are the reply's."""
    rows = [p + r.tokens for p, r in zip(replies.prompt_ids, replies.replies)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for i, (p, r) in enumerate(zip(replies.prompt_ids, replies.replies)):
        ids[i, : len(p) + len(r.tokens)] = torch.tensor(p + r.tokens)
        labels[i, len(p): len(p) + len(r.tokens)] = torch.tensor(r.tokens)
    return Packed(ids, labels, ["chat"] * len(rows))


def greedy_per_prompt(tokenizer, original: list[Written], other: list[Written]) -> dict[str, list[float]]:
    """Per prompt: the share of the reply before the first divergence, the first `FIRST_TOKENS` identical, the same
    first sentence, identical replies, whether the method's reply loops, and whether it loops where the original's
    does not."""
    out = {k: [] for k in ("prefix", "first32", "same_sentence", "identical", "loops", "new_loop")}
    for a, b in zip(original, other):
        ta, tb = a.tokens, b.tokens
        n = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
        out["prefix"].append(n / max(1, len(ta), len(tb)))  # 1 only when the two replies are the same
        out["first32"].append(float(ta[:FIRST_TOKENS] == tb[:FIRST_TOKENS]))
        out["same_sentence"].append(float(first_sentence(tokenizer, a.ids) == first_sentence(tokenizer, b.ids)))
        out["identical"].append(float(ta == tb))
        out["loops"].append(float(loops(b.ids)))
        out["new_loop"].append(float(loops(b.ids) and not loops(a.ids)))
    return out


def chat_row(scored: dict, greedy: dict[str, list[float]], replies: list[str] | None = None) -> dict:
    """One method's chat columns with their 95% intervals over prompts, from the evaluator's row on the reply
    positions (`scored`) and the greedy comparison per prompt."""
    seq = scored["per_sequence"]
    positions = np.array(seq["positions"], float)
    row = {"kl": bootstrap_mean(np.array(seq["kl"], float), positions),
           "top1": bootstrap_mean(np.array(seq["agree"], float), positions),
           "reply_tokens": int(positions.sum()), "prompts": len(positions),
           **{k: bootstrap_mean(np.array(v, float)) for k, v in greedy.items()},
           "per_prompt": {"kl": seq["kl"], "agree": seq["agree"], "positions": seq["positions"], **greedy}}
    if replies is not None:
        row["replies"] = replies
    return row


def chat_rows(model, tokenizer, original: OriginalReplies, methods: list, write: Callable, window: int = 1,
              chunk_size: int = 32, reference=None, show=print) -> dict[str, dict]:
    """Every method's chat row: teacher-forced by the evaluator on the original's replies (`model`: the ReskipModel
    the evaluator drives; `reference`: the original when it is another model), and its own greedy replies from
    `write(method) -> list[Written]` (the `backbone` row reads the original's own)."""
    data = reply_sequences(original, tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                           else original.replies[0].stop or 0)
    show(f"chat: {len(methods)} methods teacher-forced on the original's replies to {len(data)} prompts")
    scored = evaluate_methods(model, data, methods, window, chunk_size, reference=reference, positions="labelled")
    out = {}
    for m in methods:
        mine = original.replies if m.is_backbone else write(m)
        greedy = greedy_per_prompt(tokenizer, original.replies, mine)
        out[m.name] = chat_row(scored[m.name], greedy, [tokenizer.decode(w.ids, skip_special_tokens=True)
                                                        for w in mine])
    return out


def chat_summary(original: OriginalReplies, tokenizer, rows: dict[str, dict]) -> dict:
    """What results files keep of a chat measure: the prompt set, the reply length, the original's replies (text) and
    how many of them loop, and every method's row."""
    return {"prompt_set": original.prompts.name, "prompts": len(original.prompts), "sha256": original.prompts.digest,
            "max_new_tokens": original.max_new_tokens, "dtype": original.key["dtype"],
            "prompt_texts": list(original.prompts.prompts),
            "original_replies": [tokenizer.decode(w.ids, skip_special_tokens=True) for w in original.replies],
            "original_loops": sum(loops(w.ids) for w in original.replies),
            "original_ended": sum(w.ended for w in original.replies), "methods": rows}
