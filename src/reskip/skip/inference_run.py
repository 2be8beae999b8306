"""Opening a run for inference: the one place that turns a run or adapter folder into a model
with its policy.

The sequence, the same for `reskip generate`, `reskip eval`, `reskip calibrate`, `reskip diagnose`,
the lm-eval plug-in and `benchmarks/speed.py`: resolve the folder -> read its policy file ->
fall back to dense where asked (and say so) -> check every spec against the policy file ->
only then load the backbone and the adapter -> check the policy file against the loaded model ->
the window (given, else the policy file's, else DEFAULT_WINDOW, 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from ..ar_retrofit.config import ADAPTER_CONFIG_NAME
from ..ar_retrofit.model import ReskipModel, load_adapter
from ..backbones.devices import device_name, model_device, resolve_device
from ..backbones.dtypes import resolve_dtype_name
from ..backbones.loading import load_backbone, load_config
from ..errors import AdapterError, ReskipError
from ..run_folder import RunFolder
from ..train_config import TrainConfig
from .policies import SkipPolicy
from .policy_file import BUILDERS, PolicyFile, dense_if_uncalibrated, make_policy
from .spec import Spec

DEFAULT_WINDOW = 1


@dataclass
class AdapterSource:
    """A training run folder (adapter/ + config.yaml) or a bare adapter folder."""

    adapter_dir: Path
    run_dir: Path | None
    train_config: TrainConfig | None

    @property
    def folder(self) -> Path:
        """Where this source's own files go (policy.json, eval/, diagnostics.json)."""
        return self.run_dir or self.adapter_dir

    @property
    def files(self) -> RunFolder:
        return RunFolder(self.folder)

    @property
    def policy_path(self) -> Path:
        return self.files.policy

    def policy(self, path: Path | None = None) -> PolicyFile | None:
        """The calibrated PolicyFile (at `path`, default the run's policy.json), or None if there is none."""
        path = path or self.policy_path
        return PolicyFile.load(path) if path.is_file() else None

    @property
    def model_name(self) -> str | None:
        return self.train_config.model if self.train_config else None

    @property
    def data_specs(self) -> list[str]:
        return self.train_config.data if self.train_config else ["default"]

    @property
    def seq_len(self) -> int:
        """The training sequence length, the default length of calibration and evaluation sequences."""
        return self.train_config.seq_len if self.train_config else 256


def resolve_adapter(path) -> AdapterSource:
    """A training run folder (with adapter/ and config.yaml) or a bare adapter folder."""
    path = Path(path)
    run = RunFolder(path)
    if (run.adapter / ADAPTER_CONFIG_NAME).is_file():
        cfg = TrainConfig.from_file(run.config) if run.config.is_file() else None
        return AdapterSource(run.adapter, path, cfg)
    if (path / ADAPTER_CONFIG_NAME).is_file():
        return AdapterSource(path, None, None)
    raise AdapterError(f"{path} is neither a run folder (with adapter/) nor an adapter folder (with {ADAPTER_CONFIG_NAME})")


def check_positions(source: AdapterSource, seq_len: int, model: str | None = None,
                    trust_remote_code: bool = False) -> None:
    """Refuse sequences longer than the backbone's positions, from its config alone (before any weights load)."""
    limit = getattr(load_config(model or source.model_name, trust_remote_code), "max_position_embeddings", None)
    if limit is not None and seq_len > limit:
        raise ReskipError(f"--seq-len {seq_len} exceeds the model's limit of {limit} positions")


def load_retrofitted(source: AdapterSource, model: str | None = None, dtype: str | torch.dtype = "auto",
                     trust_remote_code: bool = False, device: str | torch.device = "auto"):
    """(ReskipModel, tokenizer) for the source's adapter on its backbone (or `model`), on `device`."""
    base, tokenizer = load_backbone(model or source.model_name, dtype, trust_remote_code, device)
    return load_adapter(base, source.adapter_dir), tokenizer


@dataclass
class InferenceRun:
    source: AdapterSource
    model: ReskipModel
    tokenizer: object
    policy_file: PolicyFile | None
    window: int
    specs: list[Spec] = field(default_factory=list)  # after the dense fallback
    seed: int = 0
    dtype: str = "float32"  # the backbone's compute dtype, resolved ('auto' never appears here)
    device: str = "cpu"  # where the model computes, resolved ('cpu', 'cuda:N')
    policies: dict[str, SkipPolicy] = field(default_factory=dict)  # spec text -> the policy built when opened

    def policy(self, spec: Spec | None = None) -> SkipPolicy:
        """The policy of `spec` (default: the first spec opened with): the one built when the run was opened, or
        a new one from this run's policy file for a spec it was not opened with."""
        spec = spec or self.specs[0]
        if spec.text in self.policies:
            return self.policies[spec.text]
        return make_policy(spec, self.policy_file, self.seed)


@torch.no_grad()
def check_finite(rm, adapter_dir) -> None:
    """One short pass (16 tokens) with the side-channel as trained: weights that are finite but overflow in the
    forward pass (logits inf or nan) stop every stage here, naming the adapter, before any work or any file."""
    vocab = rm.base_model.config.vocab_size
    ids = (torch.arange(16, device=model_device(rm)) * 7919 % vocab).unsqueeze(0)  # (1, 16), spread over the vocab
    logits = rm(input_ids=ids, use_cache=False).logits
    if not torch.isfinite(logits).all():
        raise ReskipError(f"the adapter {adapter_dir} makes the model's logits non-finite (inf or nan) on a 16-token "
                          "input: its weights overflow in the forward pass; train it again or restore it")


def open_run(path, specs: Sequence[Spec] = (), *, model: str | None = None, dtype: str | torch.dtype = "auto",
             device: str | torch.device = "auto", window: int | None = None, seed: int = 0, trust_remote_code: bool = False,
             dense_fallback: bool = False, require_policy: bool = False, use_policy: bool = True) -> InferenceRun:
    """Open `path` for inference under `specs` (policies; methods such as `backbone` pass through).

    dense_fallback: without a policy file, specs that need one become `none` (with a note on
    stderr) instead of an error. require_policy: a missing policy file is an error. A spec given as
    a policy-file path reads that file instead of the run's policy.json. use_policy=False: the run's policy file
    is neither read nor checked (calibration, which writes a new one)."""
    device = resolve_device(device)  # a bad or absent device fails first
    source = resolve_adapter(path)
    explicit = next((Path(s.path) for s in specs if s.path), None)
    policy_file = PolicyFile.load(explicit) if explicit else (source.policy() if use_policy else None)
    if require_policy and policy_file is None:
        policy_file = PolicyFile.load(source.policy_path)  # the error says how to make one
    if dense_fallback:
        specs = [dense_if_uncalibrated(s, policy_file, source.adapter_dir) for s in specs]
    # every policy is built here, so a bad spec fails before the model loads; they are kept for use
    policies = {s.text: make_policy(s, policy_file, seed) for s in specs if s.kind in BUILDERS}
    rm, tokenizer = load_retrofitted(source, model, dtype, trust_remote_code, device)
    check_finite(rm, source.adapter_dir)
    if policy_file is not None:
        policy_file.check_model(rm)
    window = window or (policy_file.data["window"] if policy_file else DEFAULT_WINDOW)
    dtype_name = resolve_dtype_name(next(rm.base_model.parameters()).dtype)
    return InferenceRun(source, rm, tokenizer, policy_file, window, list(specs), seed, dtype_name,
                        device_name(model_device(rm)), policies)
