"""What a run folder holds: the name of every file the stages write, in one place.

Each stage writes its own files (parity: parity.json; train: config.yaml, splits.json,
train_log.jsonl, checkpoints/, adapter/, summary.json; calibrate: policy.json; evaluate:
eval/results.json and eval/results.md; diagnose: diagnostics.json; report: report/; the pipeline:
pipeline.json), and every reader finds them here. Paths only: nothing is read or imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunFolder:
    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    @property
    def parity(self) -> Path:
        return self.root / "parity.json"

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def splits(self) -> Path:
        return self.root / "splits.json"

    @property
    def train_log(self) -> Path:
        return self.root / "train_log.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def adapter(self) -> Path:
        return self.root / "adapter"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def policy(self) -> Path:
        return self.root / "policy.json"

    @property
    def eval_dir(self) -> Path:
        return self.root / "eval"

    @property
    def results(self) -> Path:
        return self.eval_dir / "results.json"

    @property
    def results_md(self) -> Path:
        return self.eval_dir / "results.md"

    @property
    def diagnostics(self) -> Path:
        return self.root / "diagnostics.json"

    @property
    def experiments_dir(self) -> Path:
        return self.root / "experiments"  # NAME/results.json per experiment (`reskip experiment`)

    @property
    def report_dir(self) -> Path:
        return self.root / "report"

    @property
    def pipeline(self) -> Path:
        return self.root / "pipeline.json"
