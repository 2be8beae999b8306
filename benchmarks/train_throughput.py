"""Tokens/s of one retrofit training step vs plain forward+backward through the backbone.

Same batch, same process, interleaved, after warm-up; median of repeats. Prints one JSON line.
Baselines:
  frozen   - forward + CE + backward through the frozen backbone (gradients reach the input
             embeddings only): the backward work a frozen backbone can do at all;
  finetune - the same with every backbone weight requiring grad (an ordinary fine-tuning step
             without the optimizer).
The retrofit step is the real objective: teacher pass, full path, shared-prefix skip branch,
the default recipe's loss terms and backward (c = 1, skip block cycling over the drawable blocks),
from whole logits, with CE and KL in chunks of `--loss-chunk` positions, and with that and activation
checkpointing of the frozen layers.

    python benchmarks/train_throughput.py [--model M] [--batch 4] [--seq-len 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch

from reskip import load_backbone, retrofit
from reskip.data.packing import pack
from reskip.data.sources import load_splits
from reskip.train.config import TrainConfig
from reskip.train.objective import RetrofitObjective


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--loss-chunk", type=int, default=64, help="positions per chunk of the chunked-loss step")
    args = ap.parse_args(argv)

    torch.manual_seed(0)
    model, tok = load_backbone(args.model)
    splits, _ = load_splits(["default"])
    data = pack(tok, splits["train"], args.seq_len, args.batch, seed=0)
    ids, labels = data.input_ids, data.labels
    n_tokens = ids.numel()
    embed = model.get_input_embeddings()

    def frozen_step():
        x = embed(ids).detach().requires_grad_(True)
        model(inputs_embeds=x, labels=labels, use_cache=False).loss.backward()

    def finetune_step():
        model.requires_grad_(True)
        model(input_ids=ids, labels=labels, use_cache=False).loss.backward()
        model.zero_grad(set_to_none=True)
        model.requires_grad_(False)

    # The default training recipe's retrofit (its skip shortcuts included) and loss weights.
    recipe = TrainConfig(retrofit={} if args.rank is None else {"rank": args.rank})
    rm = retrofit(model, recipe.retrofit_config())
    rm.set_curriculum(1.0)
    drawable = list(range(2, rm.n_blocks))

    def retrofit_steps(loss_chunk, recompute=False):
        """The default recipe's step, from whole logits or in chunks of positions."""
        objective = RetrofitObjective.of(rm, dataclasses.replace(recipe, loss_chunk=loss_chunk, recompute=recompute))
        calls = {"n": 0}

        def step():
            k = drawable[calls["n"] % len(drawable)]
            calls["n"] += 1
            terms = objective(ids, labels, k, 1.0 / n_tokens, 1.0 / n_tokens)
            terms["loss"].backward()
            rm.side_channel.zero_grad(set_to_none=True)
        return step

    retrofit_step, chunked_step = retrofit_steps(None), retrofit_steps(args.loss_chunk)
    recompute_step = retrofit_steps(args.loss_chunk, recompute=True)

    def backbone(fn):
        def run():
            with rm.side_channel_disabled():
                fn()
        return run

    for fn in (backbone(frozen_step), backbone(finetune_step), retrofit_step, chunked_step, recompute_step):  # warm-up
        fn()
    t = {"frozen": [], "finetune": [], "retrofit": [], "chunked": [], "recompute": []}
    for _ in range(args.repeats):  # interleaved so machine noise hits all five alike
        t["frozen"].append(timed(backbone(frozen_step), 1))
        t["finetune"].append(timed(backbone(finetune_step), 1))
        t["retrofit"].append(timed(retrofit_step, 1))
        t["chunked"].append(timed(chunked_step, 1))
        t["recompute"].append(timed(recompute_step, 1))
    med = {k: statistics.median(v) for k, v in t.items()}
    print(json.dumps({
        "model": args.model or "smollm2-135m-instruct",
        "batch": args.batch, "seq_len": args.seq_len, "tokens_per_step": n_tokens, "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "tok_s_frozen_fwd_bwd": n_tokens / med["frozen"],
        "tok_s_finetune_fwd_bwd": n_tokens / med["finetune"],
        "tok_s_retrofit_step": n_tokens / med["retrofit"],
        "slowdown_vs_frozen": med["retrofit"] / med["frozen"],
        "slowdown_vs_finetune": med["retrofit"] / med["finetune"],
        "loss_chunk": args.loss_chunk,
        "tok_s_retrofit_step_chunked": n_tokens / med["chunked"],
        "chunked_vs_whole_logits": med["chunked"] / med["retrofit"],
        "chunked_recompute_vs_whole_logits": med["recompute"] / med["retrofit"],
        "target_max_slowdown": 2.0,
    }))


if __name__ == "__main__":
    main()
