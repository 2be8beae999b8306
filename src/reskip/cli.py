"""`reskip` command line. Only this module parses strings into objects."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .errors import ReskipError

DTYPES = ("float32", "bfloat16")


def _dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def _retrofit_config(args):
    from .config import RetrofitConfig

    boundaries = None
    if getattr(args, "boundaries", None):
        try:
            boundaries = [int(x) for x in args.boundaries.split(",")]
        except ValueError:
            raise ReskipError(f"--boundaries takes comma-separated layer indices, got {args.boundaries!r}")
    try:
        return RetrofitConfig(block_size=args.block_size, rank=args.rank, boundaries=boundaries)
    except ValueError as e:
        raise ReskipError(str(e)) from e


def _emit(result: dict, as_json: bool, lines: list[str]) -> None:
    if as_json:
        print(json.dumps(result))
    else:
        print("\n".join(lines))


def cmd_parity(args) -> int:
    from .backbones import DEFAULT_BACKBONE, load_backbone
    from .parity import check_parity, tokenize_batch

    config = _retrofit_config(args)
    model, tokenizer = load_backbone(args.model, _dtype(args.dtype), args.trust_remote_code)
    result = {"model": args.model or DEFAULT_BACKBONE, "dtype": args.dtype}
    result.update(check_parity(model, tokenize_batch(tokenizer), config))
    _emit(
        result,
        args.json,
        [
            f"parity of {result['model']} ({args.dtype}) at c = 0 over {result['tokens']} tokens "
            f"({result['padded_rows']} padded rows), {result['n_blocks']} blocks, rank {result['rank']}:",
            f"  max |logit diff| = {result['max_abs_diff']:.3g}  ->  {'EXACT' if result['equal'] else 'NOT EXACT'}",
        ],
    )
    return 0 if result["max_abs_diff"] == 0 and result["equal"] else 1


def cmd_params(args) -> int:
    from .accounting import architecture_config, count_params

    retrofit_config = _retrofit_config(args)
    report = count_params(architecture_config(args.backbone), retrofit_config, args.backbone).to_dict()
    _emit(
        report,
        args.json,
        [
            f"{report['backbone']} ({report['family']}): {report['backbone_params']:,} backbone parameters",
            f"  side-channel at rank {report['rank']}, {report['n_blocks']} blocks: "
            f"{report['new_params']:,} new parameters = {report['percent']:.3f}%",
        ],
    )
    return 0


def cmd_run_parity(args) -> int:
    """Pipeline stage 1: parity (fp32, bf16) and parameter accounting -> OUT/parity.json."""
    from .io_atomic import atomic_write_text
    from .backbones import DEFAULT_BACKBONE, load_backbone
    from .parity import check_parity, tokenize_batch
    from .accounting import count_params

    config = _retrofit_config(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = args.model or DEFAULT_BACKBONE
    results = {"model": name, "parity": []}
    for dtype in DTYPES:
        print(f"[parity] {name} {dtype} ...", flush=True)
        model, tokenizer = load_backbone(args.model, _dtype(dtype), args.trust_remote_code)
        r = check_parity(model, tokenize_batch(tokenizer), config)
        results["parity"].append({"dtype": dtype, **r})
        print(f"[parity] {dtype}: max |diff| = {r['max_abs_diff']} ({'exact' if r['equal'] else 'NOT exact'})")
    results["params"] = count_params(model.config, config, name).to_dict()
    p = results["params"]
    print(f"[params] {p['new_params']:,} new / {p['backbone_params']:,} backbone = {p['percent']:.3f}% (rank {p['rank']})")
    atomic_write_text(out / "parity.json", json.dumps(results, indent=2))
    print(f"wrote {out / 'parity.json'}")
    return 0 if all(r["equal"] for r in results["parity"]) else 1


RETROFIT_FLAGS = ("block_size", "rank", "boundaries")


def _train_config(args):
    """YAML file (or the run folder's resolved config on --resume) + flags -> TrainConfig."""
    import dataclasses

    import yaml

    from .train_config import TrainConfig

    overrides, retrofit = {}, {}
    for f in dataclasses.fields(TrainConfig):
        raw = getattr(args, f.name, None)
        if f.name == "retrofit" or raw is None:
            continue
        if f.name == "data":
            overrides["data"] = raw
            continue
        try:
            overrides[f.name] = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ReskipError(f"--{f.name.replace('_', '-')}: cannot read {raw!r}")
    for name in RETROFIT_FLAGS:
        raw = getattr(args, name, None)
        if raw is not None:
            retrofit[name] = [int(x) for x in str(raw).split(",")] if name == "boundaries" else raw
    source = None
    if args.resume:
        source = Path(args.resume) / "config.yaml"
        if not source.is_file():
            raise ReskipError(f"{args.resume} is not a run folder (no config.yaml)")
    elif args.config:
        source = Path(args.config)
        if not source.is_file():
            raise ReskipError(f"config file {args.config} does not exist")
    cfg = TrainConfig.from_yaml(source.read_text() if source else "", overrides)
    cfg.retrofit = {**cfg.retrofit, **retrofit}
    return cfg


def cmd_train(args) -> int:
    from .training import format_summary, train

    cfg = _train_config(args)
    cfg.validate()
    out = Path(args.resume or args.out or f"runs/train-{time.strftime('%Y%m%d-%H%M%S')}")
    summary = train(cfg, out, resume=bool(args.resume), show_progress=not args.quiet)
    if summary:
        print(format_summary(summary))
        print(f"adapter: {out / 'adapter'}   log: {out / 'train_log.jsonl'}")
    return 0


def _check_range(name, value, lo, hi=None):
    if value is None:
        return
    if value < lo or (hi is not None and value > hi):
        span = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ReskipError(f"--{name} must be {span}, got {value}")


def cmd_calibrate(args) -> int:
    from .calibration import calibrate
    from .data.packing import pack
    from .data.sources import load_splits
    from .run_folder import load_retrofitted, resolve_adapter

    _check_range("delta", args.delta, 0.0)
    _check_range("quantile", args.quantile, 0.0, 1.0)
    _check_range("window", args.window, 1)
    _check_range("max-skips", args.max_skips, 0)
    _check_range("sequences", args.sequences, 1)
    source = resolve_adapter(args.adapter)
    specs = args.data or source.data_specs
    splits, record = load_splits(specs)
    if not splits["calib"]:
        raise ReskipError(f"the calibration split of {specs} is empty: give more documents")
    model, tokenizer = load_retrofitted(source, args.model, _dtype(args.dtype), args.trust_remote_code)
    seq_len = args.seq_len or (source.train_config.seq_len if source.train_config else 256)
    data = pack(tokenizer, splits["calib"], seq_len, args.sequences, seed=0)
    print(f"[calibrate] {len(data)} sequences x {seq_len} tokens from the calibration split of {specs}", flush=True)
    policy = calibrate(model, data, args.delta, args.quantile, args.window, args.max_skips,
                       data_record={"specs": specs, "split": "calib", **record["splits"]["calib"]})
    out = Path(args.out) if args.out else source.policy_path
    policy.save(out)
    print(f"ppl(full) on calibration: {policy.data['ppl_full']:.3f}")
    print("block  layers   A(n)     I(n)    cos(x,h)  tau      eligible")
    for b in policy.data["blocks"]:
        tau = "-" if b["tau"] is None else f"{b['tau']:.3f}"
        imp = "-" if b["I"] is None else f"{b['I']:.3f}"
        print(f"{b['block']:>5}  {b['layers'][0]:>2}-{b['layers'][1]:<3}  {b['A']:<8.3f} {imp:<7} {b['cos_in_out']:<9.3f} "
              f"{tau:<8} {'yes' if b['eligible'] else 'no'}")
    print(f"wrote {out}")
    return 0


def cmd_generate(args) -> int:
    import torch

    from .policy_file import dense_if_uncalibrated, make_policy
    from .run_folder import load_retrofitted, resolve_adapter
    from .scoring import generate

    _check_range("window", args.window, 1)
    _check_range("max-new-tokens", args.max_new_tokens, 1)
    source = resolve_adapter(args.adapter)
    spec = args.policy
    policy_file = source.policy(Path(spec) if spec.endswith(".json") else None)
    if spec.endswith(".json"):
        spec = "reskip"
    spec = dense_if_uncalibrated(spec, policy_file, source.adapter_dir)
    make_policy(spec, policy_file, args.seed)  # a bad spec fails here, before the model loads
    model, tok = load_retrofitted(source, args.model, _dtype(args.dtype), args.trust_remote_code)
    if policy_file is not None:
        policy_file.check_model(model)
    policy = make_policy(spec, policy_file, args.seed)
    window = args.window or (policy_file.data["window"] if policy_file else 16)
    if tok.chat_template and not args.raw:
        text = tok.apply_chat_template([{"role": "user", "content": args.prompt}], tokenize=False, add_generation_prompt=True)
    else:
        text = args.prompt
    enc = tok(text, return_tensors="pt", add_special_tokens=not tok.chat_template or args.raw)
    torch.manual_seed(args.seed)
    out, trace = generate(model, enc.input_ids, policy, window, attention_mask=enc.attention_mask,
                          max_new_tokens=args.max_new_tokens, do_sample=args.sample, temperature=args.temperature,
                          top_p=args.top_p, pad_token_id=tok.pad_token_id or tok.eos_token_id)
    new = out[0, enc.input_ids.shape[1]:]
    print(tok.decode(new, skip_special_tokens=True))
    print(f"\n[{policy.describe()['policy']}] blocks skipped per step (prefill first), of {model.n_blocks}:")
    print(" ".join(str(len(t.skipped)) for t in trace[: len(new)]))
    per_token = [len(t.skipped) for t in trace[: len(new)]]
    print(f"mean {sum(per_token) / max(1, len(per_token)):.2f} blocks skipped per step")
    return 0


def cmd_eval(args) -> int:
    from .data.packing import pack
    from .data.sources import load_splits
    from .evaluation import evaluate_methods, parse_methods
    from .io_atomic import atomic_write_json, atomic_write_text
    from .multiple_choice import load_benchmark, mc_accuracy
    from .results_table import markdown
    from .run_folder import load_retrofitted, resolve_adapter

    _check_range("window", args.window, 1)
    _check_range("chunk-size", args.chunk_size, 1)
    _check_range("sequences", args.sequences, 1)
    source = resolve_adapter(args.adapter)
    policy_file = source.policy()
    methods = parse_methods(args.methods, policy_file, args.seed)
    mc_methods = parse_methods(args.mc_methods, policy_file, args.seed) if args.benchmarks else []
    questions = {b: load_benchmark(b, args.mc_limit, args.seed) for b in (args.benchmarks or [])}
    specs = args.data or source.data_specs
    splits, record = load_splits(specs)
    if not splits["test"]:
        raise ReskipError(f"the test split of {specs} is empty")
    model, tok = load_retrofitted(source, args.model, _dtype(args.dtype), args.trust_remote_code)
    if policy_file is not None:
        policy_file.check_model(model)
    window = args.window or (policy_file.data["window"] if policy_file else 16)
    seq_len = args.seq_len or (source.train_config.seq_len if source.train_config else 256)
    data = pack(tok, splits["test"], seq_len, args.sequences, seed=0)
    print(f"[eval] {len(methods)} methods on {len(data)} test sequences x {seq_len} tokens", flush=True)
    from tqdm.auto import tqdm

    bar = tqdm(total=len(data), desc="eval", unit="seq", disable=args.quiet)
    results = evaluate_methods(model, data, methods, window, args.chunk_size, policy_file, args.seed,
                               progress=lambda i, n: bar.update(1))
    bar.close()
    mc = {}
    for m in mc_methods:
        for b, qs in questions.items():
            print(f"[eval] {b} with {m.name} ({len(qs)} questions)", flush=True)
            mc.setdefault(m.name, {})[b] = mc_accuracy(model, tok, qs, m.policy, window)
    frontier = [{"method": name, "flops_executed_share": r["flops_executed_share"],
                 "blocks_executed_share": 1 - r["mean_skipped"] / model.n_blocks, "ppl_ratio": r["ppl_ratio"],
                 "top1_agreement": r["top1_agreement"]} for name, r in results.items()]
    out = {
        "meta": {"adapter": str(source.adapter_dir), "policy": str(source.policy_path) if policy_file else None,
                 "sequences": len(data), "seq_len": seq_len, "chunk_size": args.chunk_size, "window": window,
                 "n_blocks": model.n_blocks, "test_split": record["splits"]["test"], "data": specs},
        "methods": results,
        "multiple_choice": mc,
        "frontier": frontier,
    }
    folder = Path(args.out) if args.out else (source.run_dir or source.adapter_dir) / "eval"
    atomic_write_json(folder / "results.json", out)
    table = markdown(out)
    atomic_write_text(folder / "results.md", table)
    print(table)
    print(f"wrote {folder / 'results.json'} and {folder / 'results.md'}")
    bad = [n for n, r in results.items() if r["top1_change_rate_where_margin_holds"] not in (None, 0.0)]
    if bad:
        print(f"BUG: top-1 changed where 2 eps < Delta for {bad}", file=sys.stderr)
        return 1
    return 0


def cmd_diagnose(args) -> int:
    from .diagnose_run import diagnose

    _check_range("context", args.context, 1)
    path = diagnose(args.run, args.model, args.context, args.sequences, args.sample_tokens)
    d = json.loads(path.read_text())
    print("routing health:")
    for r in d["routing_health"]:
        ratio = "-" if r["entropy_ratio"] is None else f"{r['entropy_ratio']:.2f}"
        print(f"  block {r['block']}: H/log n = {ratio}, alpha on h_(n-1) = {r['alpha_on_prev']:.2f}  {r['status']}")
    dil = d["dilution"]
    print(f"dilution: cos^2(h0, h_L) = {dil['cos2'][-1]:.4f}, |h0|^2/|h_L|^2 = {dil['energy_ratio'][-1]:.4f} "
          f"(toy model {dil['toy_model'][-1]:.4f})")
    if "reading_discipline" in d:
        print(f"Spearman(I, A) = {d['reading_discipline']['spearman_I_vs_A']}")
    print(f"wrote {path}")
    return 0


def cmd_report(args) -> int:
    from .report import build_report

    run = Path(args.run)
    if not run.is_dir():
        raise ReskipError(f"{run} is not a run folder")
    path = build_report(run, Path(args.out) if args.out else None)
    print(f"wrote {path}")
    return 0


def cmd_run(args) -> int:
    """The main job: the whole pipeline into one run folder."""
    from .pipeline import run_pipeline

    overrides = {}
    for key in ("steps", "batch_size", "seq_len", "lr", "block_size", "rank", "boundaries"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    out = Path(args.resume or args.out or f"runs/run-{time.strftime('%Y%m%d-%H%M%S')}")
    t = time.time()
    _check_range("delta", args.delta, 0.0)
    state = run_pipeline(out, args.preset, args.model, args.data, overrides, resume=bool(args.resume), delta=args.delta)
    print(f"\nfinished {len(state['finished'])} stages in {time.time() - t:.0f} s this session: "
          + ", ".join(f"{k} {v:.0f}s" for k, v in state["timings"].items()))
    if (out / "summary.json").is_file():
        from .training import format_summary

        print(format_summary(json.loads((out / "summary.json").read_text())))
    if (out / "eval" / "results.md").is_file():
        print((out / "eval" / "results.md").read_text())
    print(f"report: {out / 'report' / 'report.html'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reskip", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def retrofit_flags(p):
        p.add_argument("--block-size", type=int, default=4, help="layers per block (default 4)")
        p.add_argument("--boundaries", help="explicit block starts, e.g. 4,8,12 (overrides --block-size)")
        p.add_argument("--rank", type=int, default=None, help="adapter rank (default: 256 if d >= 1024, else 64)")

    def model_flags(p):
        p.add_argument("--model", default=None, help="HF id, local folder or .gguf; default: bundled SmolLM2-135M-Instruct")
        p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own Python code to run")

    p = sub.add_parser("parity", help="check bit-exact parity with the backbone at c = 0")
    model_flags(p)
    retrofit_flags(p)
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_parity)

    p = sub.add_parser("params", help="count side-channel vs backbone parameters without loading weights")
    p.add_argument("--backbone", required=True, help="shipped name (e.g. Qwen3-4B), config.json or model folder")
    retrofit_flags(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_params)

    p = sub.add_parser("train", help="train the side-channel (three-term loss) on a frozen backbone")
    p.add_argument("--config", help="YAML file with training keys (flags override it)")
    p.add_argument("--out", help="run folder (default runs/train-<timestamp>)")
    p.add_argument("--resume", metavar="RUN", help="continue RUN exactly from its last checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--model", default=None, help="backbone; default: bundled SmolLM2-135M-Instruct")
    p.add_argument("--data", nargs="+", help="'default' (bundled mix), .txt/.jsonl files, folders, or HF dataset ids")
    from .train_config import TrainConfig
    import dataclasses

    for f in dataclasses.fields(TrainConfig):
        if f.name not in ("model", "data", "retrofit"):
            p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, default=None, metavar="V")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--boundaries", default=None)
    p.add_argument("--rank", type=int, default=None)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("calibrate", help="calibrate a ReSkip policy (policy.json) on the calibration split")
    p.add_argument("--adapter", required=True, help="training run folder or adapter folder")
    p.add_argument("--model", default=None, help="backbone (default: the run's, else the bundled one)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--data", nargs="+", help="data specs (default: the run's data); the calib split is used")
    p.add_argument("--delta", type=float, default=0.2, help="eligible when A(n) < 1 + delta (default 0.2)")
    p.add_argument("--quantile", type=float, default=0.5, help="tau_n = this quantile of w_recent(n) (default 0.5)")
    p.add_argument("--window", type=int, default=16, help="W: tokens in w_recent (default 16)")
    p.add_argument("--max-skips", type=int, default=2, help="M_max: blocks skipped per step at most (default 2)")
    p.add_argument("--sequences", type=int, default=32, help="calibration sequences (default 32)")
    p.add_argument("--seq-len", type=int, default=None, help="default: the run's seq_len, else 256")
    p.add_argument("--out", help="policy file (default: RUN/policy.json)")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("generate", help="generate with a skip policy; prints blocks skipped per token")
    p.add_argument("prompt")
    p.add_argument("--adapter", required=True, help="training run folder or adapter folder")
    p.add_argument("--policy", default="reskip", help="reskip[:Q] | none | static:K | influence:K | random:P | a policy.json")
    p.add_argument("--model", default=None)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--window", type=int, default=None, help="default: the policy's")
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.set_defaults(func=cmd_generate)

    from .evaluation import DEFAULT_METHODS

    p = sub.add_parser("eval", help="evaluate backbone, retrofit and skip policies side by side (results.json + .md)")
    p.add_argument("--adapter", required=True, help="training run folder or adapter folder")
    p.add_argument("--methods", nargs="+", default=DEFAULT_METHODS,
                   help="backbone retrofit reskip[:Q[:M]] static:K influence:K random:P matched")
    p.add_argument("--benchmarks", nargs="*", default=["mmlu"],
                   help="mmlu and/or bigbench:TASK (e.g. bigbench:social_iqa); none: skip multiple choice")
    p.add_argument("--mc-methods", nargs="+", default=["backbone", "retrofit", "reskip"])
    p.add_argument("--mc-limit", type=int, default=50, help="questions per benchmark (deterministic sample)")
    p.add_argument("--model", default=None)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--data", nargs="+", help="data specs (default: the run's); the test split is used")
    p.add_argument("--sequences", type=int, default=16, help="test sequences (default 16)")
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--chunk-size", type=int, default=32, help="tokens per step when scoring (default 32)")
    p.add_argument("--window", type=int, default=None, help="default: the policy's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="folder for results.json / results.md (default RUN/eval)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("diagnose", help="depth diagnostics of a run -> RUN/diagnostics.json")
    p.add_argument("run")
    p.add_argument("--model", default=None)
    p.add_argument("--context", type=int, default=4096, help="context length for the memory table")
    p.add_argument("--sequences", type=int, default=4, help="test sequences for dilution")
    p.add_argument("--sample-tokens", type=int, default=96, help="tokens of the per-token skip trace")
    p.set_defaults(func=cmd_diagnose)

    p = sub.add_parser("report", help="self-contained HTML report of a run (reads run files only)")
    p.add_argument("run")
    p.add_argument("--out", help="folder (default RUN/report)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("run-parity", help="pipeline stage: parity in fp32 + bf16 and parameters -> OUT/parity.json")
    model_flags(p)
    retrofit_flags(p)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_run_parity)

    p = sub.add_parser("run", help="the main job: parity, training, calibration, evaluation, diagnostics, report")
    p.add_argument("--out", help="run folder (default runs/run-<timestamp>)")
    p.add_argument("--resume", metavar="RUN", help="continue RUN from its last finished stage and checkpoint")
    p.add_argument("--preset", choices=["quick", "standard"], default="standard")
    p.add_argument("--model", default=None, help="backbone; default: bundled SmolLM2-135M-Instruct")
    p.add_argument("--data", nargs="+", default=None, help="training data specs (default: the bundled mix)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--block-size", type=int, default=None, help="layers per block (default 4)")
    p.add_argument("--boundaries", default=None, help="explicit block starts, e.g. 4,8,12")
    p.add_argument("--rank", type=int, default=None, help="adapter rank (default: 256 if d >= 1024, else 64)")
    p.add_argument("--delta", type=float, default=1.0,
                   help="calibration: eligible when A(n) < 1 + delta (default 1.0, see the README)")
    p.set_defaults(func=cmd_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ReskipError as e:
        print(f"reskip: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
