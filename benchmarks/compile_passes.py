"""What `torch.compile` gains on the backbone's inference passes, eager against compiled in one process.

The upper bound of what compiling could gain inside reskip's inference stages: the bare backbone, no
side-channel between its layers. Times, in order, eager; then each decoder layer compiled; then (on a
fresh copy of the model) the whole body compiled (shapes made dynamic on the first recompile, as by
default). Two pass kinds per mode:
  whole   - one pass over (B, T) tokens, no cache (as A(n) and the planned methods score);
  steps   - T tokens in steps of `--step` with the KV cache (as the signal's chunked scoring runs).
Minimum of `--repeats` calls after two warm-up calls (compile time is reported apart). Prints one JSON line.

    python benchmarks/compile_passes.py [--model M] [--dtype auto] [--batch 4] [--seq-len 256] [--step 32]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch._dynamo
from transformers import DynamicCache

from reskip import compat, load_backbone
from reskip.backbones.dtypes import resolve_dtype_name
from reskip.machine_load import load_average, load_report


def pass_kinds(model, ids: torch.Tensor, step: int) -> dict:
    """name -> a function running one inference pass of that kind."""

    def whole():
        with torch.inference_mode():
            return model(ids, use_cache=False).logits

    def steps():
        with torch.inference_mode():
            cache = {compat.cache_kwarg(): DynamicCache()}
            for a in range(0, ids.shape[1], step):
                out = model(ids[:, a:a + step], use_cache=True, **cache)
            return out.logits

    return {"whole": whole, "steps": steps}


def time_kinds(kinds: dict, repeats: int) -> dict:
    """name -> {"first_s": the two warm-up calls (compiling, if any), "min_s": the fastest timed call}."""
    out = {}
    for name, fn in kinds.items():
        t0 = time.perf_counter()
        fn()
        fn()
        first = time.perf_counter() - t0
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        out[name] = {"first_s": round(first, 2), "min_s": round(min(times), 4)}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="auto", choices=["float32", "bfloat16", "auto"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--step", type=int, default=32, help="tokens per step of the cached passes")
    ap.add_argument("--repeats", type=int, default=4)
    args = ap.parse_args(argv)
    load_before = load_average()
    dtype = resolve_dtype_name(args.dtype)
    # Generous: each layer and each cache length is a guard of its own; the default limit falls back to eager.
    torch._dynamo.config.cache_size_limit = 256

    torch.manual_seed(0)
    model, tok = load_backbone(args.model, dtype)
    model.eval()
    ids = torch.randint(0, len(tok), (args.batch, args.seq_len))
    result = {"dtype": dtype, "batch": args.batch, "seq_len": args.seq_len, "step": args.step}
    result["eager"] = time_kinds(pass_kinds(model, ids, args.step), args.repeats)
    for layer in compat.decoder_layers(model):
        layer.compile()
    result["layers_compiled"] = time_kinds(pass_kinds(model, ids, args.step), args.repeats)

    torch._dynamo.reset()
    model, _ = load_backbone(args.model, dtype)
    model.eval()
    compat.decoder_body(model).compile()
    result["body_compiled"] = time_kinds(pass_kinds(model, ids, args.step), args.repeats)
    for mode in ("layers_compiled", "body_compiled"):
        for kind in ("whole", "steps"):
            result[f"{mode}_{kind}_speedup"] = round(result["eager"][kind]["min_s"] / result[mode][kind]["min_s"], 3)
    result["load"] = load_report(load_before, load_average(), torch.get_num_threads())
    if result["load"]["note"]:
        print(f"note: {result['load']['note']}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
