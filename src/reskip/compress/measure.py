"""What the report says of a compressed model beside its original: fidelity on the original's own replies to held-out
chat prompts (`evaluate.chat_fidelity`: teacher-forced KL and top-1 on the reply tokens, greedy agreement, reply
loops; in float32), fidelity (KL per position, top-1 agreement) and perplexity on the data's test split and on text
no stage saw, and multiple-choice accuracy where the original scores above chance. Scored by the one evaluator
(`evaluate.methods`): the original is the reference (a retrofit at c = 0 *is* the backbone, bit for bit), the
compressed folder one `export:DIR` method scored against it."""

from __future__ import annotations

import math
from pathlib import Path

from ..chat.prompt_sets import prompt_set
from ..chat.template import has_chat_template
from ..evaluate.against_backbone import Reference
from ..evaluate.multiple_choice import load_benchmark, mc_accuracy
from ..skip.spec import Spec
from .options import CompressOptions

FIELDS = ("ppl", "ppl_ratio", "kl_to_backbone", "top1_agreement", "flops_executed_share", "per_sequence")


def above_chance(acc: float, chance: float, n: int) -> bool:
    """Accuracy more than two binomial standard errors above chance: a benchmark the model answers at all."""
    return acc > chance + 2 * math.sqrt(chance * (1 - chance) / max(n, 1))


def measure(o: CompressOptions, folder: Path, seq_len: int, test_specs: list[str], show=print) -> dict:
    """The compressed folder against the original: on its replies to `o.chat_prompts` held-out chat prompts, on the
    test split of `test_specs` and each held-out source in sequences of `seq_len` tokens (the healing's), and on MMLU."""
    out = {"sequences": o.sequences, "seq_len": seq_len, "splits": {}}
    ref = Reference.load(o.model, o.dtype, o.device, o.trust_remote_code, o.block_size)
    methods = ref.methods({"compressed": Spec("export", "compressed", run=str(folder))})
    compressed = methods[1].scorer
    out.update(dtype=ref.context.dtype, device=ref.context.device)
    # raw text: the text data's test split (none when healing read only conversations: the chat measure is the
    # in-domain one then) and every held-out source
    sources = {**({"test": list(test_specs)} if test_specs else {}), **{h: [h] for h in o.heldout}}
    scored = ref.score(methods, sources, o.sequences, seq_len, lambda line: show(f"[compress] {line}"))
    for name, r in scored.items():
        out["splits"][name] = {"data": r["data"], "test_split": r["test_split"],
                               **{m: {k: r["rows"][m][k] for k in FIELDS} for m in ("backbone", "compressed")}}
    if o.chat_prompts and not has_chat_template(ref.tokenizer):
        out["chat_skipped"] = "the model's tokenizer has no chat template: there are no chat replies to compare"
    elif o.chat_prompts:
        ref32 = Reference.load(o.model, "float32", o.device, o.trust_remote_code, o.block_size)
        out["chat"] = ref32.chat(ref32.methods({"compressed": Spec("export", "compressed", run=str(folder))}),
                                 prompt_set("test").first(o.chat_prompts), show_progress=not o.quiet,
                                 show=lambda line: show(f"[compress] {line}"))
        del ref32
    if o.mc_limit:
        questions = load_benchmark("mmlu", o.mc_limit, 0)
        show(f"[compress] MMLU: {len(questions)} questions, the original")
        with ref.reference.side_channel_disabled():
            original = mc_accuracy(ref.reference, ref.tokenizer, questions, None, 1)
        out["mmlu"] = {"original": original, "above_chance": above_chance(original["acc"], original["chance"],
                                                                          original["n"])}
        if out["mmlu"]["above_chance"]:
            show("[compress] MMLU: the compressed model")
            out["mmlu"]["compressed"] = mc_accuracy(compressed.model, ref.tokenizer, questions, None, 1)
    return out
