"""A trained baseline as a plain Hugging Face model: the pruned layers gone, the LoRA merged into the weights,
the config saying how many layers are left. It loads with `AutoModelForCausalLM.from_pretrained(folder)` anywhere
(no reskip, no PEFT) and runs at the real speed of its smaller depth.

Beside the model's own files the folder holds `reskip.json`, its record: the backbone it came from, the layers and
blocks removed, how it was healed. No loader needs it; `reskip eval --methods export:DIR` reads it to score the
folder against its backbone at the compute it spends."""

from __future__ import annotations

import json
from pathlib import Path

from peft import PeftModel

from ..errors import ReskipError
from ..io_atomic import atomic_folder
from ..reading import read_json
from .arm import arm_layers, load_arm_model, read_arm

RECORD = "reskip.json"


def check_out(run_dir: Path, out: Path) -> None:
    """Refuse an output folder export must not replace: the working folder or one above it, the arm itself (or a
    folder inside it or holding it), or a folder that holds anything but an earlier export (its `RECORD`)."""
    if not str(out) or str(out) == ".":
        raise ReskipError("--out is empty: name the folder to write the model into")
    target, here, arm = Path(out).resolve(), Path.cwd().resolve(), Path(run_dir).resolve()
    if target == here or target in here.parents:
        raise ReskipError(f"--out {out} is the working folder (or holds it): name a new folder for the model")
    if target == arm or arm in target.parents or target in arm.parents:
        raise ReskipError(f"--out {out} is the arm's own folder, inside it or around it: name a folder outside {run_dir}")
    if target.is_dir() and any(target.iterdir()) and not (target / RECORD).is_file():
        held = ", ".join(sorted(p.name for p in target.iterdir())[:5])
        raise ReskipError(f"--out {out} holds files export did not write ({held}): choose an empty or new folder; "
                          "nothing was touched")


def export_run(run_dir: Path, out: Path, dtype: str = "float32", trust_remote_code: bool = False,
               depth: int | None = None) -> Path:
    """Write the run's merged model, its tokenizer and its record to `out` (a folder written whole or not at all;
    an earlier export there is replaced, anything else refused: `check_out`). A nested-depths arm is written at
    `depth` (which it needs; 0: the backbone itself)."""
    cfg, arm = read_arm(run_dir)  # not a baseline run: one clear error before the model loads
    drop = arm_layers(arm, run_dir, depth)  # a depth the arm does not serve: refused here too
    check_out(run_dir, out)
    model, tokenizer = load_arm_model(run_dir, dtype, trust_remote_code=trust_remote_code, depth=depth)
    merged = model.merge_and_unload() if isinstance(model, PeftModel) else model  # nested depth 0: no LoRA
    n_layers = merged.config.num_hidden_layers + len(drop)
    # a GGUF-loaded backbone keeps its quantizer's record; the merged weights are plain tensors
    merged.hf_quantizer = None
    if hasattr(merged.config, "quantization_config"):
        del merged.config.quantization_config
    blocks = arm.nested_blocks[:depth] if arm.nested else list(arm.drop_blocks)
    record = {"backbone": cfg.model, "backbone_layers": n_layers, "drop_layers": drop, "drop_blocks": blocks,
              "healing": {"objective": arm.objective, "temperature": arm.temperature, "lora_parameters": arm.params,
                          **({"full_layers": arm.full_layers, "full_lr_mult": arm.full_lr_mult} if arm.full_layers else {}),
                          "steps": cfg.steps, "tokens": cfg.steps * cfg.batch_size * cfg.seq_len, "lr": cfg.lr,
                          "data": list(cfg.data),
                          **({"nested_blocks": arm.nested_blocks, "depth": depth} if arm.nested else {})},
              "dtype": dtype}

    def write(tmp: Path) -> None:
        merged.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / RECORD).write_text(json.dumps(record, indent=2))

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
                          "it, or export the arm again")
    return record
