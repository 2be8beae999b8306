"""`reskip compress`: a user's model -> a smaller plain Hugging Face model, healed toward the original.

The stages, each kept in the output folder so that the same command resumes where a kill stopped it:
1. the blocks: the model's own ablation cost A(n) per block of `block_size` layers on the data's calibration split
   (`blocks.json`); the `drop` cheapest middle blocks (or the fewest that reach `keep_flops`) are removed;
2. heal: a LoRA on the remaining layers trained by the one training loop toward the original (`objective`: kd by
   default, the measured best) on the data (`heal/`, a resumable run folder);
3. export: the LoRA merged, the layers gone, a plain folder any engine loads (`model/`, with `reskip.json`);
4. measure: fidelity to the original, perplexity, MMLU retained and speed, beside the original (`report.json`,
   `report.md`, with the command that reproduces it).
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from transformers import AutoModelForCausalLM

from ..ar_retrofit.accounting import count_params
from ..backbones.dtypes import resolve_dtype_name
from ..backbones.devices import resolve_device
from ..backbones.loading import load_backbone, load_config
from ..baselines.arms import LoraArm
from .export import RECORD, export_run
from ..baselines.pruning import BlockCosts, backbone_block_costs
from ..baselines.train import train_lora
from ..ar_retrofit.blocks import retrofit_blocks
from ..data.packing import pack
from ..data.sources import load_splits
from ..config_fields import flag_of
from ..errors import ReskipError
from ..io_atomic import atomic_write_json, atomic_write_text
from ..pipeline import PipelineConfig
from ..progress import Progress
from ..reading import read_json
from ..run_folder.lock import writing
from .options import PRESETS
from ..train_config import TrainConfig
from ..compress.measure import measure
from ..compress.options import CompressOptions
from ..compress.report import html_page, markdown
from ..compress.speed import compare_speed

SETTINGS, BLOCKS, HEAL, MODEL, REPORT_JSON, REPORT_MD, REPORT_HTML = (
    "compress.json", "blocks.json", "heal", "model", "report.json", "report.md", "report.html")


@dataclasses.dataclass
class Plan:
    """What the options resolve to before any weights load: the healing's TrainConfig, the blocks of the model,
    the LoRA's parameter count and the folder's identity (what it trains)."""

    cfg: TrainConfig
    blocks: list[range]
    params: int
    identity: dict


def plan(o: CompressOptions) -> Plan:
    """Check every option against the model's config and the data (no weights load); one clear error otherwise."""
    if o.drop is not None and o.keep_flops is not None:
        raise ReskipError("--drop and --keep-flops both choose how much to remove: give one")
    resolve_device(o.device)
    load_splits(list(o.data))  # data that give no documents fail here
    for h in o.heldout:
        if h in o.data:
            raise ReskipError(f"--heldout {h} is part of --data: held-out text is text no stage saw")
        load_splits([h])
    config = load_config(o.model, o.trust_remote_code)
    blocks = retrofit_blocks(config.num_hidden_layers, o.block_size)
    middle = len(blocks) - 2
    if o.drop is not None and o.drop > middle:
        raise ReskipError(f"--drop {o.drop}: the model has {middle} middle blocks of {o.block_size} layers (the first "
                          "and last are kept)")
    most_kept = (int(o.keep_flops * config.num_hidden_layers) if o.keep_flops is not None
                 else config.num_hidden_layers - (o.drop or 1) * min(len(b) for b in blocks))
    if o.full_layers > most_kept:
        raise ReskipError(f"--full-layers {o.full_layers}: the compressed model keeps at most {most_kept} layers; "
                          "train fewer in full")
    pc = PipelineConfig(model=o.model, data=list(o.data), preset=o.preset, dtype=o.dtype, device=o.device,
                        trust_remote_code=o.trust_remote_code, overrides={"lr": o.lr, "seed": 0})
    cfg = pc.train_config()
    cfg.validate()
    params = o.params or count_params(config, cfg.retrofit_config()).new_params
    identity = {"model": o.model, "data": list(o.data), "block_size": o.block_size, "choose": o.choose, "drop": o.drop,
                "keep_flops": o.keep_flops, "objective": o.objective, "preset": o.preset, "lr": o.lr,
                "params": params, "dtype": resolve_dtype_name(o.dtype, resolve_device(o.device)),
                **({"full_layers": o.full_layers} if o.full_layers else {})}  # a folder made before it resumes
    return Plan(cfg, blocks, params, identity)


def check_folder(out: Path, identity: dict) -> None:
    """The folder is compress's own: new, empty, or holding a compression of the same settings (resumed)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ReskipError(f"--out {out} is a file: give a folder")
    if (out / SETTINGS).is_file():
        held = read_json(out / SETTINGS).get("identity")
        if held != identity:
            diff = [k for k in identity if not isinstance(held, dict) or held.get(k) != identity[k]]
            raise ReskipError(f"--out {out} holds a compression of other settings ({', '.join(diff)} differ): choose "
                              "another --out, or rerun with the settings it was made with to resume it")
        return
    held = sorted(p.name for p in out.iterdir() if p.name != ".lock")  # the lock: a first try killed at once
    if held:  # a folder compress writes holds compress.json from its first step on
        raise ReskipError(f"--out {out} holds files compress did not write ({', '.join(held[:5])}): choose an empty "
                          "or new folder")


def block_costs(o: CompressOptions, p: Plan, out: Path, show) -> BlockCosts:
    path = out / BLOCKS
    if path.is_file():
        costs = BlockCosts.from_dict(read_json(path))
        if costs.kl is not None or o.choose != "kl":
            return costs
    splits, _ = load_splits(list(o.data))
    model, tok = load_backbone(o.model, p.cfg.dtype, o.trust_remote_code, o.device)
    n = PRESETS[o.preset]["calibrate"]["sequences"]
    data = pack(tok, splits["calib"], p.cfg.seq_len, n, seed=0)
    show(f"[compress] 1/4 the ablation cost of each of the {len(p.blocks)} blocks on {len(data)} calibration sequences")
    with Progress(len(data), "compress: block costs", unit="seq", enabled=not o.quiet) as bar:
        done = [0]

        def advance(i: int, n: int) -> None:  # measure_blocks reports sequences done so far
            bar.update(i - done[0])
            done[0] = i

        costs = backbone_block_costs(model, data, o.block_size, progress=advance)
    atomic_write_json(path, costs.to_dict())
    return costs


def chosen_blocks(o: CompressOptions, costs: BlockCosts) -> list[int]:
    """The `drop` cheapest middle blocks, or the fewest whose removal keeps at most `keep_flops` of the layers."""
    if o.keep_flops is None:
        return costs.cheapest(o.drop or 1, o.choose)
    n_layers = sum(len(b) for b in costs.blocks)
    for k in range(1, len(costs.middle()) + 1):
        blocks = costs.cheapest(k, o.choose)
        if 1 - len(costs.layers_of(blocks)) / n_layers <= o.keep_flops:
            return blocks
    raise ReskipError(f"--keep-flops {o.keep_flops}: removing every middle block keeps more than that")


def command_line(o: CompressOptions) -> str:
    """The command that makes this folder again: `reskip compress` with every option that differs from its default."""
    parts = ["reskip", "compress"]
    for f in dataclasses.fields(o):
        value = getattr(o, f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if value == default or f.name == "quiet":
            continue
        flag = flag_of(f.name)
        if isinstance(value, bool):
            parts.append(flag)
        elif isinstance(value, list):
            parts += [flag, *map(str, value)] if value else [flag, "none"]
        else:
            parts += [flag, str(value)]
    return " ".join(shlex.quote(p) for p in parts)


def compress(o: CompressOptions, show=print) -> Path:
    """Run (or resume) every stage into `o.out`; returns report.json's path."""
    p = plan(o)
    out = Path(o.out)
    check_folder(out, p.identity)
    with writing(out):
        atomic_write_json(out / SETTINGS, {"identity": p.identity, "command": command_line(o)})
        costs = block_costs(o, p, out, show)
        blocks = chosen_blocks(o, costs)
        layers = sorted(costs.layers_of(blocks))
        show(f"[compress] 2/4 heal: blocks {blocks} (layers {layers[0]}-{layers[-1]}) removed; a LoRA matched to "
             f"{p.params:,} parameters trained by {o.objective} on {p.cfg.steps * p.cfg.batch_size * p.cfg.seq_len:,} tokens")
        arm = LoraArm(params=p.params, drop_layers=layers, drop_blocks=blocks, objective=o.objective,
                      full_layers=o.full_layers)
        summary = train_lora(p.cfg, arm, out / HEAL, show_progress=not o.quiet)
        if not (out / MODEL / RECORD).is_file():
            show(f"[compress] 3/4 export: {out / MODEL}")
            export_run(out / HEAL, out / MODEL, trust_remote_code=o.trust_remote_code)
        show("[compress] 4/4 measure: the compressed model beside the original")
        report = {"command": command_line(o), "settings": p.identity,
                  "blocks": {**costs.to_dict(), "chosen_by": o.choose, "removed": blocks, "layers_removed": layers,
                             "layers": sum(len(b) for b in costs.blocks)},
                  "healing": {"objective": o.objective,
                              "parameters": summary["lora"]["parameters"] + summary["lora"].get("full_parameters", 0),
                              "full_layers": summary["lora"].get("full_layers", []),
                              "tokens": summary["tokens_seen"], "train_wall_s": summary["train_wall_s"],
                              "val_kl": summary.get("kl_full"), "val_ppl": summary["ppl_full"],
                              "val_ppl_original": summary["ppl_backbone"]},
                  "measured": measure(o, out / MODEL, p.cfg.seq_len, show)}
        if not o.no_speed:
            report["speed"] = _speed(o, out / MODEL, show)
        atomic_write_json(out / REPORT_JSON, report)
        atomic_write_text(out / REPORT_MD, markdown(report))
        atomic_write_text(out / REPORT_HTML, html_page(markdown(report)))
    return out / REPORT_JSON


def _speed(o: CompressOptions, folder: Path, show) -> dict:
    original, _ = load_backbone(o.model, o.dtype, o.trust_remote_code, o.device)
    compressed = AutoModelForCausalLM.from_pretrained(folder, dtype=next(original.parameters()).dtype)
    return compare_speed(original, compressed.to(original.device).eval(), show=show)
