"""Where the side-channel's time goes, op by op: the same steps with the retrofit and with the bare backbone under
`torch.profiler`, and the difference of each op's self time (what the side-channel adds, per step).

Shapes: decode at batch 1 and 8 (one-token steps on a cache after a 128-token prompt), a 512-token prefill, and the
training step (forward and backward: the recipe's objective against a frozen forward + backward). Prints a table
per shape to stderr and one JSON line: per shape, the step's time with and without the side-channel, the overhead,
and the ops that account for it.

    python benchmarks/side_channel_profile.py --adapter RUN [--dtype bfloat16] [--steps 16]
    python benchmarks/side_channel_profile.py --random-config SmolLM2-135M --dtype float32
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM, DynamicCache

from reskip import RetrofitConfig, retrofit
from reskip.backbones.architectures import architecture_config
from reskip.backbones.dtypes import resolve_dtype_name
from reskip.compat import cache_kwarg
from reskip.machine_load import load_average, load_report
from reskip.skip.inference_run import open_run
from reskip.skip.policies import NoSkip
from reskip.train.objective import RetrofitObjective
from reskip.train_config import TrainConfig

CACHE_KW = cache_kwarg()


def decode_fn(rm, bsz: int, steps: int, retrofit_on: bool):
    vocab = rm.base_model.config.vocab_size
    ids = torch.randint(3, vocab, (bsz, 128), generator=torch.Generator().manual_seed(0))

    @torch.no_grad()
    def run():
        cache = DynamicCache()
        if retrofit_on:
            with rm.skipping(NoSkip(), 8):
                out = rm(input_ids=ids, use_cache=True, **{CACHE_KW: cache})
                nxt = out.logits[:, -1:].argmax(-1)
                for _ in range(steps):
                    nxt = rm(input_ids=nxt, use_cache=True, **{CACHE_KW: cache}).logits[:, -1:].argmax(-1)
        else:
            with rm.backbone_only() as base:
                out = base(input_ids=ids, use_cache=True, **{CACHE_KW: cache})
                nxt = out.logits[:, -1:].argmax(-1)
                for _ in range(steps):
                    nxt = base(input_ids=nxt, use_cache=True, **{CACHE_KW: cache}).logits[:, -1:].argmax(-1)
    return run


def prefill_fn(rm, length: int, retrofit_on: bool):
    ids = torch.randint(3, rm.base_model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(1))

    @torch.no_grad()
    def run():
        if retrofit_on:
            rm(input_ids=ids, use_cache=False)
        else:
            with rm.backbone_only() as base:
                base(input_ids=ids, use_cache=False)
    return run


def train_fn(rm, batch: int, seq_len: int, retrofit_on: bool):
    ids = torch.randint(3, rm.base_model.config.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(2))
    objective = RetrofitObjective.of(rm, TrainConfig())
    embed = rm.base_model.get_input_embeddings()

    def run():
        if retrofit_on:
            objective(ids, ids, 2, 1.0 / ids.numel(), 1.0 / ids.numel())["loss"].backward()
            rm.side_channel.zero_grad(set_to_none=True)
        else:  # the frozen backbone's forward + backward to its input
            with rm.side_channel_disabled():
                x = embed(ids).detach().requires_grad_(True)
                rm(inputs_embeds=x, labels=ids, use_cache=False).loss.backward()
    return run


def op_times(fn, repeats: int) -> tuple[Counter, float]:
    """(self CPU microseconds per op name, wall microseconds) summed over `repeats` calls after one warm-up."""
    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            fn()
    times = Counter()
    for e in prof.key_averages():
        times[e.key] += e.self_cpu_time_total
    return times, sum(times.values())


def main(argv=None):
    ap = argparse.ArgumentParser()
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--adapter")
    src.add_argument("--random-config")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    ap.add_argument("--steps", type=int, default=16, help="decode steps per profiled call")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    load_before = load_average()
    dtype = resolve_dtype_name(args.dtype)
    if args.adapter:
        rm = open_run(args.adapter, dtype=dtype, device="cpu").model
    else:
        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_config(architecture_config(args.random_config), dtype=getattr(torch, dtype))
        rm = retrofit(base.eval(), RetrofitConfig(skip_path="shortcut"))
        rm.set_curriculum(1.0)
    shapes = {"decode_b1": lambda on: decode_fn(rm, 1, args.steps, on),
              "decode_b8": lambda on: decode_fn(rm, 8, args.steps, on),
              "prefill_512": lambda on: prefill_fn(rm, 512, on),
              "train_8x256": lambda on: train_fn(rm, 8, 256, on)}
    report = {"model": args.adapter or f"random {args.random_config}", "dtype": dtype,
              "threads": torch.get_num_threads(), "repeats": args.repeats}
    for name, make in shapes.items():
        on, t_on = op_times(make(True), args.repeats)
        off, t_off = op_times(make(False), args.repeats)
        added = Counter({k: on[k] - off.get(k, 0) for k in on})
        top = [(k, v / args.repeats) for k, v in added.most_common(args.top) if v > 0]
        report[name] = {"ms_with": t_on / args.repeats / 1e3, "ms_without": t_off / args.repeats / 1e3,
                        "overhead": t_on / t_off - 1, "added_ms_by_op": {k: v / 1e3 for k, v in top}}
        print(f"\n{name}: {t_on / args.repeats / 1e3:.2f} ms with the side-channel, {t_off / args.repeats / 1e3:.2f} "
              f"ms without ({t_on / t_off - 1:+.1%}); what it adds, per call:", file=sys.stderr)
        for k, v in top:
            print(f"  {k:<40} {v / 1e3:8.3f} ms", file=sys.stderr)
    report["load"] = load_report(load_before, load_average(), torch.get_num_threads())
    if report["load"]["note"]:
        print(f"note: {report['load']['note']}", file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
