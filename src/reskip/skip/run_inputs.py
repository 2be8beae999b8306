"""The one preamble of every stage that reads a trained run: resolve the folder, read the data, refuse an empty
split, check the sequence length against the backbone's positions (its config alone), and only then open the run
(load the backbone and the adapter). Bad input fails in the cheap steps, before any weights load."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..backbones.devices import resolve_device
from ..data.sources import load_splits
from ..errors import ReskipError
from ..options import StageOptions
from .inference_run import AdapterSource, InferenceRun, check_positions, open_run, resolve_adapter

SPLIT_NAMES = {"calib": "calibration"}  # a split's name in messages, where its key is short


@dataclass
class StageInputs:
    run: Path
    source: AdapterSource
    data_specs: list[str]
    splits: dict[str, list]  # split name -> documents
    record: dict  # load_splits' record: per split, the documents' count and digest
    seq_len: int

    def open(self, options: StageOptions, **kwargs) -> InferenceRun:
        """The run opened for inference with the options' backbone, dtype, device and trust (`open_run`'s other
        arguments as keywords)."""
        return open_run(self.run, model=options.model, dtype=options.dtype, device=options.device,
                        trust_remote_code=options.trust_remote_code, **kwargs)


def read_stage_inputs(run, options: StageOptions, splits: tuple[str, ...]) -> StageInputs:
    """Resolve `run`, read its data (the options' specs, else the run's) and refuse any of `splits` that is empty;
    check the sequence length against the backbone's positions. Nothing heavy loads here."""
    resolve_device(options.device)  # a device this machine lacks fails first
    source = resolve_adapter(run)
    specs = list(options.data or source.data_specs)
    documents, record = load_splits(specs)
    for split in splits:
        if not documents[split]:
            raise ReskipError(f"the {SPLIT_NAMES.get(split, split)} split of {specs} is empty: give more documents")
    seq_len = options.seq_len or source.seq_len
    check_positions(source, seq_len, options.model, options.trust_remote_code)
    return StageInputs(Path(run), source, specs, documents, record, seq_len)
