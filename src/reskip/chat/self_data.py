"""Healing data the original writes itself: conversations it writes from its own chat template (a request sampled
Magpie-style, then its reply), or the user's own prompts answered by it. Written batch by batch into a folder with
the seed and settings, so that a killed run resumes where it stopped and a finished one is read back:

    FOLDER/settings.json   what was asked (settings, the model's fingerprint, the held-out sets' sha256)
    FOLDER/batches.jsonl   one line per finished batch: {"batch": i, "conversations": [...], "asked": n}
    FOLDER/<source>.jsonl  the chat JSONL healing reads (`{"messages": [...], "open_end": bool}` a line), written
                           once every batch is done, with FOLDER/summary.json (conversations, tokens, dropped)

Each batch is a pure function of (seed, batch index), and a request already kept (or one of the held-out chat prompt
sets, `prompt_sets.held_out_keys`) is dropped, so the folder is the same however often it was resumed. A reply cut at
the token limit is kept with `open_end`: healing never teaches the model to stop there."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

from ..ar_retrofit.adapter_io import fingerprint
from ..data.packing import chat_tokens
from ..errors import ReskipError
from ..io_atomic import atomic_write_json, atomic_write_text
from ..progress import Progress
from ..reading import read_json
from .prompt_sets import digest, held_out_keys
from .sampling import Sampling, batch_seed, write_batch
from .template import end_of_turn_ids, normalized, prompt_text, require_chat_template, user_turn_prefix
from .user_turns import USER_SAMPLING, keep

SETTINGS, BATCHES, SUMMARY = "settings.json", "batches.jsonl", "summary.json"
OWN_SOURCES = ("self", "prompts")  # the data sources of the conversations the original wrote (`source_name`)
REPLY_MODES = ("sample", "greedy")


@dataclass(frozen=True)
class SelfDataSettings:
    """How the original writes its healing conversations."""

    conversations: int  # how many to keep (the user's prompts: at most this many of them)
    seed: int = 1  # never a held-out prompt set's (7001, 7002)
    reply: str = "sample"  # sample (at reply_temperature, top-p 0.95) or greedy
    reply_temperature: float = 0.7
    reply_tokens: int = 192
    batch_size: int = 32
    prompts_sha256: str | None = None  # the user's own prompts answered (None: requests it writes itself)

    def reply_sampling(self) -> Sampling:
        if self.reply == "greedy":
            return Sampling(max_new_tokens=self.reply_tokens)
        return Sampling(self.reply_temperature, 0.95, self.reply_tokens)


def source_name(settings: SelfDataSettings) -> str:
    """The data source the conversations form in the healing mix (the chat JSONL's file stem)."""
    return "self" if settings.prompts_sha256 is None else "prompts"


def data_file(folder: Path, settings: SelfDataSettings) -> Path:
    return folder / f"{source_name(settings)}.jsonl"


def check_folder(folder: Path, identity: dict) -> None:
    """The folder is new, or holds conversations written with exactly these settings by this model."""
    path = folder / SETTINGS
    if path.is_file() and read_json(path) != identity:
        raise ReskipError(f"{folder} holds conversations written with other settings or by another model: remove it "
                          "or choose another output folder")


def _done_batches(folder: Path) -> list[dict]:
    """The finished batches (a last line cut by a kill is dropped)."""
    path = folder / BATCHES
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            break
        if not isinstance(row, dict) or row.get("batch") != len(out):
            break
        out.append(row)
    return out


def _requests(model, tokenizer, settings: SelfDataSettings, index: int, seen: set[str],
              prompts: list[str] | None) -> tuple[list[str], int]:
    """Batch `index`'s kept requests and how many were asked: sampled by the model, or the user's next prompts."""
    if prompts is not None:
        chunk = prompts[index * settings.batch_size: (index + 1) * settings.batch_size]
        kept = []
        for p in chunk:
            if normalized(p) not in seen:
                seen.add(normalized(p))
                kept.append(p)
        return kept, len(chunk)
    prefix = user_turn_prefix(tokenizer)
    written = write_batch(model, tokenizer, [prefix] * settings.batch_size, USER_SAMPLING,
                          end_of_turn_ids(tokenizer), batch_seed(settings.seed, 2 * index))
    return [t for t in (keep(tokenizer, w, seen) for w in written) if t is not None], settings.batch_size


def _conversations(model, tokenizer, settings: SelfDataSettings, index: int, requests: list[str]) -> list[dict]:
    """The original's reply to each request of batch `index` (its replies drawn from stream 2 * index + 1)."""
    if not requests:
        return []
    replies = write_batch(model, tokenizer, [prompt_text(tokenizer, r) for r in requests], settings.reply_sampling(),
                          end_of_turn_ids(tokenizer), batch_seed(settings.seed, 2 * index + 1))
    return [{"messages": [{"role": "user", "content": r},
                          {"role": "assistant", "content": tokenizer.decode(w.ids, skip_special_tokens=True).strip()}],
             "open_end": not w.ended, "reply_tokens": len(w.ids)} for r, w in zip(requests, replies)]


def write_self_data(model, tokenizer, folder: Path, settings: SelfDataSettings, prompts: list[str] | None = None,
                    show_progress: bool = True, show=print) -> Path:
    """Write (or resume, or read back) the conversations into `folder`; returns the chat JSONL healing reads."""
    require_chat_template(tokenizer, "healing on the model's own conversations")
    if prompts is not None and digest(prompts) != settings.prompts_sha256:
        raise ValueError("settings.prompts_sha256 must be the digest of the prompts answered")
    out = data_file(folder, settings)
    identity = {"settings": dataclasses.asdict(settings), "model": fingerprint(model),
                "held_out": digest(sorted(held_out_keys()))}
    check_folder(folder, identity)
    if out.is_file() and (folder / SUMMARY).is_file():  # finished: read back
        return out
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / SETTINGS, identity)
    done = _done_batches(folder)
    with open(folder / BATCHES, "w", encoding="utf-8") as f:  # rewritten without a line a kill may have cut
        f.writelines(json.dumps(b) + "\n" for b in done)
    seen = held_out_keys()
    n_held = len(seen)
    kept = [c for b in done for c in b["conversations"]]
    seen |= {normalized(c["messages"][0]["content"]) for c in kept}
    target = settings.conversations if prompts is None else min(settings.conversations, len(prompts))
    what = "requests it writes itself" if prompts is None else "your prompts"
    show(f"[data] the original writes {target} conversations ({what}, replies {settings.reply}, up to "
         f"{settings.reply_tokens} tokens) into {folder}" + (f"; resuming after {len(kept)}" if kept else ""))
    index, asked = len(done), sum(b["asked"] for b in done)
    with Progress(target, "data: conversations", unit="conv", initial=min(len(kept), target),
                  enabled=show_progress) as bar, open(folder / BATCHES, "a", encoding="utf-8") as f:
        while len(kept) < target:
            if prompts is not None and index * settings.batch_size >= len(prompts):
                break
            t0 = time.time()
            requests, n = _requests(model, tokenizer, settings, index, seen, prompts)
            new = _conversations(model, tokenizer, settings, index, requests[: target - len(kept)])
            done.append({"batch": index, "conversations": new, "asked": n, "seconds": round(time.time() - t0, 2)})
            f.write(json.dumps(done[-1]) + "\n")
            f.flush()
            kept += new
            asked += n
            index += 1
            bar.update(len(new))
            if prompts is None and index > 50 and len(kept) < index * settings.batch_size // 20:
                raise ReskipError("the model writes almost no usable requests from its chat template (fewer than 1 "
                                  "in 20 kept): give your own prompts instead")
    lines = [json.dumps({"messages": c["messages"], "open_end": c["open_end"]}, ensure_ascii=False) for c in kept]
    tokens = sum(len(chat_tokens(tokenizer, c["messages"], c["open_end"])[0]) for c in kept)
    atomic_write_text(out, "\n".join(lines) + "\n")
    atomic_write_json(folder / SUMMARY, {"conversations": len(kept), "tokens": tokens, "asked": asked,
                                         "held_out_prompts": n_held, "open_end": sum(c["open_end"] for c in kept),
                                         "reply_tokens": sum(c["reply_tokens"] for c in kept),
                                         "wall_s": round(sum(b.get("seconds", 0.0) for b in done), 1),
                                         "source": source_name(settings)})
    return out
