"""A healing run as a plain Hugging Face model, as users receive a model: the pruned layers gone, the LoRA merged into
the weights (in float32, then written in the dtype the original is published in: bfloat16 for the bundled
SmolLM2-135M-Instruct, whose publisher ships bfloat16 weights; a float32 copy would be twice the bytes and hold
nothing more, the original itself computing in bfloat16), the config saying how many layers are left, and a model
card (`README.md`: `base_model`, the layers removed, the healing's data and tokens, the fidelity measured, the
command). It loads with `AutoModelForCausalLM.from_pretrained(folder)` anywhere (no reskip, no PEFT) and runs at the
real speed of its smaller depth; its files get the user's umask.

Beside the model's own files the folder holds `reskip.json`, its record: the backbone it came from, the layers and
blocks removed, how it was healed. No loader needs it; `reskip eval --methods export:DIR` reads it to score the
folder against its backbone at the compute it spends."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from peft import PeftModel

from ..backbones.loading import published
from ..errors import ReskipError
from ..io_atomic import atomic_folder
from ..reading import read_json
from .healing_run import layers_removed_by, load_healed_model, read_healing_run

RECORD, CARD = "reskip.json", "README.md"
COMPRESS_SETTINGS = "compress.json"  # a compression's folder (`compress.run`): its model/ is its report's
# every file an export writes: the model's (transformers' names), the tokenizer's, the record and the card
EXPORT_FILES = re.compile(r"(config|generation_config|tokenizer|tokenizer_config|special_tokens_map|added_tokens|"
                          r"vocab|model\.safetensors\.index)\.json|model(-\d+-of-\d+)?\.safetensors|merges\.txt|"
                          r"tokenizer\.model|chat_template\.jinja|reskip\.json|README\.md")


def check_out(run_dir: Path, out: Path, compression: Path | None = None) -> None:
    """Refuse an output folder export must not replace: the working folder or one above it, the healing run itself (or a
    folder inside it or holding it), or a folder that holds anything but an earlier export (its `RECORD`)."""
    if not str(out) or str(out) == ".":
        raise ReskipError("--out is empty: name the folder to write the model into")
    target, here, own = Path(out).resolve(), Path.cwd().resolve(), Path(run_dir).resolve()
    if target == here or target in here.parents:
        raise ReskipError(f"--out {out} is the working folder (or holds it): name a new folder for the model")
    if target == own or own in target.parents or target in own.parents:
        raise ReskipError(f"--out {out} is the healing run's own folder, inside it or around it: name a folder outside {run_dir}")
    own = compression is not None and target.parent == Path(compression).resolve()  # compress writing its own model/
    if (target.parent / COMPRESS_SETTINGS).is_file() and not own:
        raise ReskipError(f"--out {out} is inside the compression {target.parent} (its report describes what is "
                          "there): export into a folder of its own")
    if target.is_dir() and any(target.iterdir()):
        foreign = sorted(p.name for p in target.iterdir() if not EXPORT_FILES.fullmatch(p.name) or p.is_dir())
        if foreign or not (target / RECORD).is_file() or not (target / "config.json").is_file():
            held = ", ".join(foreign[:5] or sorted(p.name for p in target.iterdir())[:5])
            raise ReskipError(f"--out {out} holds files export did not write ({held}): choose an empty or new folder "
                              "(an earlier export, which holds only a model's files and reskip.json, is replaced); "
                              "nothing was touched")


def export_run(run_dir: Path, out: Path, dtype: str = "auto", trust_remote_code: bool = False,
               depth: int | None = None, command: str | None = None, compression: Path | None = None) -> Path:
    """Write the run's merged model, its tokenizer, its record and its model card to `out` (a folder written whole
    or not at all; an earlier export there is replaced, anything else refused: `check_out`). A nested-depths healing run is
    written at `depth` (which it needs; 0: the backbone itself). dtype: auto (the original's published dtype),
    float32 or bfloat16. `command`: what made it, for the card (default: the `reskip export` that does).
    `compression`: the compress folder writing its own model/ (the only export allowed inside one)."""
    cfg, healing = read_healing_run(run_dir)  # not a baseline run: one clear error before the model loads
    drop = layers_removed_by(healing, run_dir, depth)  # a depth the healing does not serve: refused here too
    check_out(run_dir, out, compression)
    base_model, published_dtype = published(cfg.model, trust_remote_code)
    dtype = published_dtype if dtype == "auto" else dtype
    model, tokenizer = load_healed_model(run_dir, "float32", trust_remote_code=trust_remote_code, depth=depth)
    merged = model.merge_and_unload() if isinstance(model, PeftModel) else model  # nested depth 0: no LoRA
    merged = merged.to(getattr(torch, dtype))  # merged in float32, then rounded once
    n_layers = merged.config.num_hidden_layers + len(drop)
    # a GGUF-loaded backbone keeps its quantizer's record; the merged weights are plain tensors
    merged.hf_quantizer = None
    if hasattr(merged.config, "quantization_config"):
        del merged.config.quantization_config
    blocks = healing.nested_blocks[:depth] if healing.nested else list(healing.drop_blocks)
    record = {"backbone": cfg.model, "backbone_layers": n_layers, "drop_layers": drop, "drop_blocks": blocks,
              "healing": {"objective": healing.objective, "temperature": healing.temperature, "lora_parameters": healing.params,
                          **({"full_layers": healing.full_layers, "full_lr_mult": healing.full_lr_mult} if healing.full_layers else {}),
                          "steps": cfg.steps, "tokens": cfg.steps * cfg.batch_size * cfg.seq_len, "lr": cfg.lr,
                          "data": list(cfg.data),
                          **({"nested_blocks": healing.nested_blocks, "depth": depth} if healing.nested else {})},
              "dtype": dtype, "base_model": base_model}
    command = command or f"reskip export {run_dir} --out {out}"

    def write(tmp: Path) -> None:
        merged.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / RECORD).write_text(json.dumps(record, indent=2))
        (tmp / CARD).write_text(model_card(record, command))

    return atomic_folder(Path(out), write)


def read_record(folder: Path) -> dict:
    """An exported folder's record (`RECORD`), checked for what scoring it needs."""
    path = Path(folder) / RECORD
    if not path.is_file():
        raise ReskipError(f"{folder} is not a folder `reskip export` or `reskip compress` wrote (no {RECORD})")
    record = read_json(path)
    ok = (isinstance(record, dict) and isinstance(record.get("backbone_layers"), int)
          and isinstance(record.get("drop_layers"), list) and all(isinstance(i, int) for i in record["drop_layers"])
          and isinstance(record.get("drop_blocks"), list))
    if not ok:
        raise ReskipError(f"{path}: backbone_layers, drop_layers and drop_blocks are missing or not numbers: restore "
                          "it, or export the healing run again")
    return record


def model_card(record: dict, command: str, fidelity: list[str] | None = None) -> str:
    """The exported folder's README.md: a Hugging Face model card (its YAML header names `base_model`) saying what
    was removed, how the rest was healed and on what, what was measured (`fidelity`: the report's lines, when
    measured) and the command that made it."""
    h = record["healing"]
    base = record.get("base_model") or record.get("backbone") or "smollm2-135m-instruct"  # exports before the card
    layers = record["backbone_layers"]
    kept = layers - len(record["drop_layers"])
    head = ["---", f"base_model: {base}", "library_name: transformers", "tags:", "- reskip",
            "- pruned", "- distillation", "---", ""]
    body = [f"# {base}, {layers} -> {kept} layers", "",
            f"Made by reskip from `{base}`: decoder layers "
            f"{', '.join(map(str, record['drop_layers']))} (blocks {record['drop_blocks']}) removed, the rest healed by "
            f"a LoRA of {h['lora_parameters']:,} parameters trained by `{h['objective']}` toward the original on "
            f"{h['tokens']:,} tokens ({h['steps']} steps) of {', '.join(Path(d).name for d in h['data'])}, then merged. "
            f"Weights in {record.get('dtype', 'float32')}. It loads with `AutoModelForCausalLM.from_pretrained` and needs nothing "
            "else.", ""]
    body += ["## How close it stays to the original", "", *(fidelity or [
        "Not measured here: `reskip compress` measures it (its report.md), or score this folder with "
        "`reskip eval RUN --methods export:THIS_FOLDER`."]), ""]
    body += ["## Made with", "", f"`{command}`", ""]
    return "\n".join(head + body)
