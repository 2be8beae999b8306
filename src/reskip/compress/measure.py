"""What the report says of a compressed model beside its original: fidelity to it (KL per position, top-1
agreement) and perplexity on the data's test split and on text no stage saw, and multiple-choice accuracy retained.
Scored by the one evaluator (`evaluate.methods`): the original is the reference (a retrofit at c = 0 *is* the
backbone, bit for bit), the compressed folder one `export:DIR` method scored against it."""

from __future__ import annotations

from pathlib import Path

from ..ar_retrofit.config import RetrofitConfig
from ..ar_retrofit.model import retrofit
from ..backbones.devices import device_name, model_device
from ..backbones.dtypes import resolve_dtype_name
from ..backbones.loading import load_backbone
from ..data.packing import pack
from ..data.sources import load_splits
from ..evaluate.generation import PROMPTS, agreement, greedy_continuations
from ..evaluate.methods import Method, evaluate_methods, open_scorers
from ..evaluate.multiple_choice import load_benchmark, mc_accuracy
from ..evaluate.scorers import ScorerContext
from ..skip.spec import Spec
from .options import CompressOptions

FIELDS = ("ppl", "ppl_ratio", "kl_to_backbone", "top1_agreement", "flops_executed_share", "per_sequence")


def measure(o: CompressOptions, folder: Path, seq_len: int, show=print) -> dict:
    """The compressed folder against the original on the test split, each held-out source and MMLU, in sequences of
    `seq_len` tokens (the healing's)."""
    backbone, tok = load_backbone(o.model, o.dtype, o.trust_remote_code, o.device)
    reference = retrofit(backbone, RetrofitConfig(block_size=o.block_size, skip_path="identity"))
    reference.set_curriculum(0.0)  # the original, bit for bit; its side-channel is never used
    dtype, device = resolve_dtype_name(next(backbone.parameters()).dtype), device_name(model_device(backbone))
    methods = [Method("backbone", None, Spec("backbone", "backbone")),
               Method("compressed", None, Spec("export", "compressed", run=str(folder)))]
    ctx = ScorerContext(o.model, dtype, device, o.trust_remote_code, [list(b) for b in reference.blocks],
                        lambda: None)
    compressed = open_scorers(methods, ctx)["compressed"]
    out = {"dtype": dtype, "device": device, "sequences": o.sequences, "seq_len": seq_len, "splits": {}}
    sources = {"test": o.data, **{h: [h] for h in o.heldout}}
    for name, specs in sources.items():
        docs, record = load_splits(list(specs))
        data = pack(tok, docs["test"], seq_len, o.sequences, seed=0)
        show(f"[compress] scoring the original and the compressed model on {len(data)} sequences of {name}")
        r = evaluate_methods(reference, data, methods, window=1, chunk_size=seq_len)
        out["splits"][name] = {"data": list(specs), "test_split": record["splits"]["test"],
                               **{m: {k: r[m][k] for k in FIELDS} for m in ("backbone", "compressed")}}
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
