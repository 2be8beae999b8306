"""The compressed model's speed against the original's, where users run it first (transformers): decode at batch 1
and 8 (greedy `generate`, the KV cache on) and a 512-token prefill, each the median of interleaved repeats after a
warm-up, beside the FLOP-ideal speed-up (the LM head counted: at 135M parameters it is a large share)."""

from __future__ import annotations

import statistics
import time

import torch

from ..evaluate.flops import LayerFlops
from ..machine_load import load_average, load_report, spread

DECODE_TOKENS = 32
PROMPT_TOKENS = 16
PREFILL_TOKENS = 512


def weight_flops_per_token(config) -> int:
    """Per token: every decoder layer's weight matrices and the LM head (2 FLOPs per multiply-add)."""
    return config.num_hidden_layers * LayerFlops.of(config).full + 2 * config.vocab_size * config.hidden_size


@torch.no_grad()
def _decode(model, batch: int, vocab: int) -> float:
    ids = torch.randint(3, vocab, (batch, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    model.generate(ids.to(model.device), attention_mask=torch.ones_like(ids).to(model.device), do_sample=False,
                   max_new_tokens=DECODE_TOKENS, min_new_tokens=DECODE_TOKENS, pad_token_id=0)
    return batch * DECODE_TOKENS / (time.perf_counter() - t0)


@torch.no_grad()
def _prefill(model, vocab: int) -> float:
    ids = torch.randint(3, vocab, (1, PREFILL_TOKENS), generator=torch.Generator().manual_seed(0)).to(model.device)
    t0 = time.perf_counter()
    model(input_ids=ids, use_cache=False, logits_to_keep=1)
    return PREFILL_TOKENS / (time.perf_counter() - t0)


def compare_speed(original, compressed, repeats: int = 3, show=print) -> dict:
    """Tokens per second of both models, interleaved (original, compressed, original, ...) after one warm-up
    each, and their ratio beside the FLOP-ideal: the median, and the spread of the per-round ratios; the machine's
    load around it (`machine_load`: a timing taken while other processes held the cores is marked unreadable)."""
    vocab = original.config.vocab_size
    cases = {"decode batch 1": lambda m: _decode(m, 1, vocab), "decode batch 8": lambda m: _decode(m, 8, vocab),
             "prefill 512": lambda m: _prefill(m, vocab)}
    ideal = weight_flops_per_token(original.config) / weight_flops_per_token(compressed.config)
    out = {"flop_ideal_speedup": ideal, "repeats": repeats, "threads": torch.get_num_threads(), "cases": {}}
    before = load_average()
    for name, run in cases.items():
        show(f"[compress] timing {name}")
        run(original), run(compressed)  # warm-up
        a, b = [], []
        for _ in range(repeats):
            a.append(run(original))
            b.append(run(compressed))
        speedup = statistics.median(b) / statistics.median(a)
        out["cases"][name] = {"original_tokens_per_s": statistics.median(a),
                              "compressed_tokens_per_s": statistics.median(b), "speedup": speedup,
                              "speedup_rounds": spread([y / x for x, y in zip(a, b)]),
                              "share_of_ideal": speedup / ideal}
    out["load"] = load_report(before, load_average(), out["threads"])
    if out["load"]["note"]:
        show(f"[compress] note: {out['load']['note']}")
    return out
