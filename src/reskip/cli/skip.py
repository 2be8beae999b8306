"""`reskip calibrate` and `reskip generate`.

Library imports happen inside the handlers (marked `lazy:`) so that `reskip --help` loads no torch."""

from __future__ import annotations

from pathlib import Path

from ..errors import ReskipError
from ..research.calibrate.options import CalibrateOptions
from ..skip.generate_options import GenerateOptions
from ..skip.spec import parse_spec
from .common import adapter_flag, examples
from .options import add_option_flags, options_from_args

CALIBRATE_CONVERTERS = {"budgets": lambda values: parse_budgets(values)}


def cmd_calibrate(args) -> int:
    from ..research.calibrate.run import format_policy  # lazy: torch
    from ..skip.policy_file import PolicyFile  # lazy: torch
    from ..stages.calibrate import calibrate  # lazy: torch

    path = calibrate(args.adapter, options_from_args(CalibrateOptions, args, CALIBRATE_CONVERTERS))
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
    o = options_from_args(GenerateOptions, args)
    if o.top_p == 0 or o.temperature == 0:
        raise ReskipError("--temperature and --top-p must be > 0 (for greedy decoding leave out --sample)")
    if not args.prompt.strip():
        raise ReskipError("the prompt is empty: give the text to continue")
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise ReskipError("the prompt is not valid UTF-8 text (it holds undecodable bytes); pass it as UTF-8") from None
    from ..compress.arm import is_arm  # lazy: torch, PEFT

    if is_arm(Path(args.adapter)):
        return _generate_arm(Path(args.adapter), args.prompt, o)
    if o.depth is not None:
        raise ReskipError(f"--depth serves a trained arm at a depth; {args.adapter} is not an arm (a nested arm of "
                          "`reskip experiment nested` serves depths 0 to K)")
    spec = parse_spec(o.policy, allow_path=True)
    from ..skip.inference_run import open_run  # lazy: torch
    from ..skip.scoring import generate_text  # lazy: torch

    opened = open_run(args.adapter, [spec], model=o.model, dtype=o.dtype, device=o.device, window=o.window, seed=o.seed,
                      trust_remote_code=o.trust_remote_code, dense_fallback=True)
    policy = opened.policy()
    text, per_step = generate_text(opened.model, opened.tokenizer, args.prompt, policy, opened.window, raw=o.raw,
                                   seed=o.seed, max_new_tokens=o.max_new_tokens, do_sample=o.sample,
                                   temperature=o.temperature, top_p=o.top_p)
    print(text)
    print(f"\n[{policy.describe()['policy']}] blocks skipped per step (prefill first), of {opened.model.n_blocks}:")
    print(" ".join(str(k) for k in per_step))
    print(f"mean {sum(per_step) / max(1, len(per_step)):.2f} blocks skipped per step")
    return 0


def _generate_arm(run: Path, prompt: str, o: GenerateOptions) -> int:
    """A trained arm as the plain model it exports (a nested arm at `o.depth`): its reply and how many layers ran."""
    import torch  # lazy: torch

    from ..compress.arm import arm_layers, load_arm_model, read_arm  # lazy: torch, PEFT
    from ..skip.scoring import encode_prompt  # lazy: torch

    cfg, arm = read_arm(run)
    drop = arm_layers(arm, run, o.depth)  # a depth the arm does not serve: refused before the model loads
    model, tok = load_arm_model(run, o.dtype, o.device, o.trust_remote_code, depth=o.depth)
    enc = encode_prompt(tok, prompt, o.raw, getattr(model.config, "max_position_embeddings", None), o.max_new_tokens)
    torch.manual_seed(o.seed)
    device = next(model.parameters()).device
    sampling = {"do_sample": True, "temperature": o.temperature, "top_p": o.top_p} if o.sample else {"do_sample": False}
    with torch.no_grad():
        out = model.generate(input_ids=enc.input_ids.to(device), attention_mask=enc.attention_mask.to(device),
                             max_new_tokens=o.max_new_tokens, pad_token_id=tok.pad_token_id or tok.eos_token_id,
                             **sampling)
    print(tok.decode(out[0, enc.input_ids.shape[1]:], skip_special_tokens=True))
    n = len(drop) + model.config.num_hidden_layers
    depth = f"depth {o.depth}, " if arm.nested else ""
    print(f"\n[{run.name}] {depth}{n - len(drop)} of {n} layers run at every step ({len(drop)} removed)")
    return 0


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="calibrate a ReSkip policy (policy.json) on the calibration split", **examples("calibrate"))
    adapter_flag(p)
    add_option_flags(p, CalibrateOptions, converters=CALIBRATE_CONVERTERS)
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("generate", help="generate with a skip policy; prints blocks skipped per token",
                       **examples("generate"))
    adapter_flag(p)  # RUN first: `reskip generate RUN "prompt"`, or `reskip generate "prompt" --adapter RUN`
    p.add_argument("prompt", help="the text to answer (through the model's chat template unless --raw)")
    add_option_flags(p, GenerateOptions)
    p.set_defaults(func=cmd_generate)
