"""Tokens/s of the retrofit training step in float32 and in the `auto` dtype, beside plain forward + backward.

Both dtypes in one process, interleaved, after warm-up; median of repeats. Prints one JSON line.
One repeat is a cycle over every drawable block (the skip branch's cost depends on the block it
drops: it reruns the blocks after it), so each dtype is timed on the same mix of steps.
Per dtype:
  frozen   - forward + CE + backward through the frozen backbone (gradients reach the input
             embeddings only): the backward work a frozen backbone can do at all;
  retrofit - the default recipe's step: teacher pass, full path, shared-prefix skip branch, every
             loss term (CE and KL from the LM head in chunks of `--loss-chunk` positions) and backward.
With `--variants`, also the step from whole (B, T, V) logits and with activation checkpointing.

    python benchmarks/train_throughput.py [--model M] [--batch 8] [--seq-len 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch

from reskip import load_backbone, retrofit
from reskip.backbones.dtypes import resolve_dtype_name
from reskip.data.packing import pack
from reskip.data.sources import load_splits
from reskip.train_config import TrainConfig
from reskip.train.objective import RetrofitObjective


def steps_of(model_name, dtype: str, batch: int, seq_len: int, loss_chunk: int, variants: bool) -> dict:
    """name -> a function running one cycle of that step over the drawable blocks, for one dtype."""
    torch.manual_seed(0)
    model, tok = load_backbone(model_name, dtype)
    splits, _ = load_splits(["default"])
    data = pack(tok, splits["train"], seq_len, batch, seed=0)
    ids, labels = data.input_ids, data.labels
    n_tokens = ids.numel()
    embed = model.get_input_embeddings()
    recipe = TrainConfig(loss_chunk=loss_chunk)
    rm = retrofit(model, recipe.retrofit_config())
    rm.set_curriculum(1.0)
    drawable = list(range(2, rm.n_blocks))

    def frozen_cycle():
        with rm.side_channel_disabled():
            for _ in drawable:
                x = embed(ids).detach().requires_grad_(True)
                rm(inputs_embeds=x, labels=labels, use_cache=False).loss.backward()

    def retrofit_cycle(cfg):
        objective = RetrofitObjective.of(rm, cfg)

        def cycle():
            for k in drawable:
                objective(ids, labels, k, 1.0 / n_tokens, 1.0 / n_tokens)["loss"].backward()
                rm.side_channel.zero_grad(set_to_none=True)
        return cycle

    steps = {"frozen": frozen_cycle, "retrofit": retrofit_cycle(recipe)}
    if variants:
        steps["whole_logits"] = retrofit_cycle(dataclasses.replace(recipe, loss_chunk=None))
        steps["recompute"] = retrofit_cycle(dataclasses.replace(recipe, recompute=True))
    return {"steps": steps, "tokens_per_cycle": n_tokens * len(drawable), "drawable": drawable}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3, help="cycles over the drawable blocks per step kind")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "auto"], choices=["float32", "bfloat16", "auto"])
    ap.add_argument("--loss-chunk", type=int, default=TrainConfig.loss_chunk, help="positions per loss chunk")
    ap.add_argument("--variants", action="store_true", help="also whole-logit and activation-checkpointing steps")
    args = ap.parse_args(argv)

    names = {d: resolve_dtype_name(d) for d in args.dtypes}
    setups = {d: steps_of(args.model, d, args.batch, args.seq_len, args.loss_chunk, args.variants) for d in args.dtypes}
    for s in setups.values():  # warm-up (compiles the fused loss where compiling is used)
        for fn in s["steps"].values():
            fn()
    times = {d: {k: [] for k in s["steps"]} for d, s in setups.items()}
    for _ in range(args.repeats):  # interleaved, so machine noise hits every dtype and step alike
        for d, s in setups.items():
            for k, fn in s["steps"].items():
                t = time.perf_counter()
                fn()
                times[d][k].append(time.perf_counter() - t)
    report = {"model": args.model or "smollm2-135m-instruct", "batch": args.batch, "seq_len": args.seq_len,
              "repeats": args.repeats, "threads": torch.get_num_threads(), "loss_chunk": args.loss_chunk,
              "skip_blocks_cycled": setups[args.dtypes[0]]["drawable"], "dtypes": names}
    for d, s in setups.items():
        for k, ts in times[d].items():
            report[f"tok_s_{k}_{d}"] = s["tokens_per_cycle"] / statistics.median(ts)
        report[f"retrofit_vs_frozen_{d}"] = statistics.median(times[d]["retrofit"]) / statistics.median(times[d]["frozen"])
    if "float32" in setups and len(setups) > 1:
        for d in setups:
            if d != "float32":
                for k in times[d]:
                    report[f"speedup_{k}_{d}_vs_float32"] = report[f"tok_s_{k}_{d}"] / report[f"tok_s_{k}_float32"]
        report["target_min_speedup_retrofit"] = 2.3
    print(json.dumps(report))


if __name__ == "__main__":
    main()
