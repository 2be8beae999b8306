"""`reskip diagnose RUN`: the depth diagnostics of a trained (and calibrated) run -> RUN/diagnostics.json."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .data.packing import pack
from .data.sources import load_splits
from .diagnostics import dilution, memory_table, reading_discipline, routing_health, token_trace
from .io_atomic import atomic_write_json
from .run_folder import load_retrofitted, resolve_adapter

SEED_INSTANCE = {"n_layers": 48, "hidden_size": 4096, "context": 4096, "dtype_bytes": 2, "block_size": 12}


def last_eval(run_dir: Path) -> dict | None:
    log = run_dir / "train_log.jsonl"
    if not log.is_file():
        return None
    evals = [json.loads(x) for x in log.read_text().splitlines() if '"kind": "eval"' in x]
    return evals[-1] if evals else None


def diagnose(run, model_name: str | None = None, context: int = 4096, sequences: int = 4,
             sample_tokens: int = 96, out: Path | None = None) -> Path:
    source = resolve_adapter(run)
    run_dir = source.run_dir or source.adapter_dir
    model, tok = load_retrofitted(source, model_name)
    policy = source.policy()
    if policy is not None:
        policy.check_model(model)
    splits, _ = load_splits(source.data_specs)
    seq_len = source.train_config.seq_len if source.train_config else 256
    data = pack(tok, splits["test"], seq_len, sequences, seed=1)
    cfg = model.base_model.config
    result = {"model": source.model_name or "smollm2-135m-instruct", "n_blocks": model.n_blocks,
              "blocks": [[b.start, b.stop - 1] for b in model.blocks]}
    result["dilution"] = dilution(model, data.input_ids)
    starts = [b.start for b in model.blocks]
    result["memory"] = {
        "this_model": [memory_table(cfg.num_hidden_layers, cfg.hidden_size, context, nbytes, starts) | {"dtype": name}
                       for name, nbytes in (("bfloat16", 2), ("float32", 4))],
        "seed_instance": memory_table(SEED_INSTANCE["n_layers"], SEED_INSTANCE["hidden_size"], SEED_INSTANCE["context"],
                                      SEED_INSTANCE["dtype_bytes"], list(range(0, 48, SEED_INSTANCE["block_size"]))),
    }
    ev = last_eval(run_dir)
    mean_alpha = policy.data["mean_alpha"] if policy else None
    if mean_alpha is None:  # no policy yet: measure mean alpha on the test sequences
        with torch.no_grad():
            alphas = model(input_ids=data.input_ids, use_cache=False, output_alphas=True).alphas
        mean_alpha = {str(n): a.float().mean(dim=(0, 1)).tolist() for n, a in alphas.items()}
    result["routing_health"] = routing_health(mean_alpha, ev["entropy"] if ev else {})
    result["mean_alpha"] = mean_alpha
    if policy is not None:
        result["reading_discipline"] = reading_discipline(policy)
        ids = data.input_ids[:1, :sample_tokens]
        trace = token_trace(model, ids, policy.make("reskip"), policy.data["window"])
        trace["tokens"] = [tok.decode([int(t)]) for t in ids[0]]
        trace["tau"] = {str(b["block"]): b["tau"] for b in policy.data["blocks"] if b["tau"] is not None}
        trace["eligible"] = sorted(policy.eligible())
        result["sample_trace"] = trace
    path = Path(out) if out else run_dir / "diagnostics.json"
    atomic_write_json(path, result)
    return path
