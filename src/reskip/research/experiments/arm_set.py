"""An experiment made of arms trained side by side (variants, mix, block-size): every arm gets the preset's training
length, the same data and seed; every arm's configuration is checked before the first trains. An experiment of this
shape says what differs in an `ArmSet` (its arms, how each is measured, which it leaves out on this model, its
claims and tables); `run_arms` does the rest.

`options.arms` runs a subset: the arms are independent run folders, so separate processes (one per core, or per
machine sharing OUT) can train them side by side; the one that finds every arm finished writes the results."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...ar_retrofit.blocks import partition_layers
from ...backbones.devices import resolve_device
from ...backbones.dtypes import resolve_dtype_name
from ...backbones.loading import DEFAULT_BACKBONE, load_config
from ...errors import ReskipError
from ...train.loop import check_against_backbone
from ...train_config import TrainConfig
from ..pipeline import PRESETS, PipelineConfig
from .arms import ARM_FILE, Arm, Measure, finished_twin, run_arm
from .options import ExperimentOptions


def _measure(calib: int, test: int, n_layers: int, n_blocks: int) -> Measure:
    return Measure(calib, test)


@dataclass
class ArmSet:
    """What an experiment of arms says about itself."""

    arms: Callable[[ExperimentOptions, TrainConfig], list[Arm]]  # (options, base config) -> its arms
    claims: Callable[[dict], list[dict]]  # the arms' results -> the claims confronted with them
    tables: Callable[[dict], dict] = lambda results: {}  # the arms' results -> title -> markdown lines
    # (calibration sequences, test sequences, the model's layers, an arm's blocks) -> what an arm measures
    measure: Callable[[int, int, int, int], Measure] = _measure
    # (the model's layers, an arm's blocks) -> why this model cannot run the arm (None: it can)
    left_out: Callable[[int, int], str | None] = lambda n_layers, n_blocks: None


def base_config(options: ExperimentOptions, check: bool = True) -> TrainConfig:
    """The preset's training config with the options' overrides; checked against the backbone unless the
    experiment trains nothing (placement reads the backbone only)."""
    overrides = {**options.overrides, "seed": options.seed}
    if "eval_every" not in overrides:  # ten validations per arm: the curve shows the damage on the way
        steps = overrides.get("steps", PRESETS[options.preset]["train"].get("steps", TrainConfig.steps))
        overrides["eval_every"] = max(1, steps // 10)
    # an arm's A(n) is its calibration's; the skip-branch KL at every validation would be one more pass per block
    overrides.setdefault("skip_kl_curve", False)
    pc = PipelineConfig(trust_remote_code=options.trust_remote_code, preset=options.preset, model=options.model, data=list(options.data), overrides=overrides,
                        dtype=resolve_dtype_name(options.dtype, resolve_device(options.device)), device=options.device)
    if check:
        pc.check()
    return pc.train_config()


def header(options: ExperimentOptions, base: TrainConfig) -> dict:
    return {"experiment": options.name, "preset": options.preset, "model": options.model or DEFAULT_BACKBONE,
            "data": list(base.data), "seed": options.seed, "dtype": base.dtype,
            "training": {"steps": base.steps, "batch_size": base.batch_size, "seq_len": base.seq_len,
                       "tokens": base.steps * base.batch_size * base.seq_len}}


def run_arms(arm_set: ArmSet, options: ExperimentOptions, folder: Path, show) -> dict | None:
    """Train and measure the arms `options.arms` asks for; the results of all once every arm has finished
    (None before: nothing is written but the chosen arms' folders)."""
    base = base_config(options)
    preset = PRESETS[options.preset]
    calib = options.calib_sequences or preset["calibrate"]["sequences"]
    # twice the diagnose stage's sequences: the signal test's bootstrap is over sequences
    test = options.test_sequences or 2 * preset["diagnose"]["signal_sequences"]
    n_layers = load_config(base.model, base.trust_remote_code).num_hidden_layers
    configs, left_out = [], {}
    for arm in arm_set.arms(options, base):
        cfg = arm.config(base)
        rc = cfg.retrofit_config()
        why = arm_set.left_out(n_layers, len(partition_layers(n_layers, rc.block_size, rc.boundaries)))
        if why:
            left_out[arm.name] = why
            show(f"[experiment {options.name}] arm {arm.name} left out: {why}")
            continue
        configs.append((arm, cfg))
    if len(configs) < 2:
        raise ReskipError(f"`{options.name}` has fewer than two arms this model can run ({left_out})")
    chosen = chosen_arms(options, [arm for arm, _ in configs])
    measures = {}
    for arm, cfg in configs:  # every arm's configuration is checked before the first trains
        cfg.validate()
        measures[arm.name] = arm_set.measure(calib, test, n_layers, check_against_backbone(cfg))
    results, pending = {}, []
    for k, (arm, cfg) in enumerate(configs, start=1):
        where = folder / "arms" / slug(arm.name)
        # an arm left to another process is only read: finished, or copied from a finished twin (no training)
        if (arm.name not in chosen and not (where / ARM_FILE).is_file()
                and finished_twin(where, cfg, measures[arm.name]) is None):
            pending.append(arm.name)
            continue
        show(f"[experiment {options.name}] arm {k}/{len(configs)}: {arm.name}")
        results[arm.name] = run_arm(arm, base, where, measures[arm.name], show)
    if pending:
        show(f"[experiment {options.name}] not finished yet: {', '.join(pending)}; results.json is written by the "
             f"run that finds every arm finished (--arms {' '.join(quoted(n) for n in pending)})")
        return None
    out = header(options, base) | {"arms": results, "claims": arm_set.claims(results), "left_out": left_out}
    tables = arm_set.tables(results)
    return out | ({"tables": tables} if tables else {})


def chosen_arms(options: ExperimentOptions, arms: list) -> set[str]:
    """The arms' names that `options.arms` asks for (by name or folder slug); every arm when it is None."""
    names = {arm.name for arm in arms}
    if not options.arms:
        return names
    by_key = {**{slug(n): n for n in names}, **{n: n for n in names}}
    unknown = [a for a in options.arms if a not in by_key]
    if unknown:
        raise ReskipError(f"`{options.name}` has no arm {', '.join(map(repr, unknown))} on this model; "
                          f"its arms: {', '.join(quoted(arm.name) for arm in arms)}")
    return {by_key[a] for a in options.arms}


def quoted(name: str) -> str:
    return repr(name) if " " in name else name


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-")
