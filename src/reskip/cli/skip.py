"""`reskip calibrate` and `reskip generate`.

Library imports happen inside the handlers (marked `lazy:`) so that `reskip --help` loads no torch."""

from __future__ import annotations

from ..errors import ReskipError, check_range
from ..calibrate.options import CalibrateOptions
from ..skip.spec import GRAMMAR, parse_spec
from .common import adapter_flag, examples, model_flags
from .options import add_option_flags, options_from_args

CALIBRATE_CONVERTERS = {"budgets": lambda values: parse_budgets(values)}


def cmd_calibrate(args) -> int:
    from ..calibrate.stage import calibrate_run, format_policy  # lazy: torch
    from ..skip.policy_file import PolicyFile  # lazy: torch

    path = calibrate_run(args.adapter, options_from_args(CalibrateOptions, args, CALIBRATE_CONVERTERS))
    print(format_policy(PolicyFile.load(path)))
    print(f"wrote {path}")
    return 0


def parse_budgets(values) -> tuple[float, ...]:
    """["0.5,1,2"] or ["0.5", "1", "2"] or [0.5, 1, 2] (a YAML list) -> (0.5, 1.0, 2.0); ["none"] or [] -> ()
    (no frontier)."""
    if isinstance(values, (str, int, float)):
        values = [values]
    items = [x for v in values for x in (v.split(",") if isinstance(v, str) else [v])]
    if [str(x).strip().lower() for x in items] in ([], ["none"]):
        return ()
    try:  # the values' range is checked with the other options (their declared range)
        return tuple(float(x) for x in items)
    except ValueError:
        raise ReskipError(f"takes numbers of blocks per step, e.g. 0.5,1,2 or 0.5 1 2 (or none); got "
                          f"{' '.join(map(str, values))!r}") from None


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
    p = sub.add_parser("calibrate", help="calibrate a ReSkip policy (policy.json) on the calibration split", **examples("calibrate"))
    adapter_flag(p)
    add_option_flags(p, CalibrateOptions, converters=CALIBRATE_CONVERTERS)
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("generate", help="generate with a skip policy; prints blocks skipped per token",
                       **examples("generate"))
    p.add_argument("prompt", help="the text to answer (through the model's chat template unless --raw)")
    adapter_flag(p)
    p.add_argument("--policy", default="reskip", help=f"{GRAMMAR}, or a policy.json (default: reskip)")
    model_flags(p, dtype=True)
    p.add_argument("--window", type=int, default=None, help="W, tokens in w_recent (default: the policy file's)")
    p.add_argument("--max-new-tokens", type=int, default=40, help="tokens generated at most (default: 40)")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="with --sample: the logits are divided by it (default: 1.0)")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="with --sample: nucleus sampling over the smallest set of tokens of this much probability "
                        "(default: 1.0, every token)")
    p.add_argument("--seed", type=int, default=0, help="the seed of sampling and of random skipping (default: 0)")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.set_defaults(func=cmd_generate)
