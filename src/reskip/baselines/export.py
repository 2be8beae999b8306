"""A trained baseline as a plain Hugging Face model: the pruned layers gone, the LoRA merged into the weights,
the config saying how many layers are left. It loads with `AutoModelForCausalLM.from_pretrained(folder)` anywhere
(no reskip, no PEFT) and runs at the real speed of its smaller depth."""

from __future__ import annotations

from pathlib import Path

from ..io_atomic import atomic_folder
from .arms import load_arm_model, read_arm


def export_run(run_dir: Path, out: Path, dtype: str = "float32") -> Path:
    """Write the run's merged model and its tokenizer to `out` (a folder written whole or not at all)."""
    read_arm(run_dir)  # not a baseline run: one clear error before the model loads
    model, tokenizer = load_arm_model(run_dir, dtype)
    merged = model.merge_and_unload()
    # a GGUF-loaded backbone keeps its quantizer's record; the merged weights are plain tensors
    merged.hf_quantizer = None
    if hasattr(merged.config, "quantization_config"):
        del merged.config.quantization_config

    def write(tmp: Path) -> None:
        merged.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return atomic_folder(Path(out), write)
