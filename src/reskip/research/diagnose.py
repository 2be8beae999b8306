"""The diagnose stage (`reskip diagnose RUN`): the depth diagnostics of a trained (and calibrated)
run -> RUN/diagnostics.json."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..ar_retrofit.blocks import inclusive_ranges
from ..backbones.dtypes import describe, resolve_dtype_name
from ..backbones.loading import DEFAULT_BACKBONE
from ..config_fields import check_fields
from ..data.packing import pack
from ..io_atomic import atomic_write_json
from ..progress import Progress
from ..run_folder.versions import stamped
from ..skip.inference_run import DEFAULT_WINDOW
from ..skip.run_inputs import read_stage_inputs
from ..skip.scoring import on_model
from ..skip.spec import parse_spec
from ..skip.window import sliding_mean
from ..train.log import last_eval
from .analysis.cost_probe import fit_probes
from .analysis.signal_health import signal_health
from .analysis.signal_test import signal_test
from .report.diagnostics import dilution, memory_table, reading_discipline, routing_health, token_trace
from .report.options import DiagnoseOptions

SOURCE_INSTANCE = {"n_layers": 48, "hidden_size": 4096, "context": 4096, "dtype_bytes": 2, "block_size": 12}


def _signal_test(model, tok, splits, seq_len: int, policy, eligible: list[int], window: int,
                 options: DiagnoseOptions) -> dict:
    """The signal test on eval's test sequences, with the cost probes fitted on the calibration split when asked,
    each row beside its block's I(n) and A(n) as the report shows them."""
    test = pack(tok, splits["test"], seq_len, options.signal_sequences, seed=0)  # eval's sequences
    probes = None
    if options.probe_sequences:  # fitted on the calibration split; chosen on a held-out part of it
        calib = pack(tok, splits["calib"], seq_len, options.probe_sequences, seed=0)
        with Progress(len(calib), "diagnose: cost probes", unit="seq", enabled=not options.quiet) as bar:
            probes = fit_probes(model, calib, eligible, window, progress=bar.update)
    with Progress(len(test), "diagnose: signal test", unit="seq", enabled=not options.quiet) as bar:
        st = signal_test(model, test, eligible, window, probes=probes, progress=bar.update)
    by_block = {b["block"]: b for b in policy.data["blocks"]}
    for row in st["blocks"]:
        row.update(A=by_block[row["block"]]["A"], I=by_block[row["block"]]["I"])
    return st


def diagnose_run(run, options: DiagnoseOptions = DiagnoseOptions()) -> Path:
    """The depth diagnostics of `run` -> its diagnostics.json (returned)."""
    check_fields(options)
    resolve_dtype_name(options.dtype)  # an unknown name fails here
    inputs = read_stage_inputs(run, options, ("test", "calib") if options.probe_sequences else ("test",))
    opened = inputs.open(options)
    t0 = time.monotonic()

    def say(what: str) -> None:  # one line per part, with the time so far: the stage is never silent for long
        if not options.quiet:
            print(f"[diagnose] {what} (elapsed {time.monotonic() - t0:.0f} s)", flush=True)

    say(f"in {describe(options.dtype, opened.device)} on {opened.device}")
    source, model, tok, policy = opened.source, opened.model, opened.tokenizer, opened.policy_file
    context, sample_tokens, splits, seq_len = options.context, options.sample_tokens, inputs.splits, inputs.seq_len
    data = pack(tok, splits["test"], seq_len, options.sequences, seed=1)
    cfg = model.base_model.config
    result = {"model": source.model_name or DEFAULT_BACKBONE, "dtype": opened.dtype, "device": opened.device,
              "n_blocks": model.n_blocks,
              "blocks": inclusive_ranges(model.blocks)}
    say(f"dilution, memory and routing health on {len(data)} test sequences x {seq_len} tokens")
    result["dilution"] = dilution(model, data.input_ids)
    starts = [b.start for b in model.blocks]
    result["memory"] = {
        "this_model": [memory_table(cfg.num_hidden_layers, cfg.hidden_size, context, nbytes, starts) | {"dtype": name}
                       for name, nbytes in (("bfloat16", 2), ("float32", 4))],
        "source_instance": memory_table(SOURCE_INSTANCE["n_layers"], SOURCE_INSTANCE["hidden_size"], SOURCE_INSTANCE["context"],
                                      SOURCE_INSTANCE["dtype_bytes"], list(range(0, 48, SOURCE_INSTANCE["block_size"]))),
    }
    ev = last_eval(source.files.train_log)
    window = policy.data["window"] if policy else DEFAULT_WINDOW
    with torch.no_grad():  # the routing on the test sequences: spread per block, and mean alpha without a policy
        alphas = model(input_ids=on_model(model, data.input_ids), use_cache=False, output_alphas=True).alphas
    signal = {str(n): signal_health(a[..., -1].float().flatten().cpu().numpy(),
                                    sliding_mean(a[..., -1].float(), window).flatten().cpu().numpy())
              for n, a in alphas.items()}
    mean_alpha = policy.data["mean_alpha"] if policy else None
    if mean_alpha is None:
        mean_alpha = {str(n): a.float().mean(dim=(0, 1)).tolist() for n, a in alphas.items()}
    result["routing_health"] = routing_health(mean_alpha, ev["entropy"] if ev else {}, signal)
    result["signal_health"] = {"split": "test", "sequences": len(data), "window": window, "blocks": signal}
    result["mean_alpha"] = mean_alpha
    if policy is not None:
        say(f"the reading discipline and a {sample_tokens}-token skip trace")
        result["reading_discipline"] = reading_discipline(policy)
        ids = data.input_ids[:1, :sample_tokens]
        trace = token_trace(model, ids, policy.make(parse_spec("reskip")), policy.data["window"])
        trace["tokens"] = [tok.decode([int(t)]) for t in ids[0]]
        trace["tau"] = {str(b["block"]): b["tau"] for b in policy.data["blocks"] if b["tau"] is not None}
        trace["eligible"] = sorted(policy.eligible())
        result["sample_trace"] = trace
        eligible = sorted(policy.eligible())
        if eligible and options.signal_sequences:
            result["signal_test"] = _signal_test(model, tok, splits, seq_len, policy, eligible, window, options)
    path = Path(options.out) if options.out else source.files.diagnostics
    atomic_write_json(path, stamped("diagnostics.json", result))
    return path
