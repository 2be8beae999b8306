"""Running an experiment: its arms (or, for `placement`, the probe) -> OUT/experiments/NAME/results.json
and results.md. Every arm of one experiment gets the preset's training budget, the same data and seed;
bad options and every arm's configuration are checked before the first arm trains.

`arms` runs a subset: the arms of one experiment are independent run folders, so separate processes
(one per core, or per machine sharing OUT) can train them side by side; the one that finds every arm
finished writes the results."""

from __future__ import annotations

import time
from pathlib import Path

from ..backbones.dtypes import resolve_dtype_name
from ..backbones.loading import DEFAULT_BACKBONE, load_config
from ..data.sources import load_splits
from ..ar_retrofit.blocks import partition_layers
from ..errors import ReskipError, check_range
from ..pipeline import PRESETS, PipelineConfig
from ..runs import RunFolder
from ..train_config import TrainConfig
from ..train.loop import check_against_backbone
from . import baselines, block_size, mix, placement, scale, variants
from .arms import ARM_FILE, Measure, finished_twin, run_arm
from .options import EXPERIMENTS, ExperimentOptions
from .record import write

DEFAULT_OUT = "runs/experiments"


def folder_of(options: ExperimentOptions) -> Path:
    return RunFolder(Path(options.out or DEFAULT_OUT)).experiments_dir / options.name


def run_experiment(options: ExperimentOptions, show=print) -> Path | None:
    """Run (or finish) one experiment; returns its results.json, or None while arms that `options.arms` left
    to other processes have not finished (then nothing is written but the chosen arms' folders)."""
    if options.name not in EXPERIMENTS:
        raise ReskipError(f"unknown experiment {options.name!r}; valid: {', '.join(EXPERIMENTS)}")
    if options.preset not in PRESETS:
        raise ReskipError(f"unknown preset {options.preset!r}; valid: {', '.join(PRESETS)}")
    for flag, value in (("calib-sequences", options.calib_sequences), ("test-sequences", options.test_sequences),
                        ("budget-bytes", options.budget_bytes), ("context", options.context),
                        ("dtype-bytes", options.dtype_bytes)):
        check_range(flag, value, 1)
    folder = folder_of(options)
    t0 = time.perf_counter()
    if options.name == "placement":
        if options.arms:
            raise ReskipError("`placement` has no arms (it trains nothing): drop --arms")
        base = _base(options, check=False)
        result = placement.run(options, base, _header(options, base), show)
    elif options.name in ("scale", "baselines"):  # arms that are whole runs of their own kind
        result = {"scale": scale, "baselines": baselines}[options.name].run(options, folder, show)
        if result is None:
            return None
    else:
        result = _arms(options, folder, show)
        if result is None:
            return None
    result["wall_s"] = time.perf_counter() - t0
    return write(folder, result)


def _base(options: ExperimentOptions, check: bool = True):
    """The preset's training config with the options' overrides; checked against the backbone unless the
    experiment trains nothing (placement reads the backbone only)."""
    overrides = {**options.overrides, "seed": options.seed}
    if "eval_every" not in overrides:  # ten validations per arm: the curve shows the damage on the way
        steps = overrides.get("steps", PRESETS[options.preset]["train"].get("steps", TrainConfig.steps))
        overrides["eval_every"] = max(1, steps // 10)
    # an arm's A(n) is its calibration's; the skip-branch KL at every validation would be one more pass per block
    overrides.setdefault("skip_kl_curve", False)
    pc = PipelineConfig(options.preset, options.model, list(options.data), overrides,
                        dtype=resolve_dtype_name(options.dtype))
    if check:
        pc.check()
    return pc.train_config()


def _arms(options: ExperimentOptions, folder: Path, show) -> dict:
    base = _base(options)
    preset = PRESETS[options.preset]
    calib = options.calib_sequences or preset["calibrate"]["sequences"]
    # twice the diagnose stage's sequences: the signal test's bootstrap is over sequences
    test = options.test_sequences or 2 * preset["diagnose"]["signal_sequences"]
    if options.name == "variants":
        arms = variants.ARMS
    elif options.name == "mix":
        _, record = load_splits(base.data)
        parts = sorted(record["splits"]["train"]["by_source"])
        if len(parts) < 2:
            raise ReskipError(f"the data {base.data} has one part ({parts}): `mix` needs a mix of sources")
        arms = mix.arms_for(parts)
    else:
        arms = block_size.arms_for(options.boundaries)
    n_layers = load_config(base.model, base.trust_remote_code).num_hidden_layers
    configs, left_out = [], {}
    for arm in arms:
        cfg = arm.config(base)
        rc = cfg.retrofit_config()
        n_blocks = len(partition_layers(n_layers, rc.block_size, rc.boundaries))
        if options.name == "block-size" and n_blocks < 3:  # a size this model is too shallow for
            left_out[arm.name] = f"{n_blocks} blocks of {n_layers} layers: no middle block to skip or route"
            show(f"[experiment {options.name}] arm {arm.name} left out: {left_out[arm.name]}")
            continue
        configs.append((arm, cfg))
    if len(configs) < 2:
        raise ReskipError(f"`{options.name}` has fewer than two arms this model can run ({left_out})")
    chosen = _chosen(options, [arm for arm, _ in configs])
    measures = {}
    for arm, cfg in configs:  # every arm's configuration is checked before the first trains
        cfg.validate()
        n_blocks = check_against_backbone(cfg)
        sizes = options.name == "block-size"
        budgets = block_size.budgets_for(n_layers, n_blocks) if sizes else ()
        measures[arm.name] = Measure(calib, test, budgets=budgets, signal=not sizes)
    results, pending = {}, []
    for k, (arm, cfg) in enumerate(configs, start=1):
        where = folder / "arms" / _slug(arm.name)
        # an arm left to another process is only read: finished, or copied from a finished twin (no training)
        if arm.name not in chosen and not (where / ARM_FILE).is_file() and finished_twin(where, cfg, measures[arm.name]) is None:
            pending.append(arm.name)
            continue
        show(f"[experiment {options.name}] arm {k}/{len(configs)}: {arm.name}")
        results[arm.name] = run_arm(arm, base, where, measures[arm.name], show)
    if pending:
        show(f"[experiment {options.name}] not finished yet: {', '.join(pending)}; results.json is written by the "
             f"run that finds every arm finished (--arms {' '.join(_quoted(n) for n in pending)})")
        return None
    module = {"variants": variants, "mix": mix, "block-size": block_size}[options.name]
    out = _header(options, base) | {"arms": results, "claims": module.claims(results), "left_out": left_out}
    if options.name == "mix":
        out["tables"] = {"Entropy share per block (H / log n, last validation)": mix.entropy_table(results)}
    if options.name == "block-size":
        out["tables"] = {"Skip frontier in layers (ppl / retrofit, calibration split)": block_size.frontier_table(results)}
    return out


def _header(options: ExperimentOptions, base) -> dict:
    return {"experiment": options.name, "preset": options.preset, "model": options.model or DEFAULT_BACKBONE,
            "data": list(base.data), "seed": options.seed, "dtype": base.dtype,
            "budget": {"steps": base.steps, "batch_size": base.batch_size, "seq_len": base.seq_len,
                       "tokens": base.steps * base.batch_size * base.seq_len}}


def _chosen(options: ExperimentOptions, arms: list) -> set[str]:
    """The arms' names that `options.arms` asks for (by name or folder slug); every arm when it is None."""
    names = {arm.name for arm in arms}
    if not options.arms:
        return names
    by_key = {**{_slug(n): n for n in names}, **{n: n for n in names}}
    unknown = [a for a in options.arms if a not in by_key]
    if unknown:
        raise ReskipError(f"`{options.name}` has no arm {', '.join(map(repr, unknown))} on this model; "
                          f"its arms: {', '.join(_quoted(arm.name) for arm in arms)}")
    return {by_key[a] for a in options.arms}


def _quoted(name: str) -> str:
    return repr(name) if " " in name else name


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-")
