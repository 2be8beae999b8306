"""Wall-clock of ReSkip against the backbone, the retrofit without skipping and static pruning.

One run, after warm-up, median of repeats, methods interleaved: decode tokens/s at batch 1
and 8 (greedy, KV cache, `--decode-steps` steps after a `--prompt-len` prefill) and prefill
tokens/s. For each skipping method it prints the measured speed-up over the retrofit
without skipping, the ideal speed-up from the FLOPs it actually skipped (per token: layers,
LM head and side-channel counted; a skipped layer still pays its k/v projections), and
their ratio. The router overhead (retrofit without skipping vs the bare backbone) is given as the
median of per-repeat ratios, the ratio of medians, and the median of per-step ratios from steps
that alternate between the two (the least drift). One JSON line, with the targets.

    python benchmarks/speed.py --adapter RUN [--policy reskip] [--repeats 5]
    python benchmarks/speed.py --random-config Qwen3-4B --dtype bfloat16 --device cuda  # GPU check
    python benchmarks/speed.py --adapter RUN --dtype float32  # the float32 figures alone
    python benchmarks/speed.py --adapter RUN --batches 8 --repeats 3 --prefill-repeats 20  # the prefill overhead
    python benchmarks/speed.py --adapter RUN --per-step 1,2 --prefill-repeats 20  # what one and two skipped blocks save
Where the dtype (`--dtype auto` by default) is not float32, a float32 copy of the backbone is timed beside the
others (`backbone_float32`), so the dtype's gain is a ratio measured in the same run.
Targets: the side-channel costs at most 3% when nothing is skipped (retrofit vs backbone);
ReSkip reaches at least 0.9 of its ideal speed-up.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from reskip import RetrofitConfig, retrofit
from reskip.backbones.architectures import architecture_config
from reskip.backbones.dtypes import resolve_dtype_name
from reskip.backbones.loading import load_backbone
from reskip.cli.common import Parser  # usage errors on one line, exit 2, as every reskip command
from reskip.compat import cache_kwarg
from reskip.errors import ReskipError
from reskip.evaluate.flops import LayerFlops, shortcut_flops, side_channel_flops
from reskip.machine_load import load_average, load_report, spread
from reskip.skip.inference_run import open_run
from reskip.skip.policies import NoSkip, ReSkip, StaticSkip
from reskip.skip.spec import GRAMMAR, parse_spec
from reskip.skip.window import sliding_mean


@contextlib.contextmanager
def running(rm, policy, window, backbone=False):
    """Yields (model to call, skip runtime): the bare backbone (wrappers removed, no runtime), another model
    given as `backbone` (the float32 baseline), or the retrofit under `policy`."""
    if isinstance(backbone, torch.nn.Module):
        yield backbone, None
    elif backbone:
        with rm.backbone_only() as base:
            yield base, None
    else:
        with rm.skipping(policy, window) as runtime:
            yield rm, runtime


CACHE_KW = cache_kwarg()  # looked up once: it reads a signature, too slow for a timed step


def next_token(call, ids, cache):
    """One greedy step on a KV cache: the next token (B, 1)."""
    return call(input_ids=ids, use_cache=True, **{CACHE_KW: cache}).logits[:, -1:].argmax(-1)


def decode_run(rm, ids, policy, window, steps, backbone=False):
    """Seconds for `steps` decode steps after an untimed prefill; blocks skipped per step."""
    with torch.no_grad(), running(rm, policy, window, backbone) as (call, runtime):
        cache = DynamicCache()
        tok = next_token(call, ids, cache)
        t = time.perf_counter()
        for _ in range(steps):
            tok = next_token(call, tok, cache)
        if ids.is_cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
        skipped = [] if runtime is None else [len(s.skipped) for s in runtime.trace[1:]]
    return dt, sum(skipped) / max(1, len(skipped))


def prefill_run(rm, ids, policy, window, backbone=False):
    t = time.perf_counter()  # switching models is timed here, as it always was (small beside a prefill)
    with torch.no_grad(), running(rm, policy, window, backbone) as (call, runtime):
        call(input_ids=ids, use_cache=False)
    if ids.is_cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t
    return dt, 0.0 if runtime is None else float(len(runtime.trace[0].skipped))


def paired_overhead(times: list[float], baseline: list[float]) -> float:
    """Median over repeats of time / baseline time, minus 1. Each repeat times every method back to
    back, so the ratio within a repeat cancels most of the drift of a shared machine."""
    return statistics.median(t / b for t, b in zip(times, baseline)) - 1


def interleaved_overhead(rm, ids, window, steps, rounds) -> float:
    """Router overhead from decode steps that alternate between the bare backbone and the retrofit
    without skipping, each on its own KV cache: median over steps of the retrofit's step time over
    the backbone step beside it, minus 1. Pairing single steps (tens of ms apart) instead of whole
    repeats (seconds apart) leaves less of a shared machine's drift in each ratio."""
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)

    def step(kind, state) -> float:
        with running(rm, NoSkip(), window, backbone=kind == "backbone") as (call, _):  # switching is not timed
            sync()
            t = time.perf_counter()
            state["tok"] = next_token(call, state["tok"], state["cache"])
            sync()
            return time.perf_counter() - t

    ratios = []
    with torch.no_grad():
        for _ in range(rounds):
            states = {}
            for kind in ("backbone", "retrofit"):
                cache = DynamicCache()
                with running(rm, NoSkip(), window, backbone=kind == "backbone") as (call, _):
                    states[kind] = {"cache": cache, "tok": next_token(call, ids, cache)}
            for s in range(steps):
                order = ("backbone", "retrofit") if s % 2 == 0 else ("retrofit", "backbone")
                dt = {kind: step(kind, states[kind]) for kind in order}
                ratios.append(dt["retrofit"] / dt["backbone"])
    return statistics.median(ratios) - 1


def method_table(policies: dict, base32) -> dict:
    """name -> (policy, backbone): the bare backbone, the float32 copy when there is one, the retrofit without
    skipping and each skipping policy."""
    methods = {"backbone": (None, True)}
    if base32 is not None:
        methods["backbone_float32"] = (None, base32)
    return {**methods, "retrofit": (NoSkip(), False), **{n: (p, False) for n, p in policies.items()}}


def ideal_speedup(rm, skipped_blocks_mean: float) -> dict:
    """Per-token FLOPs of the retrofit, and the speed-up if only FLOPs mattered."""
    cfg = rm.base_model.config
    lf = LayerFlops.of(cfg)
    n_layers = cfg.num_hidden_layers
    layers = n_layers * lf.full
    total = layers + 2 * cfg.hidden_size * cfg.vocab_size + side_channel_flops(cfg.hidden_size, rm.rank, rm.n_blocks)
    per_block = n_layers / rm.n_blocks  # average layers per block
    # a skipped block still pays its layers' k/v projections and, with a shortcut, S_n
    saved = skipped_blocks_mean * (per_block * (lf.full - lf.kv_only)
                                   - shortcut_flops(cfg.hidden_size, rm.side_channel.shortcut_rank))
    backbone = layers + 2 * cfg.hidden_size * cfg.vocab_size  # no side-channel at all
    return {"ideal_speedup": total / (total - saved), "ideal_speedup_layers_only": layers / (layers - saved),
            "ideal_speedup_vs_backbone": backbone / (total - saved)}


def main(argv=None):
    ap = Parser(prog="speed.py")
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--adapter", help="run folder with adapter/ and policy.json")
    source.add_argument("--random-config", help="instead: a shipped architecture with random weights (e.g. Qwen3-4B)")
    ap.add_argument("--policy", default="reskip", help=GRAMMAR)
    ap.add_argument("--static-k", type=int, default=None, help="default: ReSkip's mean skipped blocks, rounded")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                    help="auto: bfloat16 on CUDA and on CPUs with AMX or AVX512-BF16, else float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--num-layers", type=int, default=None, help="with --random-config: this many layers (a dry run)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--prefill-len", type=int, default=512)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--per-step", default=None, metavar="K[,K...]",
                    help="instead of --policy and its matched static: static:K and ReSkip at K blocks per step "
                         "(reskip:budget=K of the run's frontier; random weights: the fixed-quantile ReSkip at K) "
                         "for each K, every one against the bare backbone, measured and FLOP-ideal")
    ap.add_argument("--compile-side-channel", action="store_true",
                    help="torch.compile the side-channel's function (block_input) before timing")
    ap.add_argument("--prefill-repeats", type=int, default=None,
                    help="prefills per method, interleaved (default: --repeats); one prefill is short, so its "
                         "paired overhead needs more of them (20: within about 1%%)")
    args = ap.parse_args(argv)
    if args.per_step is not None:
        try:
            args.per_step = [int(k) for k in args.per_step.split(",")]
        except ValueError:
            ap.error(f"--per-step takes whole block counts separated by commas, got {args.per_step!r}")
        if min(args.per_step) < 1:
            ap.error("--per-step: each K is at least 1")
    try:
        run(args)
    except ReskipError as e:
        ap.exit(2, f"{ap.prog}: error: {e}\n")


def run(args):
    load_before = load_average()
    if args.compile_side_channel:  # a screen: the side-channel's function compiled (dynamic length), the rest eager
        import reskip.ar_retrofit.depth_pass as depth_pass

        depth_pass.block_input = torch.compile(depth_pass.block_input, dynamic=True)
    dtype_name = resolve_dtype_name(args.dtype, args.device)
    dtype = getattr(torch, dtype_name)
    base32 = None
    if args.random_config:
        cfg = architecture_config(args.random_config)
        if args.num_layers is not None:
            cfg.num_hidden_layers = args.num_layers
            if getattr(cfg, "layer_types", None):
                cfg.layer_types = cfg.layer_types[: args.num_layers]
        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_config(cfg, dtype=dtype).to(args.device).eval()
        if dtype != torch.float32:
            torch.manual_seed(0)
            base32 = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).to(args.device).eval()
        rm = retrofit(base, RetrofitConfig())
        rm.set_curriculum(1.0)
        k = args.static_k or 1
        if not 1 <= k < rm.n_blocks:
            raise SystemExit(f"--static-k must lie in 1..{rm.n_blocks - 1} (this model has {rm.n_blocks} blocks)")
        blocks = set(range(2, 2 + k))
        skip_policy, window = StaticSkip(blocks, name=f"static-middle:{k}"), 16
        label = f"random {args.random_config}"
        policies = {"static": skip_policy, "reskip": fixed_quantile_reskip(rm, window, args.device)}
        if args.per_step:
            policies = per_step_random(rm, window, args.device, args.per_step)
        pf = None
    else:
        opened = open_run(args.adapter, [parse_spec(args.policy, allow_path=True)], dtype=dtype, require_policy=True)
        rm, pf, window = opened.model.to(args.device), opened.policy_file, opened.window
        policies = {"reskip": opened.policy()}
        if args.per_step:
            policies = per_step_policies(opened, args.per_step)
        label = str(opened.source.folder)
        if dtype != torch.float32:
            base32 = load_backbone(opened.source.model_name, "float32")[0].to(args.device)
    vocab = rm.base_model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    report = {"model": label, "dtype": dtype_name, "device": args.device, "threads": torch.get_num_threads(),
              "prompt_len": args.prompt_len, "decode_steps": args.decode_steps, "repeats": args.repeats,
              "prefill_repeats": args.prefill_repeats or args.repeats,
              "targets": {"router_overhead_no_skip_max": 0.03, "measured_over_ideal_min": 0.9}}

    for bsz in [int(b) for b in args.batches.split(",")]:
        ids = torch.randint(3, vocab, (bsz, args.prompt_len), generator=g).to(args.device)
        # Measure ReSkip's skips once to set static:k to the same mean (random weights: static:k as given).
        if "reskip" in policies and pf is not None:  # --per-step names its policies reskip_K
            _, mean = decode_run(rm, ids, policies["reskip"], window, args.decode_steps)
            # a fractional mean is matched by a mix of k and k + 1 static blocks across steps
            k = args.static_k if args.static_k is not None else round(mean, 2)
            policies["static"] = pf.static(min(k, len(pf.eligible()))) if pf.eligible() and k > 0 else NoSkip()
        methods = method_table(policies, base32)
        for name, (pol, bb) in methods.items():  # warm-up
            decode_run(rm, ids, pol, window, 2, backbone=bb)
        times = {n: [] for n in methods}
        skips = {}
        for _ in range(args.repeats):
            for name, (pol, bb) in methods.items():
                dt, sk = decode_run(rm, ids, pol, window, args.decode_steps, backbone=bb)
                times[name].append(dt)
                skips[name] = sk
        med = {n: statistics.median(v) for n, v in times.items()}
        row = {f"decode_tok_s_{n}": bsz * args.decode_steps / med[n] for n in methods}
        row["rounds_vs_backbone"] = {n: spread([b / t for t, b in zip(v, times["backbone"])]) for n, v in times.items()}
        row["router_overhead_no_skip"] = paired_overhead(times["retrofit"], times["backbone"])
        row["router_overhead_no_skip_of_medians"] = med["retrofit"] / med["backbone"] - 1
        row["router_overhead_no_skip_step_interleaved"] = interleaved_overhead(rm, ids, window, args.decode_steps,
                                                                               args.repeats)
        for n in policies:
            ideal = ideal_speedup(rm, skips[n])
            measured = med["retrofit"] / med[n]
            row[f"{n}_mean_skipped"] = skips[n]
            row[f"{n}_speedup_measured"] = measured
            row[f"{n}_speedup_ideal"] = ideal["ideal_speedup"]
            row[f"{n}_speedup_ideal_layers_only"] = ideal["ideal_speedup_layers_only"]
            row[f"{n}_measured_over_ideal"] = measured / ideal["ideal_speedup"]
            row[f"{n}_gain_over_ideal_gain"] = ((measured - 1) / (ideal["ideal_speedup"] - 1)
                                                if ideal["ideal_speedup"] > 1 else None)
            # against the bare backbone: what a user gains, the side-channel's own cost included
            row[f"{n}_vs_backbone_measured"] = med["backbone"] / med[n]
            row[f"{n}_vs_backbone_ideal"] = ideal["ideal_speedup_vs_backbone"]
            row[f"{n}_vs_backbone_over_ideal"] = row[f"{n}_vs_backbone_measured"] / ideal["ideal_speedup_vs_backbone"]
        if base32 is not None:
            row["backbone_vs_float32"] = row["decode_tok_s_backbone"] / row["decode_tok_s_backbone_float32"]
        report[f"batch_{bsz}"] = row
        for n in policies:
            row[f"{n}_decode_vs_backbone"] = row[f"decode_tok_s_{n}"] / row["decode_tok_s_backbone"]

    ids = torch.randint(3, vocab, (1, args.prefill_len), generator=g).to(args.device)
    methods = method_table(policies, base32)
    for name, (pol, bb) in methods.items():
        prefill_run(rm, ids, pol, window, backbone=bb)
    pre, pre_skipped = {n: [] for n in methods}, {}
    for _ in range(args.prefill_repeats or args.repeats):
        for name, (pol, bb) in methods.items():
            dt, pre_skipped[name] = prefill_run(rm, ids, pol, window, backbone=bb)
            pre[name].append(dt)
    prefill = report[f"prefill_{args.prefill_len}"] = {f"tok_s_{n}": args.prefill_len / statistics.median(v)
                                                       for n, v in pre.items()}
    prefill["router_overhead_no_skip"] = paired_overhead(pre["retrofit"], pre["backbone"])
    prefill["rounds_vs_backbone"] = {n: spread([b / t for t, b in zip(v, pre["backbone"])]) for n, v in pre.items()}
    for n in policies:  # one step: the blocks it skipped over the whole prompt
        ideal = ideal_speedup(rm, pre_skipped[n])
        prefill[f"{n}_skipped"] = pre_skipped[n]
        prefill[f"{n}_vs_backbone_measured"] = 1 / (1 + paired_overhead(pre[n], pre["backbone"]))
        prefill[f"{n}_vs_backbone_ideal"] = ideal["ideal_speedup_vs_backbone"]
        prefill[f"{n}_vs_backbone_over_ideal"] = prefill[f"{n}_vs_backbone_measured"] / ideal["ideal_speedup_vs_backbone"]
    if base32 is not None:
        prefill["backbone_vs_float32"] = prefill["tok_s_backbone"] / prefill["tok_s_backbone_float32"]
    if args.device.startswith("cuda"):
        report["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if not args.random_config:
        report["summary"] = quality_and_speed(opened.source.files.eval_dir / "results.json", args.policy, report)
        print(report["summary"], file=sys.stderr)
    report["load"] = load_report(load_before, load_average(), torch.get_num_threads())
    if report["load"]["note"]:
        print(f"note: {report['load']['note']}", file=sys.stderr)
    print(json.dumps(report))


def per_step_policies(opened, per_step: list[int]) -> dict:
    """static_K (the K eligible blocks of lowest ablation cost) and reskip_K (the frontier's point at K blocks
    per step) for each K: what a skipped block saves, at each depth cut, in one run."""
    policies = {}
    for k in per_step:
        policies[f"static_{k}"] = opened.policy_file.static(k)
        policies[f"reskip_{k}"] = opened.policy(parse_spec(f"reskip:budget={k}"))
    return policies


def per_step_random(rm, window: int, device: str, per_step: list[int]) -> dict:
    """Random weights: static-middle:K (blocks 2..K+1) and the fixed-quantile ReSkip allowed K blocks per step."""
    policies = {}
    for k in per_step:
        if not 1 <= k < rm.n_blocks:
            raise SystemExit(f"--per-step: K must lie in 1..{rm.n_blocks - 1} (this model has {rm.n_blocks} blocks)")
        policies[f"static_{k}"] = StaticSkip(set(range(2, 2 + k)), name=f"static-middle:{k}")
        policies[f"reskip_{k}"] = fixed_quantile_reskip(rm, window, device, max_skips=k)
    return policies


def fixed_quantile_reskip(rm, window: int, device: str, quantile: float = 0.5, max_skips: int = 1) -> ReSkip:
    """Random weights have no calibration: ReSkip at up to `max_skips` blocks per step with each middle block's threshold at the
    `quantile` of its w_recent over a random 64-token text (its cost is what is measured, not its choices)."""
    ids = torch.randint(3, rm.base_model.config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(1))
    middle = set(range(2, rm.n_blocks))
    with torch.no_grad():
        alphas = rm(input_ids=ids.to(device), output_alphas=True).alphas
    tau = {n: float(sliding_mean(alphas[n][..., -1].float(), window).quantile(quantile)) for n in middle}
    return ReSkip(tau, middle, max_skips, name=f"reskip-q{quantile:g}")


def quality_and_speed(results_path, spec_text: str, report: dict) -> str:
    """One line: the policy's test perplexity against the backbone's (from the run's `reskip eval`, when it
    evaluated this spec) beside its decode tokens/s against the bare backbone's, per batch size."""
    quality = "perplexity not measured (run reskip eval with this policy)"
    if results_path.is_file():
        r = json.loads(results_path.read_text())["methods"].get(spec_text)
        if r is not None:
            quality = f"test perplexity {r['ppl_ratio']:.3f} x the backbone's at {r['mean_skipped']:.2f} blocks skipped per step"
    speeds = ", ".join(f"batch {k.split('_')[1]}: {v['reskip_decode_vs_backbone']:.3f} x" for k, v in report.items()
                       if k.startswith("batch_") and "reskip_decode_vs_backbone" in v)
    return f"{spec_text}: {quality}; decode tokens/s against the bare backbone {speeds}"


if __name__ == "__main__":
    main()
