"""The evaluate stage: every method on the test split (and multiple choice) -> RUN/eval/results.json
and results.md. This module owns the schema of results.json:

    meta:            adapter, policy, sequences, seq_len, chunk_size, window, n_blocks, test_split, data
    methods:         name -> the metrics of `methods.Tally.result` (ppl, ppl_ratio, top1_agreement,
                     kl_to_backbone, mean_skipped, skipped_histogram, steps, flops_executed_share,
                     margin_holds_share, top1_change_rate_where_margin_holds, top1_change_rate,
                     tokens, wall_s; `matched: true` for the matched baselines)
    multiple_choice: method -> benchmark -> {acc, acc_norm, chance, n}
    generation:      (with `generation`) prompts, max_new_tokens, methods: method -> {prefix_share,
                     same_first_sentence, per_prompt_prefix}: greedy continuations beside the backbone's
    chat:            (with `chat`) the original's own replies to held-out chat prompts and every method's row on
                     them (`evaluate.chat_fidelity.chat_summary`: kl, top1, prefix, first32, same_sentence,
                     identical, loops, new_loop, each with its 95% interval over prompts)
    frontier:        one point per method: flops_executed_share, blocks_executed_share, ppl_ratio,
                     top1_agreement
    heldout:         (with `heldout` data) data, test_split, sequences, methods, frontier: the same methods
                     (the matched ones included, by name) on a source kept out of training and
                     calibration, with the policy calibrated on the run's data: the policy's drift;
                     with `matched` among the methods, also static, influence and random at the
                     skips each ReSkip point measures there (compared at the compute it spends)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..backbones.devices import model_device
from ..backbones.dtypes import describe, resolve_dtype_name
from ..backbones.loading import load_backbone, load_config
from ..chat.prompt_sets import prompt_set
from ..chat.sampling import Sampling, Written, write_all
from ..chat.template import end_of_turn_ids, require_chat_template
from ..compat import decoder_layers
from ..config_fields import check_fields
from ..data.packing import pack
from ..data.sources import load_splits
from ..errors import ReskipError
from ..io_atomic import atomic_write_json, atomic_write_text
from ..run_folder.versions import stamped
from ..skip.run_inputs import read_stage_inputs
from ..skip.scoring import generate
from ..skip.spec import Spec
from .chat_fidelity import chat_rows, chat_summary, original_replies
from .generation import agreement, continuations, prompt_ids
from .methods import evaluate_methods, open_scorers, parse_methods
from .multiple_choice import load_benchmark, mc_accuracy
from .options import EvalOptions
from .scorers import ScorerContext
from .tables import markdown


def check_options(o: EvalOptions) -> None:
    check_fields(o)
    if not o.methods:
        raise ReskipError("--methods names no method: give at least one (e.g. backbone retrofit budgets matched)")
    resolve_dtype_name(o.dtype)  # an unknown name fails here
    if o.reference:
        load_config(o.reference, o.trust_remote_code)  # a reference that does not exist fails before any weights


def evaluate_run(run, options: EvalOptions = EvalOptions()) -> Path:
    """Evaluate the run's methods; write results.json and results.md; return results.json's path.
    Check `margin_violations(results)`: it must be empty."""
    check_options(options)
    inputs = read_stage_inputs(run, options, ("test",))
    source, specs = inputs.source, inputs.data_specs
    policy_file = source.policy()
    # The methods are built from the policy file before anything heavy loads, so a bad one fails first;
    # open_run then checks that policy file against the loaded model.
    methods = parse_methods(options.methods, policy_file, options.seed)
    mc_methods = parse_methods(options.mc_methods, policy_file, options.seed) if options.benchmarks else []
    questions = {b: load_benchmark(b, options.mc_limit, options.seed) for b in options.benchmarks}
    heldout_splits, heldout_record = _heldout_documents(options, specs)
    opened = inputs.open(options, window=options.window, seed=options.seed)
    model, tok, window = opened.model, opened.tokenizer, opened.window
    seq_len, record = inputs.seq_len, inputs.record
    data = pack(tok, inputs.splits["test"], seq_len, options.sequences, seed=0)
    scorer_context = ScorerContext(
        options.model or source.model_name, opened.dtype, opened.device, options.trust_remote_code,
        [list(b) for b in model.blocks],
        lambda: pack(tok, inputs.splits["calib"], seq_len, options.calib_sequences, seed=0))
    scorers = open_scorers([*methods, *mc_methods], scorer_context)
    reference = _reference(options, tok, opened) if options.reference else None

    def run_methods(packed, method_list, desc: str) -> dict[str, dict]:
        bar = tqdm(total=len(packed), desc=desc, unit="seq", disable=options.quiet)
        out = evaluate_methods(model, packed, method_list, window, options.chunk_size, policy_file, options.seed,
                               progress=lambda i, n: bar.update(1), reference=reference)
        bar.close()
        return out

    print(f"[eval] {len(methods)} methods on {len(data)} test sequences x {seq_len} tokens, in "
          f"{describe(options.dtype, opened.device)} on {opened.device}", flush=True)
    results = run_methods(data, methods, "eval")
    out = {
        "meta": {"adapter": str(source.adapter_dir), "policy": str(source.policy_path) if policy_file else None,
                 "sequences": len(data), "seq_len": seq_len, "chunk_size": options.chunk_size, "window": window,
                 "n_blocks": model.n_blocks, "dtype": opened.dtype, "device": opened.device,
                 "test_split": record["splits"]["test"], "data": specs, "reference": options.reference},
        "methods": results, "multiple_choice": _multiple_choice(mc_methods, questions, model, tok, window),
        **_generated(options, inputs, methods, opened, scorer_context, reference),
        "frontier": frontier_of(results, model.n_blocks),
    }
    if options.heldout:
        held = pack(tok, heldout_splits["test"], seq_len, options.sequences, seed=0)
        held_methods = parse_methods(_same_methods(results, options), policy_file, options.seed)
        open_scorers(held_methods, scorer_context, scorers)
        print(f"[eval] {len(held_methods)} methods on {len(held)} held-out sequences ({', '.join(options.heldout)})",
              flush=True)
        out["heldout"] = _heldout_results(run_methods(held, held_methods, "eval held-out"), results, options,
                                          heldout_record, len(held), model.n_blocks)
    folder = Path(options.out) if options.out else source.files.eval_dir
    atomic_write_json(folder / "results.json", stamped("results.json", out))
    atomic_write_text(folder / "results.md", markdown(out))
    return folder / "results.json"


def _heldout_results(held_results: dict, results: dict, options: EvalOptions, record: dict, sequences: int,
                     n_blocks: int) -> dict:
    """The held-out block of results.json: its rows (a row matched on the test split is marked so there too)."""
    for name, r in held_results.items():
        if name in results and results[name].get("matched"):
            r["matched"] = True
    return {"data": list(options.heldout), "test_split": record["splits"]["test"], "sequences": sequences,
            "methods": held_results, "frontier": frontier_of(held_results, n_blocks)}


def _heldout_documents(options: EvalOptions, specs: list[str]) -> tuple[dict | None, dict | None]:
    """The held-out source's documents and record (None without one), refused when it is part of the run's data
    or its test split is empty."""
    if not options.heldout:
        return None, None
    if set(options.heldout) & set(specs):
        raise ReskipError(f"--heldout {options.heldout} is part of the evaluation data {specs}: a held-out "
                          "source must be one the run did not train or calibrate on")
    splits, record = load_splits(list(options.heldout))
    if not splits["test"]:
        raise ReskipError(f"the test split of the held-out data {options.heldout} is empty")
    return splits, record


def _reference(options: EvalOptions, tok, opened):
    """The model the methods are compared with (`--reference`), refused unless it reads the same tokens."""
    ref, ref_tok = load_backbone(options.reference, opened.dtype, options.trust_remote_code, opened.device)
    if ref_tok.get_vocab() != tok.get_vocab():
        raise ReskipError(f"--reference {options.reference}: its tokenizer is not the backbone's; KL and agreement "
                          "compare distributions over the same tokens")
    print(f"[eval] compared with the reference {options.reference} ({len(decoder_layers(ref))} layers), not the run's "
          "backbone", flush=True)
    return ref


def _multiple_choice(mc_methods, questions: dict, model, tok, window: int) -> dict:
    """Each method's accuracy on each benchmark: the retrofit under its policy, the backbone, or a model of its own."""
    mc = {}
    for m in mc_methods:
        for b, qs in questions.items():
            print(f"[eval] {b} with {m.name} ({len(qs)} questions)", flush=True)
            mc.setdefault(m.name, {})[b] = mc_accuracy(m.scorer.model if m.scorer else model, tok, qs, m.policy, window)
    return mc


def _generation(methods, model, tok, window: int, max_new_tokens: int, reference=None) -> dict:
    """Every method's greedy continuations of the fixed prompts beside the backbone's (`evaluate.generation`), or
    beside the reference model's."""
    prompts = prompt_ids(tok)

    def backbone(ids, **kwargs):
        if reference is not None:
            return reference.generate(input_ids=ids.to(model_device(reference)), **kwargs)
        with model.side_channel_disabled():
            return model.generate(input_ids=ids.to(model_device(model)), **kwargs)

    reference = continuations(backbone, tok, prompts, max_new_tokens)
    out = {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "methods": {}}
    for m in methods:
        if m.is_backbone:
            continue
        print(f"[eval] generation with {m.name} ({len(prompts)} prompts)", flush=True)
        if m.scorer is not None:
            def one(ids, m=m, **kwargs):
                return m.scorer.model.generate(input_ids=ids.to(model_device(m.scorer.model)), **kwargs)
        else:
            def one(ids, m=m, **kwargs):
                return generate(model, ids, m.policy, window, **kwargs)[0]
        out["methods"][m.name] = agreement(tok, reference, continuations(one, tok, prompts, max_new_tokens))
    return out


def _generated(options: EvalOptions, inputs, methods, opened, context: ScorerContext, reference) -> dict:
    """The results' blocks of what the methods write: greedy continuations (`generation`) and chat fidelity
    (`chat`), each when asked."""
    out = {}
    if options.generation:
        out["generation"] = _generation(methods, opened.model, opened.tokenizer, opened.window, options.generation,
                                        reference)
    if options.chat:
        out["chat"] = _chat(options, inputs, context, opened.window)
    return out


def _chat(options: EvalOptions, inputs, context: ScorerContext, window: int) -> dict:
    """Every method on the original's own replies to the first `options.chat` held-out chat prompts, in float32
    (the run opened again, and every model method, in float32: greedy agreement in bfloat16 measures rounding too)."""
    opened = inputs.open(dataclasses.replace(options, dtype="float32"), window=window, seed=options.seed)
    model, tok = opened.model, opened.tokenizer
    require_chat_template(tok, "--chat")
    methods = [m for m in parse_methods(options.methods, opened.policy_file, options.seed) if m.spec.kind != "matched"]
    open_scorers(methods, dataclasses.replace(context, dtype="float32"))
    reference = _reference(dataclasses.replace(options, dtype="float32"), tok, opened) if options.reference else None
    prompts = prompt_set("test").first(options.chat)
    if reference is not None:
        replies = original_replies(reference, tok, prompts, show_progress=not options.quiet)
    else:
        with model.backbone_only() as original:
            replies = original_replies(original, tok, prompts, show_progress=not options.quiet)
    texts, stops = replies.texts(tok), end_of_turn_ids(tok)

    def write(m) -> list:
        print(f"[eval] chat: {m.name} answers {len(texts)} prompts", flush=True)
        if m.scorer is not None:
            return write_all(m.scorer.model, tok, texts, Sampling(max_new_tokens=replies.max_new_tokens), stops,
                             desc=f"chat: {m.name}", show_progress=not options.quiet)
        out = []
        for ids in replies.prompt_ids:  # a skip policy decides per step: one prompt at a time
            ids = torch.tensor([ids])
            full = generate(model, ids, m.policy, window, do_sample=False, max_new_tokens=replies.max_new_tokens,
                            eos_token_id=stops, pad_token_id=stops[0])[0]
            row = full[0, ids.shape[1]:].tolist()
            end = next((i for i, t in enumerate(row) if t in stops), None)
            out.append(Written(row, None) if end is None else Written(row[:end], row[end]))
        return out

    rows = chat_rows(model, tok, replies, methods, write, window, options.chunk_size, reference,
                     show=lambda line: print(f"[eval] {line}", flush=True))
    return chat_summary(replies, tok, rows)


def _same_methods(results: dict, options: EvalOptions) -> list[Spec]:
    """The in-domain rows' methods, rebuilt from their kinds and arguments (the matched ones included), and
    `matched` again when asked: static, influence and random matched anew at the skips each ReSkip point measures
    on the held-out source (its thresholds drift there: compared at the compute it actually spends)."""
    again = [Spec(r["kind"], name, **r["arguments"]) for name, r in results.items()]
    return again + ([Spec("matched", "matched")] if any(s.kind == "matched" for s in options.methods) else [])


def frontier_of(results: dict, n_blocks: int) -> list[dict]:
    return [{"method": name, "flops_executed_share": r["flops_executed_share"],
             "blocks_executed_share": 1 - r["mean_skipped"] / n_blocks, "ppl_ratio": r["ppl_ratio"],
             "top1_agreement": r["top1_agreement"]} for name, r in results.items()]


def margin_violations(results: dict) -> list[str]:
    """Methods whose top-1 changed where 2 eps < Delta (in-domain or held out): impossible unless the
    skipping code is wrong."""
    tables = [("", results["methods"])]
    if "heldout" in results:
        tables.append(("held-out ", results["heldout"]["methods"]))
    return [prefix + n for prefix, methods in tables for n, r in methods.items()
            if r["top1_change_rate_where_margin_holds"] not in (None, 0.0)]
