"""What the report says of a compressed model beside its original: fidelity to it (KL per position, top-1
agreement) and perplexity on the data's test split and on text no stage saw, and multiple-choice accuracy retained.
Scored by the one evaluator (`evaluate.methods`): the original is the reference (a retrofit at c = 0 *is* the
backbone, bit for bit), the compressed folder one `export:DIR` method scored against it."""

from __future__ import annotations

from pathlib import Path

from ..evaluate.against_backbone import Reference
from ..evaluate.generation import PROMPTS, agreement, greedy_continuations
from ..evaluate.multiple_choice import load_benchmark, mc_accuracy
from ..skip.spec import Spec
from .options import CompressOptions

FIELDS = ("ppl", "ppl_ratio", "kl_to_backbone", "top1_agreement", "flops_executed_share", "per_sequence")


def measure(o: CompressOptions, folder: Path, seq_len: int, show=print) -> dict:
    """The compressed folder against the original on the test split, each held-out source and MMLU, in sequences of
    `seq_len` tokens (the healing's)."""
    ref = Reference.load(o.model, o.dtype, o.device, o.trust_remote_code, o.block_size)
    methods = ref.methods({"compressed": Spec("export", "compressed", run=str(folder))})
    compressed = methods[1].scorer
    out = {"dtype": ref.context.dtype, "device": ref.context.device, "sequences": o.sequences, "seq_len": seq_len,
           "splits": {}}
    scored = ref.score(methods, {"test": list(o.data), **{h: [h] for h in o.heldout}}, o.sequences, seq_len,
                       lambda line: show(f"[compress] {line}"))
    for name, r in scored.items():
        out["splits"][name] = {"data": r["data"], "test_split": r["test_split"],
                               **{m: {k: r["rows"][m][k] for k in FIELDS} for m in ("backbone", "compressed")}}
    reference, tok = ref.reference, ref.tokenizer
    show(f"[compress] generation: greedy continuations of {len(PROMPTS)} fixed prompts by each model")
    with reference.side_channel_disabled():
        original_text = greedy_continuations(reference, tok)
    out["generation"] = agreement(tok, original_text, greedy_continuations(compressed.model, tok))
    if o.mc_limit:
        questions = load_benchmark("mmlu", o.mc_limit, 0)
        show(f"[compress] MMLU: {len(questions)} questions, each model")
        out["mmlu"] = {"original": mc_accuracy(reference, tok, questions, None, 1),  # the side-channel off
                       "compressed": mc_accuracy(compressed.model, tok, questions, None, 1)}
    return out
