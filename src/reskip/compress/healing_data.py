"""What `reskip compress` heals on: the text data given (`--data default`, files, folders), the conversations the
original writes itself from its chat template (`--data self` or `self:N`), and the user's own prompts answered by the
original (`--prompts FILE`). The conversations are written into the output folder (`self-data/`, `prompt-data/`,
resumable, `chat.self_data`) before healing; mixed with text, they make `--chat-share` of the training sequences,
the text sources sharing the rest equally."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..backbones.loading import load_backbone
from ..chat.prompt_sets import digest
from ..chat.self_data import SUMMARY, SelfDataSettings, source_name, write_self_data
from ..chat.user_prompts import read_prompts
from ..data.sources import load_splits
from ..errors import ReskipError
from ..reading import read_json

SELF = re.compile(r"self(?::([0-9]+))?")
SELF_CONVERSATIONS = 400  # `self` alone: what the measured default writes
MIN_ALONE = 200  # conversations healed on without text: their 3% validation and calibration splits are then not empty
MAX_CONVERSATIONS = 1_000_000
SELF_FOLDER, PROMPTS_FOLDER = "self-data", "prompt-data"


def self_conversations(data: list[str]) -> int | None:
    """N of the `self[:N]` spec among the data specs (None when there is none); one error for a bad one."""
    found = [d for d in data if d == "self" or d.startswith("self:")]
    if len(found) > 1:
        raise ReskipError(f"--data names the model's own conversations twice ({', '.join(found)}): give one self[:N]")
    if not found:
        return None
    m = SELF.fullmatch(found[0])
    if m is None or (m.group(1) is not None and not 1 <= int(m.group(1)) <= MAX_CONVERSATIONS):
        raise ReskipError(f"--data {found[0]}: write self (the model's own conversations, {SELF_CONVERSATIONS}) or "
                          f"self:N with N from 1 to {MAX_CONVERSATIONS:,}")
    return SELF_CONVERSATIONS if m.group(1) is None else int(m.group(1))


def text_specs(data: list[str]) -> list[str]:
    return [d for d in data if d != "self" and not d.startswith("self:")]


@dataclass
class HealingData:
    """The training data's specs (text specs and the written chat JSONL files), the share of each source, and what
    the original wrote (each chat folder's summary)."""

    specs: list[str]
    weights: dict[str, float] | None
    written: dict[str, dict]


def check(data: list[str], prompts: str | None, chat_share: float) -> list[str] | None:
    """Every input checked before any weights load: the self spec, the text data (their documents), the prompts file.
    Returns the prompts (None without a file)."""
    n_self = self_conversations(data)
    text = text_specs(data)
    if text:
        load_splits(text)  # data that give no documents fail here
    asked = read_prompts(Path(prompts)) if prompts is not None else None
    if n_self is None and asked is None and not text:
        raise ReskipError("--data names no data: give default (the bundled text), self, files, or --prompts FILE")
    alone = (n_self or 0) + len(asked or [])
    if not text and alone < MIN_ALONE:
        raise ReskipError(f"{alone} conversations alone: healing also validates and calibrates on them (3% of them "
                          f"each), so give {MIN_ALONE} or more (self:{MIN_ALONE}), or add text (--data self default)")
    if text and (n_self is not None or asked is not None) and not 0 < chat_share < 1:
        raise ReskipError(f"--chat-share {chat_share}: mixed with text, the conversations' share lies strictly between "
                          "0 and 1")
    return asked


def mix_weights(text: list[str], chat_sources: list[str], chat_share: float) -> dict[str, float] | None:
    """Each chat source chat_share / (their count), each text source the rest equally (None: one kind only)."""
    if not text or not chat_sources:
        return None
    _, record = load_splits(text)
    text_sources = sorted(record["splits"]["train"]["by_source"])
    clash = set(text_sources) & set(chat_sources)
    if clash:
        raise ReskipError(f"the text data has a source named {', '.join(sorted(clash))}, as the model's own "
                          "conversations are: rename that file")
    return {**{s: chat_share / len(chat_sources) for s in chat_sources},
            **{s: (1 - chat_share) / len(text_sources) for s in text_sources}}


def write_healing_data(o, dtype: str, out: Path, prompts: list[str] | None, show=print) -> HealingData:
    """Write (or read back) the conversations the options ask for into `out`; the healing's data specs and weights.
    `o`: the compress options (model, data, reply, chat_share, seed of the conversations, quiet)."""
    n_self, text = self_conversations(list(o.data)), text_specs(list(o.data))
    jobs = []
    if n_self is not None:
        jobs.append((out / SELF_FOLDER, SelfDataSettings(n_self, seed=o.data_seed, reply=o.reply), None))
    if prompts is not None:
        jobs.append((out / PROMPTS_FOLDER, SelfDataSettings(len(prompts), seed=o.data_seed, reply=o.reply,
                                                            prompts_sha256=digest(prompts)), prompts))
    files, written = [], {}
    if jobs:
        model, tok = load_backbone(o.model, dtype, o.trust_remote_code, o.device)
        for folder, settings, asked in jobs:
            files.append(write_self_data(model, tok, folder, settings, asked, show_progress=not o.quiet, show=show))
            written[source_name(settings)] = read_json(folder / SUMMARY)
        del model
    weights = mix_weights(text, list(written), o.chat_share)
    return HealingData(text + [str(f.resolve()) for f in files], weights, written)
