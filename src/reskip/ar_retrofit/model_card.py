"""The model card (`README.md`) of a saved adapter folder, as PEFT writes one beside its adapter files:
what the adapter is for, the backbone it belongs to (and its fingerprint), its blocks and size, how it was
trained and what was measured, the calibrated policy's frontier when there is one, and how to load it.

Rendered from the adapter's own `adapter_config.json` (its `metadata` carries the training figures that
`reskip train` puts there) and, when given, a policy file's data; written atomically."""

from __future__ import annotations

from pathlib import Path

from ..io_atomic import atomic_write_text

CARD_NAME = "README.md"


def card_text(config: dict, params: int, policy: dict | None = None) -> str:
    """config: the adapter_config.json dict; params: the side-channel's parameter count."""
    bb, meta, rc = config["backbone"], config.get("metadata", {}), config["retrofit"]
    name = meta.get("model") or bb["family"]
    blocks = config["blocks"]
    lines = ["---", "library_name: reskip", f"base_model: {name}", "tags:", "- reskip", "- ar-retrofit",
             "- attention-residuals", "- layer-skipping", "---", "",
             f"# AR-Retrofit adapter for {name}", "",
             "A trainable side-channel (depth routers, low-rank corrections and gates) on a frozen backbone; with a "
             "calibrated policy, ReSkip uses its routing weights to skip whole blocks at inference. The backbone's "
             "weights are not in this folder and are never changed.", "",
             "## Backbone", "",
             f"- {name}: {bb['family']}, {bb['num_layers']} layers, d = {bb['hidden_size']}",
             f"- fingerprint: config {bb['config_hash']}, weights {bb['weights_digest']} (checked when the adapter "
             "loads: another backbone is refused)", "",
             "## Adapter", "",
             f"- {len(blocks)} blocks: " + ", ".join(f"{a}-{b}" for a, b in blocks) + " (layers, inclusive)",
             f"- rank {config['rank']}, skip path {rc.get('skip_path', 'identity')}"
             + (f", variant {rc['variant']}" if rc.get("variant", "recipe") != "recipe" else ""),
             f"- {params:,} parameters (float32), seed {config['seed']}, reskip {config['reskip_version']}", ""]
    train = meta.get("training")
    if train:
        lines += ["## Training", "",
                  f"- data: {', '.join(train['data'])}" + (f" (weights {train['data_weights']})" if train.get("data_weights") else ""),
                  f"- training length: {train['steps']} steps x {train['batch_size']} x {train['seq_len']} tokens "
                  f"({meta.get('tokens_seen', 0):,} tokens seen), lr {train['lr']}",
                  f"- backbone computed in {meta.get('dtype', 'float32')} (side-channel and optimizer in float32)", ""]
    measured = meta.get("measured")
    if measured:
        lines += ["## Measured (validation split)", "",
                  f"- backbone perplexity {measured['ppl_backbone']:.3f}; this adapter {measured['ppl_start']:.3f} at "
                  f"step 0 -> {measured['ppl_end']:.3f} after training; KL to the backbone {measured['kl_end']:.4f}", ""]
    frontier = ((policy or {}).get("budgets") or {}).get("frontier")
    if frontier:
        lines += ["## Calibrated skip policy (calibration split)", "",
                  "| blocks skipped per step (budget) | measured mean | ppl / no skipping | chosen |",
                  "| --- | --- | --- | --- |"]
        lines += [f"| {p['budget']:g} | {p['measured']['mean_skipped']:.3f} | {p['measured']['ppl_ratio']:.4f} "
                  f"| {p['chosen']} |" for p in frontier]
        lines += ["", "These are calibration figures; the test split's are in the run's `eval/results.md`.", ""]
    lines += ["## How to load", "", "```python",
              "from reskip import load_adapter",
              "from reskip.backbones.loading import load_backbone",
              f"base, tokenizer = load_backbone({meta.get('model')!r})  # the backbone this adapter was trained on",
              "model = load_adapter(base, \"path/to/this/folder\")",
              "```", "",
              "or, for a run folder, `reskip generate --adapter RUN --policy reskip:budget=1 \"your prompt\"` "
              "(a calibrated policy needs `reskip calibrate` first).", ""]
    return "\n".join(lines)


def write_card(folder: Path, config: dict, params: int, policy: dict | None = None) -> Path:
    path = Path(folder) / CARD_NAME
    atomic_write_text(path, card_text(config, params, policy))
    return path
