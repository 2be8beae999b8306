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
Also per dtype: the model-FLOP utilisation of the retrofit step (`mfu_retrofit_<dtype>`: the FLOPs of the passes
the step runs, counted from the architecture, over the device's peak, `--peak-tflops` or a known GPU's), and the
side-channel's share of a training pass (`side_channel_share_<dtype>`: one forward + backward of the full path
against the same pass with the side-channel off, 1 - off/on, the median over `--pass-pairs` back-to-back pairs:
a share of a few percent is lost in the spread of a few repeats on a busy machine).

    python benchmarks/train_throughput.py [--model M] [--batch 8] [--seq-len 256] [--repeats 3]
    python benchmarks/train_throughput.py --random-config Qwen3-1.7B --device cuda --dtypes bfloat16 \
        --batch 8 --seq-len 2048  # the GPU check: random weights of a shipped architecture
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM

from reskip import load_backbone, retrofit
from reskip.backbones.architectures import architecture_config
from reskip.backbones.dtypes import resolve_dtype_name
from reskip.data.packing import pack
from reskip.data.sources import load_splits
from reskip.evaluate.flops import LayerFlops
from reskip.machine_load import load_average, load_report
from reskip.train.objective import RetrofitObjective
from reskip.train_config import TrainConfig

# bfloat16 dense peak, TFLOP/s, by the name CUDA reports (the MFU's denominator where --peak-tflops is not given)
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0}


def peak_tflops(device: str, given: float | None) -> float | None:
    if given is not None or not device.startswith("cuda"):
        return given
    name = torch.cuda.get_device_name(torch.device(device))
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


def step_flops(config, blocks: list[range], k: int, tokens: int, seq_len: int) -> float:
    """The FLOPs of one retrofit step at skip block k: the teacher's pass, the full path (block 1 reused), the skip
    branch (the blocks after k), their LM heads, and the backward of the full path and the skip branch
    (input gradients only: the backbone is frozen, so about one forward's matrix products each)."""
    per_layer = LayerFlops.of(config).full
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention = 2 * seq_len * config.num_attention_heads * head_dim  # QK^T and AV per token, causal (half of 4 T q)
    layer = per_layer + attention
    n_layers = blocks[-1].stop
    head = 2 * config.hidden_size * config.vocab_size
    full, skip = n_layers - len(blocks[0]), n_layers - blocks[k - 1].stop
    forward = (n_layers + full + skip) * layer + 3 * head
    backward = (full + skip) * layer + 2 * head
    return float(tokens * (forward + backward))


def load(model_name, random_config, dtype: str, device: str, num_layers: int | None):
    """(model, tokenizer or None): a packaged or local backbone, or random weights of a shipped architecture."""
    if random_config is None:
        return load_backbone(model_name, dtype, device=device)
    cfg = architecture_config(random_config)
    if num_layers is not None:
        cfg.num_hidden_layers = num_layers
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = cfg.layer_types[:num_layers]
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, resolve_dtype_name(dtype, device))).to(device).eval(), None


def steps_of(model_name, dtype: str, batch: int, seq_len: int, loss_chunk: int, variants: bool,
             random_config=None, device: str = "cpu", num_layers: int | None = None) -> dict:
    """name -> a function running one cycle of that step over the drawable blocks, for one dtype."""
    torch.manual_seed(0)
    model, tok = load(model_name, random_config, dtype, device, num_layers)
    if tok is not None:
        splits, _ = load_splits(["default"])
        data = pack(tok, splits["train"], seq_len, batch, seed=0)
        ids, labels = data.input_ids.to(device), data.labels.to(device)
    else:  # random weights: random tokens
        ids = torch.randint(3, model.config.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(0))
        ids = labels = ids.to(device)
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

    def full_pass(enabled: bool):
        def cycle():  # one forward + backward of the full path, gradients to the input embeddings
            x = embed(ids).detach().requires_grad_(True)
            if enabled:
                rm(inputs_embeds=x, labels=labels, use_cache=False).loss.backward()
            else:
                with rm.side_channel_disabled():
                    rm(inputs_embeds=x, labels=labels, use_cache=False).loss.backward()
            rm.side_channel.zero_grad(set_to_none=True)
        return cycle

    steps = {"frozen": frozen_cycle, "retrofit": retrofit_cycle(recipe), "pass_with_side_channel": full_pass(True),
             "pass_without_side_channel": full_pass(False)}
    if variants:
        steps["whole_logits"] = retrofit_cycle(dataclasses.replace(recipe, loss_chunk=None))
        steps["recompute"] = retrofit_cycle(dataclasses.replace(recipe, recompute=True))
    flops = sum(step_flops(model.config, rm.blocks, k, n_tokens, seq_len) for k in drawable)
    return {"steps": steps, "tokens_per_cycle": n_tokens * len(drawable), "drawable": drawable, "flops_per_cycle": flops,
            "device": device}


def pass_share(steps: dict, pairs: int, sync) -> float:
    """1 - (pass without / pass with the side-channel), the median over `pairs` back-to-back pairs, the order
    alternating (so a slow second or a warm cache favours neither)."""
    ratios = []
    for i in range(max(1, pairs)):
        order = ["pass_with_side_channel", "pass_without_side_channel"][:: 1 if i % 2 == 0 else -1]
        t = {}
        for k in order:
            sync()
            start = time.perf_counter()
            steps[k]()
            sync()
            t[k] = time.perf_counter() - start
        ratios.append(t["pass_without_side_channel"] / t["pass_with_side_channel"])
    return 1 - statistics.median(ratios)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--random-config", default=None, help="instead: random weights of a shipped architecture "
                                                          "(e.g. Qwen3-1.7B; no download)")
    ap.add_argument("--num-layers", type=int, default=None, help="with --random-config: this many layers (a dry run)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the device's peak for the MFU (default: a "
                                                                    "known GPU's bfloat16 dense peak; none on a CPU)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3, help="cycles over the drawable blocks per step kind")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "auto"], choices=["float32", "bfloat16", "auto"])
    ap.add_argument("--pass-pairs", type=int, default=10, help="back-to-back pairs of a training pass with and "
                                                               "without the side-channel, for its share")
    ap.add_argument("--loss-chunk", type=int, default=TrainConfig.loss_chunk, help="positions per loss chunk")
    ap.add_argument("--variants", action="store_true", help="also whole-logit and activation-checkpointing steps")
    args = ap.parse_args(argv)
    load_before = load_average()

    names = {d: resolve_dtype_name(d, args.device) for d in args.dtypes}
    setups = {d: steps_of(args.model, d, args.batch, args.seq_len, args.loss_chunk, args.variants, args.random_config,
                          args.device, args.num_layers) for d in args.dtypes}
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    for s in setups.values():  # warm-up (compiles the fused loss where compiling is used)
        for fn in s["steps"].values():
            fn()
    times = {d: {k: [] for k in s["steps"]} for d, s in setups.items()}
    for _ in range(args.repeats):  # interleaved, so machine noise hits every dtype and step alike
        for d, s in setups.items():
            for k, fn in s["steps"].items():
                sync()
                t = time.perf_counter()
                fn()
                sync()
                times[d][k].append(time.perf_counter() - t)
    shares = {d: pass_share(s["steps"], args.pass_pairs, sync) for d, s in setups.items()}
    peak = peak_tflops(args.device, args.peak_tflops)
    model_name = f"random {args.random_config}" if args.random_config else args.model or "smollm2-135m-instruct"
    report = {"model": model_name, "device": args.device, "peak_tflops": peak, "batch": args.batch, "seq_len": args.seq_len,
              "repeats": args.repeats, "threads": torch.get_num_threads(), "loss_chunk": args.loss_chunk,
              "skip_blocks_cycled": setups[args.dtypes[0]]["drawable"], "dtypes": names}
    for d, s in setups.items():
        for k, ts in times[d].items():
            report[f"tok_s_{k}_{d}"] = s["tokens_per_cycle"] / statistics.median(ts)
        med = {k: statistics.median(ts) for k, ts in times[d].items()}
        report[f"retrofit_vs_frozen_{d}"] = med["retrofit"] / med["frozen"]
        report[f"side_channel_share_{d}"] = shares[d]
        report[f"tflops_retrofit_{d}"] = s["flops_per_cycle"] / med["retrofit"] / 1e12
        report[f"mfu_retrofit_{d}"] = report[f"tflops_retrofit_{d}"] / peak if peak else None
    if args.device.startswith("cuda"):
        report["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if "float32" in setups and len(setups) > 1:
        for d in setups:
            if d != "float32":
                for k in times[d]:
                    report[f"speedup_{k}_{d}_vs_float32"] = report[f"tok_s_{k}_{d}"] / report[f"tok_s_{k}_float32"]
        report["target_min_speedup_retrofit"] = 2.3
    report["load"] = load_report(load_before, load_average(), torch.get_num_threads())
    if report["load"]["note"]:
        print(f"note: {report['load']['note']}", file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
