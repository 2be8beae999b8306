"""`reskip generate RUN "prompt"`: a reply from any kind of the one table (`skip.spec.KINDS`).

RUN is a retrofit run (its `--policy` a skip policy, or a model of its own opened from the run's backbone:
`pruned:K`, `export:DIR`, `lora:RUN2`, `healed:RUN2`, `nested:K:RUN2`), a healing run (served as the plain model it
exports, a nested healing run at `--depth`) or an exported folder (`reskip compress`'s `model/`, `reskip export`'s). Options
that do not apply to what RUN is are refused, never ignored."""

from __future__ import annotations

from pathlib import Path

from ..errors import ReskipError
from ..skip.generate_options import GenerateOptions
from ..skip.spec import KINDS, METHOD_KINDS, parse_spec

DEFAULT_POLICY = "reskip"


def generate(run: Path, options: GenerateOptions) -> None:
    """Print the reply to `options.prompt`, and what computed it (blocks skipped per step, or layers run)."""
    from ..compress.export import RECORD  # lazy: torch
    from ..compress.healing_run import is_healing_run  # lazy: torch, PEFT

    spec = parse_spec(options.policy, METHOD_KINDS, allow_path=True)  # a bad spec fails before anything loads
    run = Path(run)
    own = "an exported model" if (run / RECORD).is_file() else "a healing run" if is_healing_run(run) else None
    if own is not None:
        _refuse_run_options(run, own, options)
        return _plain(run, options, own)
    if options.depth is not None:
        raise ReskipError(f"--depth serves a healing run at a depth; {run} is not a healing run (a nested one of "
                          "`reskip experiment nested` serves depths 0 to K)")
    if KINDS[spec.kind].opens == "model":
        return _model_of_the_run(run, spec, options)
    return _under_policy(run, spec, options)


def _refuse_run_options(run: Path, what: str, o: GenerateOptions) -> None:
    """A model of its own takes no skip policy, window or other backbone: say so instead of ignoring them."""
    given = [flag for flag, on in (("--policy", o.policy != DEFAULT_POLICY), ("--window", o.window is not None),
                                   ("--model", o.model is not None)) if on]
    if given:
        raise ReskipError(f"{run} is {what}: it runs as a plain model of its own, so {', '.join(given)} would be "
                          "ignored; leave them out (a skip policy needs a retrofit run)")
    if what == "an exported model" and o.depth is not None:
        raise ReskipError(f"--depth serves a nested healing run at a depth; {run} is an exported model of one depth")


def _decode(model, tok, o: GenerateOptions) -> str:
    import torch  # lazy: torch

    from ..skip.scoring import encode_prompt  # lazy: torch

    enc = encode_prompt(tok, o.prompt, o.raw, getattr(model.config, "max_position_embeddings", None),
                        o.max_new_tokens)
    torch.manual_seed(o.seed)
    device = next(model.parameters()).device
    sampling = {"do_sample": True, "temperature": o.temperature, "top_p": o.top_p} if o.sample else {"do_sample": False}
    with torch.no_grad():
        out = model.generate(input_ids=enc.input_ids.to(device), attention_mask=enc.attention_mask.to(device),
                             max_new_tokens=o.max_new_tokens, pad_token_id=tok.pad_token_id or tok.eos_token_id,
                             **sampling)
    return tok.decode(out[0, enc.input_ids.shape[1]:], skip_special_tokens=True)


def _plain(run: Path, o: GenerateOptions, what: str) -> None:
    """A healing run as the plain model it exports (a nested healing run at `o.depth`), or an exported folder."""
    if what == "a healing run":
        from ..compress.healing_run import layers_removed_by, load_healed_model, read_healing_run  # lazy: torch, PEFT

        _, healing = read_healing_run(run)
        drop = layers_removed_by(healing, run, o.depth)  # a depth the healing does not serve: refused before the model loads
        model, tok = load_healed_model(run, o.dtype, o.device, o.trust_remote_code, depth=o.depth)
        depth = f"depth {o.depth}, " if healing.nested else ""
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: torch

        from ..backbones.devices import resolve_device  # lazy: torch
        from ..backbones.dtypes import resolve_dtype  # lazy: torch
        from ..compress.export import read_record  # lazy: torch

        drop, depth = read_record(run)["drop_layers"], ""
        device = resolve_device(o.device)
        model = AutoModelForCausalLM.from_pretrained(run, dtype=resolve_dtype(o.dtype, device)).to(device).eval()
        tok = AutoTokenizer.from_pretrained(run)
    print(_decode(model, tok, o))
    n = len(drop) + model.config.num_hidden_layers
    print(f"\n[{run.name}] {depth}{n - len(drop)} of {n} layers run at every step ({len(drop)} removed)")


def _model_of_the_run(run: Path, spec, o: GenerateOptions) -> None:
    """A model of its own opened from the run's backbone (`pruned:K`, `export:DIR`, a healing run), as `reskip eval` opens
    it: the same opener, the same calibration sequences for `pruned:K`."""
    from ..data.packing import pack  # lazy: torch
    from ..data.sources import load_splits  # lazy: torch
    from ..evaluate.scorers import ScorerContext, check_model_spec, open_scorer  # lazy: torch
    from ..skip.inference_run import open_run  # lazy: torch

    if o.window is not None:
        raise ReskipError(f"--policy {spec.text} is a model of its own: it skips nothing per step, so --window would "
                          "be ignored; leave it out")
    check_model_spec(spec)
    opened = open_run(run, [], model=o.model, dtype=o.dtype, device=o.device, trust_remote_code=o.trust_remote_code,
                      use_policy=False)
    source, tok = opened.source, opened.tokenizer

    def calibration():
        docs, _ = load_splits(list(source.data_specs))
        return pack(tok, docs["calib"], source.seq_len, 32, seed=0)

    ctx = ScorerContext(o.model or source.model_name, opened.dtype, opened.device, o.trust_remote_code,
                        [list(b) for b in opened.model.blocks], calibration)
    scorer = open_scorer(spec, ctx)
    print(_decode(scorer.model, tok, o))
    print(f"\n[{spec.text}] {scorer.n_layers - len(scorer.dropped_layers)} of {scorer.n_layers} layers run at every "
          f"step ({len(scorer.dropped_layers)} removed)")


def _under_policy(run: Path, spec, o: GenerateOptions) -> None:
    from ..skip.inference_run import open_run  # lazy: torch
    from ..skip.scoring import generate_text  # lazy: torch

    opened = open_run(run, [spec], model=o.model, dtype=o.dtype, device=o.device, window=o.window, seed=o.seed,
                      trust_remote_code=o.trust_remote_code, dense_fallback=True)
    policy = opened.policy()
    text, per_step = generate_text(opened.model, opened.tokenizer, o.prompt, policy, opened.window, raw=o.raw,
                                   seed=o.seed, max_new_tokens=o.max_new_tokens, do_sample=o.sample,
                                   temperature=o.temperature, top_p=o.top_p)
    print(text)
    print(f"\n[{policy.describe()['policy']}] blocks skipped per step (prefill first), of {opened.model.n_blocks}:")
    print(" ".join(str(k) for k in per_step))
    print(f"mean {sum(per_step) / max(1, len(per_step)):.2f} blocks skipped per step")
