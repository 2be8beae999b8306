"""`reskip calibrate` and `reskip generate`.

Library imports happen inside the handlers (marked `lazy:`) so that `reskip --help` loads no torch."""

from __future__ import annotations

import dataclasses

from ..errors import ReskipError, check_range
from ..calibrate.options import CalibrateOptions
from ..skip.spec import GRAMMAR, parse_spec
from .common import adapter_flag, model_flags


def cmd_calibrate(args) -> int:
    from ..calibrate.stage import calibrate_run, format_policy  # lazy: torch

    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(CalibrateOptions)}
    options = CalibrateOptions(**{**values, "budgets": parse_budgets(args.budgets)})
    policy, path = calibrate_run(args.adapter, options)
    print(format_policy(policy))
    print(f"wrote {path}")
    return 0


def parse_budgets(text: str) -> tuple[float, ...]:
    """"0.5,1,2" -> (0.5, 1.0, 2.0); "none" -> () (no frontier)."""
    if text.strip().lower() == "none":
        return ()
    try:  # the values' range is checked with the other options (`calibrate.stage.check_options`)
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ReskipError(f"--budgets takes comma-separated numbers of blocks per step, e.g. 0.5,1,2 (or none); "
                          f"got {text!r}") from None


def cmd_generate(args) -> int:
    check_range("window", args.window, 1)
    check_range("max-new-tokens", args.max_new_tokens, 1)
    check_range("top-p", args.top_p, 0.0, 1.0)
    check_range("temperature", args.temperature, 0.0)
    if args.top_p == 0 or args.temperature == 0:
        raise ReskipError("--temperature and --top-p must be > 0 (for greedy decoding leave out --sample)")
    if not args.prompt.strip():
        raise ReskipError("the prompt is empty: give the text to continue")
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise ReskipError("the prompt is not valid UTF-8 text (it holds undecodable bytes); pass it as UTF-8") from None
    spec = parse_spec(args.policy, allow_path=True)
    from ..skip.scoring import generate_text  # lazy: torch
    from ..skip.inference_run import open_run  # lazy: torch

    opened = open_run(args.adapter, [spec], model=args.model, dtype=args.dtype, window=args.window,
                      seed=args.seed, trust_remote_code=args.trust_remote_code, dense_fallback=True)
    policy = opened.policy()
    text, per_step = generate_text(opened.model, opened.tokenizer, args.prompt, policy, opened.window, raw=args.raw,
                                   seed=args.seed, max_new_tokens=args.max_new_tokens, do_sample=args.sample,
                                   temperature=args.temperature, top_p=args.top_p)
    print(text)
    print(f"\n[{policy.describe()['policy']}] blocks skipped per step (prefill first), of {opened.model.n_blocks}:")
    print(" ".join(str(k) for k in per_step))
    print(f"mean {sum(per_step) / max(1, len(per_step)):.2f} blocks skipped per step")
    return 0


def register(sub) -> None:
    d = CalibrateOptions()
    p = sub.add_parser("calibrate", help="calibrate a ReSkip policy (policy.json) on the calibration split")
    adapter_flag(p)
    model_flags(p, dtype=True)
    p.add_argument("--data", nargs="+", help="data specs (default: the run's data); the calib split is used")
    p.add_argument("--delta", type=float, default=d.delta, help=f"eligible when A(n) < 1 + delta (default {d.delta})")
    p.add_argument("--quantile", type=float, default=d.quantile,
                   help=f"tau_n = this quantile of w_recent(n) (default {d.quantile})")
    p.add_argument("--window", type=int, default=d.window, help=f"W: tokens in w_recent (default {d.window})")
    p.add_argument("--max-skips", type=int, default=d.max_skips,
                   help=f"M_max: blocks skipped per step at most (default {d.max_skips})")
    p.add_argument("--sequences", type=int, default=d.sequences, help=f"calibration sequences (default {d.sequences})")
    p.add_argument("--seq-len", type=int, default=d.seq_len, help="default: the run's seq_len, else 256")
    p.add_argument("--budgets", default=",".join(f"{b:g}" for b in d.budgets),
                   help="budget frontier: target mean blocks skipped per step, comma-separated, or none "
                        f"(default {','.join(f'{b:g}' for b in d.budgets)}); used by reskip:budget=B")
    p.add_argument("--chunk-size", type=int, default=d.chunk_size,
                   help=f"tokens per step when the budgets are measured, as reskip eval scores (default {d.chunk_size})")
    p.add_argument("--out", help="policy file (default: RUN/policy.json)")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("generate", help="generate with a skip policy; prints blocks skipped per token")
    p.add_argument("prompt")
    adapter_flag(p)
    p.add_argument("--policy", default="reskip", help=f"{GRAMMAR}, or a policy.json")
    model_flags(p, dtype=True)
    p.add_argument("--window", type=int, default=None, help="default: the policy's")
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.set_defaults(func=cmd_generate)
