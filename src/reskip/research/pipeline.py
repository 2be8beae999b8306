"""`reskip run`: parity -> training -> calibration -> evaluation -> diagnostics -> report, into one folder.

Each stage is the library function of its subpackage, called here with typed options (no
command line in between). Each finished stage is recorded in RUN/pipeline.json; a resumed run
skips finished stages and continues training from its last checkpoint. Budgets come from a
preset; explicit training values override them.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from ..backbones.devices import device_name
from ..backbones.dtypes import describe, resolve_dtype_name
from ..config_fields import check_fields
from ..data.heldout import HELDOUT_SOURCES
from ..data.sources import load_splits
from ..errors import ReskipError
from ..evaluate.options import EvalOptions
from ..evaluate.run import evaluate_run, margin_violations
from ..evaluate.tables import markdown
from ..io_atomic import atomic_write_json
from ..memory import peak_rss_gib
from ..options import PRESETS, ParityOptions, RunOptions
from ..reading import is_finite_number, read_json
from ..run_folder import RunFolder
from ..run_folder.lock import writing
from ..run_folder.versions import read_run_file, stamped
from ..skip.policy_file import PolicyFile
from ..skip.spec import METHOD_KINDS, parse_specs
from ..train.checkpoint import latest_checkpoint
from ..train.log import format_summary
from ..train.loop import check_against_backbone
from ..train.run import train_run
from ..train_config import TrainConfig
from .calibrate.options import CalibrateOptions
from .calibrate.run import calibrate_run, format_policy
from .diagnose import diagnose_run
from .parity import parity_run
from .report.options import DiagnoseOptions
from .report.page import report_run

MC_METHODS = ("backbone", "retrofit", "reskip:budget=1")
STAGES = ("parity", "train", "calibrate", "eval", "diagnose", "report")
RETROFIT_KEYS = ("block_size", "rank", "boundaries", "skip_path", "shortcut_rank", "variant")

@dataclass
class PipelineConfig(RunOptions):
    """A run's options (`RunOptions`: the preset, the backbone, the data, training values over the preset, the
    calibration's delta, the dtype) and the stages' options they give."""

    def check(self) -> None:
        if self.preset not in PRESETS:
            raise ReskipError(f"unknown preset {self.preset!r}; valid: {', '.join(PRESETS)}")
        check_fields(self)
        resolve_dtype_name(self.dtype)  # an unknown name fails here
        cfg = self.train_config()
        cfg.validate()
        check_against_backbone(cfg)  # the backbone's config only: a bad partition fails before any weights load

    def train_config(self) -> TrainConfig:
        values = {**PRESETS[self.preset]["train"], **self.overrides}
        retrofit = {k: values.pop(k) for k in RETROFIT_KEYS if k in values}
        return TrainConfig.from_dict({**values, "model": self.model, "data": list(self.data), "retrofit": retrofit,
                                      "dtype": self.dtype, "device": self.device,
                                      "trust_remote_code": self.trust_remote_code})

    def calibrate_options(self) -> CalibrateOptions:
        return CalibrateOptions(delta=self.delta, **self.backbone(), **PRESETS[self.preset]["calibrate"])

    def eval_options(self) -> EvalOptions:
        # The budgeted policy is the run's ReSkip (calibrate stores the frontier); every method is
        # also measured on the held-out source, with the thresholds calibrated on the run's data.
        heldout = [s for s in HELDOUT_SOURCES if s not in self.data]
        return EvalOptions(quiet=True, **self.backbone(),
                           mc_methods=parse_specs(list(MC_METHODS), METHOD_KINDS), heldout=heldout or None,
                           calib_sequences=PRESETS[self.preset]["calibrate"]["sequences"], **PRESETS[self.preset]["eval"])

    def diagnose_options(self) -> DiagnoseOptions:
        return DiagnoseOptions(**self.backbone(), **PRESETS[self.preset]["diagnose"])

    def backbone(self) -> dict:
        """The backbone options every stage of the run takes as the run's (the model is the run's own)."""
        return {"dtype": self.dtype, "device": self.device, "trust_remote_code": self.trust_remote_code}


def _state(run: RunFolder) -> dict:
    """pipeline.json, its fields checked (a list of finished stages, a table of timings, the settings a resume
    reads), or a fresh state."""
    if not run.pipeline.is_file():
        return stamped("pipeline.json", {"finished": [], "timings": {}})
    state = read_run_file(run.pipeline)

    def need(cond: bool, what: str) -> None:
        if not cond:
            raise ReskipError(f"{run.pipeline}: {what}; it is corrupt: restore it, or start the run anew in another "
                              "--out")

    need(isinstance(state, dict), "the top level is not an object")
    need(isinstance(state.get("finished"), list) and all(s in STAGES for s in state["finished"]),
         f"finished must be a list of stages among {', '.join(STAGES)}")
    need(isinstance(state.get("timings", {}), dict), "timings must be an object")
    for key in ("preset", "data", "delta"):
        need(key in state, f"it has no {key!r}")
    need(state["preset"] in PRESETS, f"preset {str(state['preset'])[:40]!r} is not one of {', '.join(PRESETS)}")
    need(isinstance(state["data"], list) and all(isinstance(d, str) for d in state["data"]), "data must be a list of specs")
    need(state.get("model") is None or isinstance(state["model"], str), "model must be a name, a path or null")
    need(isinstance(state.get("trust_remote_code", False), bool), "trust_remote_code must be true or false")
    need(isinstance(state.get("overrides", {}), dict), "overrides must be an object")
    need(is_finite_number(state["delta"]), "delta must be a finite number")
    return state


def config_of(state: dict) -> PipelineConfig:
    """The PipelineConfig a pipeline.json records."""
    return PipelineConfig(preset=state["preset"], model=state["model"], data=state["data"],
                          overrides=state.get("overrides", {}), delta=state["delta"], dtype=state["dtype"],
                          trust_remote_code=state.get("trust_remote_code", False))


def run_pipeline(run_dir: Path, config: PipelineConfig | None = None, resume: bool = False) -> dict:
    """Run (or, with `resume`, continue) the pipeline in `run_dir`; returns the pipeline state."""
    run = RunFolder(run_dir)
    if resume and not run.pipeline.is_file():
        raise ReskipError(f"{run.root} is not a pipeline run folder (no pipeline.json)")
    if not resume and run.pipeline.is_file():
        raise ReskipError(f"{run.root} already holds a run: use --resume {run.root} or another --out")
    held = [p.name for p in (run.config, run.adapter, run.summary, run.checkpoints) if p.exists()]
    if not resume and held:  # a training run of `reskip train`'s, not this pipeline's: never trained over
        raise ReskipError(f"{run.root} holds a training run ({', '.join(held)}) that `reskip run` did not start: "
                          "choose another --out (`reskip calibrate`, `eval` and `report` take that run as it is)")
    with writing(run.root):
        return _run_stages(run, config, resume)


def _run_stages(run: RunFolder, config: PipelineConfig | None, resume: bool) -> dict:
    state = _state(run)
    asked_device = (config or PipelineConfig()).device
    if resume:  # the run's own settings, whatever was passed; the device is this machine's, as asked now
        config = dataclasses.replace(config_of(state), device=asked_device)
    config = config or PipelineConfig()
    config.check()  # bad values fail here, before any stage runs
    if not resume:  # so do data that give no documents and settings the backbone's config rules out
        load_splits(config.data)
        check_against_backbone(config.train_config())
    device = device_name(config.device)  # resolved once: every stage computes there
    print(f"[dtype] {describe(config.dtype, device)} on {device}", flush=True)
    config = dataclasses.replace(config, dtype=resolve_dtype_name(config.dtype, device), device=device)
    run.root.mkdir(parents=True, exist_ok=True)
    if not resume:
        state.update(preset=config.preset, model=config.model, trust_remote_code=config.trust_remote_code,
                     data=list(config.data), delta=config.delta,
                     overrides=dict(config.overrides), dtype=config.dtype)
    if not resume or state.get("device") != device:  # where the latest stages ran
        state["device"] = device
        atomic_write_json(run.pipeline, state)
    stages = {
        "parity": lambda: _parity(run, config),
        "train": lambda: _train(run, config),
        "calibrate": lambda: print(format_policy(PolicyFile.load(calibrate_run(run.root, config.calibrate_options())))),
        "eval": lambda: _eval(run, config),
        "diagnose": lambda: diagnose_run(run.root, config.diagnose_options()),
        "report": lambda: report_run(run.root),
    }
    for i, stage in enumerate(STAGES, start=1):
        if stage in state["finished"]:
            print(f"[{i}/{len(STAGES)}] {stage}: already finished", flush=True)
            continue
        print(f"[{i}/{len(STAGES)}] {stage} ...", flush=True)
        t = time.time()
        try:
            stages[stage]()
        except ReskipError as e:
            raise ReskipError(f"stage {stage} failed ({e}); fix it and continue with: reskip run --resume {run.root}") from e
        state["finished"].append(stage)
        state["timings"][stage] = time.time() - t
        state.setdefault("peak_rss_gib", {})[stage] = round(peak_rss_gib(), 3)  # the process's high-water mark so far
        atomic_write_json(run.pipeline, state)
        print(f"[{i}/{len(STAGES)}] {stage}: done in {state['timings'][stage]:.0f} s", flush=True)
    return state


def _parity(run: RunFolder, config: PipelineConfig) -> None:
    result = read_json(parity_run(run.root, ParityOptions(config.model, device=config.device,
                                                          trust_remote_code=config.trust_remote_code,
                                                          retrofit=config.train_config().retrofit_config())))
    if not all(r["equal"] for r in result["parity"]):
        raise ReskipError("step-zero parity is not exact: the retrofit at c = 0 differs from the backbone")


def _train(run: RunFolder, config: PipelineConfig) -> None:
    # the pipeline owns its folder (pipeline.json says which run it is): training files of a stopped first
    # attempt without a checkpoint are its own, replaced
    summary = train_run(run.root, config.train_config(), resume=latest_checkpoint(run.root) is not None, overwrite=True)
    if summary:
        print(format_summary(read_json(summary)))


def _eval(run: RunFolder, config: PipelineConfig) -> None:
    results = read_json(evaluate_run(run.root, config.eval_options()))
    print(markdown(results))
    bad = margin_violations(results)
    if bad:
        raise ReskipError(f"BUG: top-1 changed where 2 eps < Delta for {bad}")

