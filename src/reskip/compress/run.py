"""`reskip compress`: a user's model -> a smaller plain Hugging Face model, healed toward the original.

The stages, each kept in the output folder so that the same command resumes where a kill stopped it:
1. data: the conversations the original writes itself (`self`) or its replies to the user's prompts (`--prompts`),
   when asked (`self-data/`, `prompt-data/`; `compress.healing_data`);
2. the blocks: the model's own ablation cost A(n) per block of `block_size` layers on the text data's calibration
   split (the conversations' without text) (`blocks.json`); the `drop` cheapest middle blocks (or the fewest that
   reach `keep_flops`, or the `blocks` named) are removed;
3. heal: a LoRA on the remaining layers trained by the one training loop toward the original (`objective`: kd by
   default, the measured best) on the data (`heal/`, a resumable run folder);
4. export: the LoRA merged, the layers gone, a plain folder any engine loads (`model/`, with `reskip.json`);
5. measure: fidelity to the original on its own chat replies and on raw text, perplexity, MMLU where the original
   is above chance, and speed, beside the original (`report.json`, `report.md`, with the command that reproduces it).
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from transformers import AutoModelForCausalLM

from ..ar_retrofit.blocks import retrofit_blocks
from ..backbones.architectures import check_model_folder, model_parameters
from ..backbones.devices import resolve_device
from ..backbones.dtypes import resolve_dtype_name
from ..backbones.loading import load_backbone, load_config
from ..chat.prompt_sets import digest
from ..config_fields import flag_of
from ..data.packing import pack
from ..data.sources import load_splits
from ..errors import ReskipError
from ..io_atomic import atomic_write_json, atomic_write_text
from ..options import PRESETS
from ..progress import Progress
from ..reading import read_json
from ..run_folder.lock import writing
from ..train_config import TrainConfig
from . import healing_data
from .blocks import BlockCosts, backbone_block_costs
from .export import CARD, RECORD, export_run, model_card, read_record
from .healing_run import HealingConfig, read_healing_run
from .measure import measure
from .objectives import parse_objective
from .options import CompressOptions
from .report import card_lines, html_page, markdown
from .speed import compare_speed
from .train import train_lora

SETTINGS, BLOCKS, HEAL, MODEL, REPORT_JSON, REPORT_MD, REPORT_HTML = (
    "compress.json", "blocks.json", "heal", "model", "report.json", "report.md", "report.html")


@dataclasses.dataclass
class Plan:
    """What the options resolve to before any weights load: the healing's TrainConfig (its data the text specs until
    the conversations are written), the blocks of the model, the LoRA's parameter count, the folder's identity (what
    it trains) and the user's prompts (None without --prompts)."""

    cfg: TrainConfig
    blocks: list[range]
    params: int
    identity: dict
    prompts: list[str] | None = None


# The healing LoRA's size, as a share of the model's parameters: the share at which every healing arm was measured
# (the source design's side-channel on SmolLM2-135M-Instruct: 982,663 of 134,515,008), `--params` overrides it
HEALING_SHARE = 982_663 / 134_515_008


def healing_params(config) -> int:
    """The healing LoRA's trainable parameters for a model of this config (no weights load): `HEALING_SHARE` of its
    parameters, counted on the meta device."""
    return round(HEALING_SHARE * model_parameters(config))


def healing_config(o: CompressOptions) -> TrainConfig:
    """The healing's training configuration: the preset's steps, batch and schedule, the options' rate and steps, on
    the text data (the conversations are added once written)."""
    values = {**PRESETS[o.preset]["train"], "lr": o.lr, "seed": 0, **({"steps": o.steps} if o.steps else {})}
    return TrainConfig.from_dict({**values, "model": o.model, "data": healing_data.text_specs(list(o.data)) or
                                  ["default"], "dtype": o.dtype, "device": o.device,
                                  "trust_remote_code": o.trust_remote_code})


def _check_blocks(o: CompressOptions, blocks: list[range]) -> None:
    middle = len(blocks) - 2
    if middle < 1:
        raise ReskipError(f"the model's {sum(len(b) for b in blocks)} layers make {len(blocks)} blocks of "
                          f"{o.block_size} and 0 middle blocks (the first and last are kept): nothing to remove; use "
                          "a smaller --block-size")
    if o.drop is not None and o.drop > middle:
        raise ReskipError(f"--drop {o.drop}: the model has {middle} middle blocks of {o.block_size} layers (the first "
                          "and last are kept)")
    if o.keep_flops is not None:
        least = 1 - sum(len(b) for b in blocks[1:-1]) / sum(len(b) for b in blocks)
        if o.keep_flops < least:
            raise ReskipError(f"--keep-flops {o.keep_flops}: removing every middle block of {o.block_size} layers "
                              f"keeps {least:.3f} of the layers; ask for {least:.3f} or more")
    if o.blocks is not None:
        bad = [b for b in o.blocks if not 2 <= b <= len(blocks) - 1]
        if bad or not o.blocks or len(set(o.blocks)) != len(o.blocks):
            raise ReskipError(f"--blocks {' '.join(map(str, o.blocks))}: name distinct middle blocks, 2 to "
                              f"{len(blocks) - 1} (the model has {len(blocks)} blocks of {o.block_size} layers)")


def _check_chat(o: CompressOptions, prompts: list[str] | None) -> None:
    """On-policy healing samples replies to the data's chat prompts: refuse it before any work when there are none."""
    if not o.on_policy:
        return
    if not parse_objective(o.objective).needs_teacher:
        raise ReskipError(f"--on-policy needs a teacher to score the samples: --objective {o.objective} has none")
    if healing_data.self_conversations(list(o.data)) is None and prompts is None:
        text = healing_data.text_specs(list(o.data))
        splits, _ = load_splits(text)
        if not any(d.messages is not None for d in splits["train"]):
            raise ReskipError("--on-policy samples replies to chat prompts, and the data holds none: add self, "
                              "--prompts FILE or chat JSONL to --data")


def plan(o: CompressOptions) -> Plan:
    """Check every option against the model's config and the data (no weights load); one clear error otherwise."""
    if sum(x is not None for x in (o.drop, o.keep_flops, o.blocks)) > 1:
        raise ReskipError("--drop, --keep-flops and --blocks each choose what to remove: give one")
    resolve_device(o.device)
    loss = parse_objective(o.objective)
    prompts = healing_data.check(list(o.data), o.prompts, o.chat_share)
    _check_chat(o, prompts)
    for h in o.heldout:
        if h in o.data:
            raise ReskipError(f"--heldout {h} is part of --data: held-out text is text no stage saw")
        load_splits([h])
    config = load_config(o.model, o.trust_remote_code)
    blocks = retrofit_blocks(config.num_hidden_layers, o.block_size)
    _check_blocks(o, blocks)
    removed = (sorted(len(blocks[b - 1]) for b in o.blocks) if o.blocks is not None else None)
    most_kept = (int(o.keep_flops * config.num_hidden_layers) if o.keep_flops is not None
                 else config.num_hidden_layers - (sum(removed) if removed else
                                                  (o.drop or 1) * min(len(b) for b in blocks)))
    if o.full_layers > most_kept:
        raise ReskipError(f"--full-layers {o.full_layers}: the compressed model keeps at most {most_kept} layers; "
                          "train fewer in full")
    cfg = healing_config(o)
    cfg.validate()
    params = o.params or healing_params(config)
    if params > model_parameters(config):
        raise ReskipError(f"--params {params:,}: more than the model's own {model_parameters(config):,} parameters; a "
                          "healing LoRA is a small share of it (the default is 0.73%)")
    identity = {"model": o.model, "data": list(o.data), "block_size": o.block_size, "choose": o.choose, "drop": o.drop,
                "keep_flops": o.keep_flops, "objective": loss.text, "preset": o.preset, "lr": o.lr,
                "params": params, "dtype": resolve_dtype_name(o.dtype, resolve_device(o.device)),
                **_changed(o, prompts)}
    return Plan(cfg, blocks, params, identity, prompts)


def _changed(o: CompressOptions, prompts: list[str] | None) -> dict:
    """The identity's newer keys, where they differ from their defaults: a folder made before they existed resumes."""
    chat = healing_data.self_conversations(list(o.data)) is not None or prompts is not None
    out = {"full_layers": o.full_layers, "blocks": o.blocks, "steps": o.steps, "positions": o.positions,
           "on_policy": o.on_policy, "prompts": digest(prompts) if prompts else None}
    defaults = {"full_layers": 0, "blocks": None, "steps": None, "positions": "all", "on_policy": 0.0, "prompts": None}
    out = {k: v for k, v in out.items() if v != defaults[k]}
    if o.on_policy:
        out["on_policy_tokens"] = o.on_policy_tokens
    if chat:
        out.update(reply=o.reply, data_seed=o.data_seed,
                   **({"chat_share": o.chat_share} if healing_data.text_specs(list(o.data)) else {}))
    return out

def check_folder(out: Path, identity: dict) -> None:
    """The folder is compress's own: new, empty, or holding a compression of the same settings (resumed)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ReskipError(f"--out {out} is a file: give a folder")
    if (out / SETTINGS).is_file():
        data = read_json(out / SETTINGS)
        held = data.get("identity") if isinstance(data, dict) else None
        if not isinstance(held, dict):
            raise ReskipError(f"{out / SETTINGS} holds no compression's settings (an object with its identity): it was "
                              "edited or cut; restore it, or choose another --out")
        if held != identity:
            diff = [k for k in identity if not isinstance(held, dict) or held.get(k) != identity[k]]
            raise ReskipError(f"--out {out} holds a compression of other settings ({', '.join(diff)} differ): choose "
                              "another --out, or rerun with the settings it was made with to resume it")
        return
    # the lock: a first try killed at once; the conversations' folders check their own settings (`chat.self_data`),
    # so the model's own conversations written once can be healed on again with other settings
    own = {".lock", healing_data.SELF_FOLDER, healing_data.PROMPTS_FOLDER}
    held = sorted(p.name for p in out.iterdir() if p.name not in own)
    work = [name for name in held if name in (BLOCKS, HEAL, MODEL, REPORT_JSON, REPORT_MD, REPORT_HTML)]
    if work:
        raise ReskipError(f"--out {out} holds a compression's work ({', '.join(work[:5])}) without its {SETTINGS}: the "
                          "settings it was made with are gone, so it cannot be resumed; choose another --out, or "
                          "remove the folder to start again")
    if held:  # a folder compress writes holds compress.json from its first step on
        raise ReskipError(f"--out {out} holds files compress did not write ({', '.join(held[:5])}): choose an empty "
                          "or new folder")


def _check_heal_blocks(out: Path, costs: BlockCosts, layers: list[int]) -> None:
    """A healing already in heal/ was trained on the layers blocks.json chooses now: where it was not, blocks.json
    was changed after the healing (say so, instead of a refusal that points at heal/)."""
    if not (out / HEAL / "config.yaml").is_file():
        return
    try:
        _, healing = read_healing_run(out / HEAL)
    except ReskipError:
        return  # train_lora says what is wrong with heal/ itself
    if not healing.nested and sorted(healing.drop_layers) != layers:
        raise ReskipError(f"{out / HEAL} was healed with layers {sorted(healing.drop_layers)} removed, and {out / BLOCKS} now "
                          f"chooses layers {layers}: blocks.json was changed after the healing; delete blocks.json to "
                          "measure the block costs again (the healing is kept when they choose the same blocks)")


def _exported(folder: Path) -> bool:
    """The model folder is a whole export: its record, config and readable weights (a file deleted or cut since is
    exported again, not measured as it is)."""
    if not (folder / RECORD).is_file() or not any(folder.glob("*.safetensors")):
        return False
    try:
        check_model_folder(folder)
    except ReskipError:
        return False
    return True


def block_costs(o: CompressOptions, p: Plan, data_specs: list[str], out: Path, show) -> BlockCosts:
    """The backbone's cost of removing each block, on the calibration split of `data_specs` (the text data, else the
    conversations)."""
    path = out / BLOCKS
    if path.is_file():
        costs = BlockCosts.from_dict(read_json(path), str(path))
        if costs.kl is not None or o.choose != "kl":
            return costs
    splits, _ = load_splits(data_specs)
    model, tok = load_backbone(o.model, p.cfg.dtype, o.trust_remote_code, o.device)
    n = PRESETS[o.preset]["calibrate"]["sequences"]
    data = pack(tok, splits["calib"], p.cfg.seq_len, n, seed=0)
    show(f"[compress] 2/5 the ablation cost of each of the {len(p.blocks)} blocks on {len(data)} calibration sequences")
    with Progress(len(data), "compress: block costs", unit="seq", enabled=not o.quiet) as bar:
        done = [0]

        def advance(i: int, n: int) -> None:  # measure_blocks reports sequences done so far
            bar.update(i - done[0])
            done[0] = i

        costs = backbone_block_costs(model, data, o.block_size, progress=advance)
    atomic_write_json(path, costs.to_dict())
    return costs


def chosen_blocks(o: CompressOptions, costs: BlockCosts) -> list[int]:
    """The `blocks` named, the `drop` cheapest middle blocks, or the fewest whose removal keeps at most `keep_flops`
    of the layers."""
    if o.blocks is not None:
        return sorted(o.blocks)
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
        if healing_data.self_conversations(list(o.data)) is not None or p.prompts is not None:
            show("[compress] 1/5 data: the original writes the conversations it heals on")
        data = healing_data.write_healing_data(o, p.cfg.dtype, out, p.prompts, show)
        cfg = dataclasses.replace(p.cfg, data=data.specs, data_weights=data.weights)
        text = healing_data.text_specs(list(o.data))
        costs = block_costs(o, p, text or data.specs, out, show)
        blocks = chosen_blocks(o, costs)
        layers = sorted(costs.layers_of(blocks))
        show(f"[compress] 3/5 heal: blocks {blocks} (layers {layers[0]}-{layers[-1]}) removed; a LoRA matched to "
             f"{p.params:,} parameters trained by {o.objective} on {cfg.steps * cfg.batch_size * cfg.seq_len:,} tokens"
             + (f", {o.on_policy:g} of the steps on its own samples" if o.on_policy else ""))
        healing = HealingConfig(params=p.params, drop_layers=layers, drop_blocks=blocks, objective=parse_objective(o.objective).text,
                      full_layers=o.full_layers, positions=o.positions, on_policy=o.on_policy,
                      on_policy_tokens=o.on_policy_tokens)
        _check_heal_blocks(out, costs, layers)
        summary = train_lora(cfg, healing, out / HEAL, show_progress=not o.quiet)
        if not _exported(out / MODEL):
            show(f"[compress] 4/5 export: {out / MODEL}")
            export_run(out / HEAL, out / MODEL, trust_remote_code=o.trust_remote_code, command=command_line(o),
                       compression=out)
        show("[compress] 5/5 measure: the compressed model beside the original")
        report = {"command": command_line(o), "settings": p.identity,
                  "blocks": {**costs.to_dict(), "chosen_by": "named" if o.blocks else o.choose, "removed": blocks,
                             "layers_removed": layers, "layers": sum(len(b) for b in costs.blocks)},
                  "healing": {"objective": healing.objective, "positions": o.positions, "on_policy": o.on_policy,
                              "data": list(o.data), "data_weights": data.weights, "written": data.written,
                              "parameters": summary["lora"]["parameters"] + summary["lora"].get("full_parameters", 0),
                              "full_layers": summary["lora"].get("full_layers", []),
                              "tokens": summary["tokens_seen"], "train_wall_s": summary["train_wall_s"],
                              "val_kl": summary.get("kl_full"), "val_ppl": summary["ppl_full"],
                              "val_ppl_original": summary["ppl_backbone"]},
                  "measured": measure(o, out / MODEL, cfg.seq_len, text, show)}
        if not o.no_speed:
            report["speed"] = _speed(o, out / MODEL, show)
        atomic_write_json(out / REPORT_JSON, report)
        atomic_write_text(out / REPORT_MD, markdown(report))
        atomic_write_text(out / REPORT_HTML, html_page(markdown(report)))
        atomic_write_text(out / MODEL / CARD, model_card(read_record(out / MODEL), command_line(o), card_lines(report)))
    return out / REPORT_JSON


def _speed(o: CompressOptions, folder: Path, show) -> dict:
    original, _ = load_backbone(o.model, o.dtype, o.trust_remote_code, o.device)
    compressed = AutoModelForCausalLM.from_pretrained(folder, dtype=next(original.parameters()).dtype)
    return compare_speed(original, compressed.to(original.device).eval(), show=show)
