"""`reskip experiment baselines`: the recipe beside what a user would do instead, at the same trainable
parameters, training tokens, schedule and evaluation sequences.

Methods (`sweep_methods`; each trained once per learning rate of one shared sweep; the arm kept is the one closest on
validation to what the method trains toward: the lowest final perplexity for the recipe and `ce`, the lowest KL to
the backbone for `kd`):
- `recipe`: the standard recipe (`train.loop.train`), then its own calibrate and eval stages (ReSkip's
  budgets, static pruning with the learned shortcut, influence and random at the same measured skips);
- `lora`: PEFT LoRA on every linear projection of the frozen backbone, ranks set so that its parameters match
  the side-channel's (`compress.lora`), plain CE with the recipe's loss mask;
- `healed:K`: the K middle blocks whose removal costs the backbone least on the calibration split
  (A(n) of the backbone itself) removed, the rest healed by a LoRA of the same parameter count with cross-entropy;
  with `heal`, also `healed:K:kd` (healed by distillation from the backbone: KL on every position) and
  `healed:K:kd+ce` (`compress.objectives`).
With `variants`, the recipe's variants that could close the gap, each at the same total trainable parameters:
- `side+lora`: the side-channel at half its rank (corrections and shortcuts) and a LoRA inside the frozen blocks
  with the parameters that frees (`RetrofitConfig.inner_lora`), trained together by the recipe's loss;
- `full-teacher`: the recipe with its skip branch distilled toward the full path instead of the frozen backbone
  (`TrainConfig.skip_teacher`: a named departure from the source design);
- `backbone-teacher`: the recipe with its full path distilled toward the backbone (KL on every position) instead of
  trained with CE on the mix (`TrainConfig.full_objective: kd`): the backbone as the only teacher.
Measured on the validation split (the sweep), the test split and the held-out kjv (the recipe's eval sequences,
16 x 256), by one eval of the chosen recipe run that scores every arm against the same backbone references
(perplexity, KL to the backbone, top-1 agreement), with 95% bootstrap intervals over sequences for the differences
the verdict reads. Without healing, the same pruned backbones are measured too (`pruned:K`), so the table shows what
healing buys.

Every arm is a run folder under OUT/experiments/baselines/arms/<method>-lr-<lr>; a finished one is read, a
stopped one resumed, so separate processes can train arms side by side (`--arms`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...ar_retrofit.accounting import count_params
from ...ar_retrofit.config import RetrofitConfig
from ...backbones.dtypes import resolve_dtype_name
from ...backbones.loading import load_backbone, load_config
from ...compress.blocks import BlockCosts, backbone_block_costs
from ...compress.healing_run import HealingConfig
from ...compress.objectives import OBJECTIVES, parse_objective
from ...compress.train import train_lora
from ...data.packing import pack
from ...data.sources import load_splits
from ...errors import ReskipError
from ...evaluate.run import evaluate_run
from ...io_atomic import atomic_write, atomic_write_json
from ...reading import read_json
from ...run_folder import RunFolder
from ...skip.policy_file import PolicyFile
from ...skip.spec import KINDS, METHOD_KINDS, parse_specs
from ...statistics import bootstrap_difference
from ...train.checkpoint import latest_checkpoint
from ...train.log import read_log, records
from ...train.run import train_run
from ...train_config import TrainConfig
from ..calibrate.run import calibrate_run
from ..pipeline import PRESETS, PipelineConfig
from ..report.figures import fig_baselines
from .baselines_tables import (
    RECIPE_ROWS,
    SPLITS,
    VARIANT_ROWS,
    claims,
    fidelity_intervals,
    intervals,
    tables,
    variant_row,
    verdict,
)
from .options import ExperimentOptions
from .results_file import RENAMED, read_results


@dataclass(frozen=True)
class SweepMethod:
    """One method of the sweep, typed: what trains it (`train.trainee`'s recipes: "retrofit" or "lora"), how many of
    the backbone's cheapest blocks a LoRA arm removes, and how it heals (`compress.objectives`). Its arms are chosen
    on validation by what it trains toward: perplexity for the recipe and `ce`, KL to the backbone for `kd`."""

    name: str
    trains: str
    drop: int = 0
    objective: str = "ce"

    @property
    def chosen_by(self) -> str:
        return "val_kl" if self.objective != "ce" else "val_ppl"

    @property
    def eval_kind(self) -> str | None:
        """How `reskip eval` scores its chosen arm (`skip.spec.KINDS`); None: the recipe's own eval."""
        return None if self.trains == "retrofit" else "healed" if self.drop else "lora"


def sweep_methods(heal: list[str]) -> dict[str, SweepMethod]:
    """The methods every run trains: the recipe, a LoRA, and the cheapest 1 and 2 blocks removed and healed with
    each objective of `heal` (`healed:K` for ce, `healed:K:OBJ` for the others)."""
    out = [SweepMethod("recipe", "retrofit"), SweepMethod("lora", "lora")]
    out += [SweepMethod(f"healed:{k}" + ("" if h == "ce" else f":{h}"), "lora", k, h)
            for h in heal for k in (1, 2)]
    return {m.name: m for m in out}


# recipe variants at the same total trainable parameters (`--variants`)
RECIPE_VARIANTS = {v: SweepMethod(v, "retrofit") for v in ("side+lora", "full-teacher", "backbone-teacher")}
LR_FACTORS = (0.5, 1.0, 2.0)  # the sweep: these multiples of the recipe's learning rate, for every method
COSTS_FILE = "backbone_blocks.json"


def run(options: ExperimentOptions, folder: Path, show=print) -> dict | None:
    if options.lrs is not None and not all(math.isfinite(lr) and lr > 0 for lr in options.lrs):
        raise ReskipError(f"--lrs: every learning rate must be a finite number > 0, got {options.lrs}")
    for h in options.heal:
        try:
            text = parse_objective(h).text
        except ReskipError as e:
            raise ReskipError(f"--heal: no objective {h!r}; {e}") from None
        if text != h:
            raise ReskipError(f"--heal {h}: write it as {text}")
    table = {**sweep_methods(options.heal), **{v: RECIPE_VARIANTS[v] for v in _variants(options.variants)}}
    methods = tuple(table)
    chosen = _chosen_arms(options.arms, methods)
    pc = PipelineConfig(trust_remote_code=options.trust_remote_code, preset=options.preset, model=options.model, data=list(options.data),
                        overrides={**options.overrides, "seed": options.seed},
                        dtype=options.dtype, device=options.device)
    pc.check()
    recipe = pc.train_config()
    lrs = sorted(options.lrs or [recipe.lr * f for f in LR_FACTORS])
    target = count_params(load_config(recipe.model, recipe.trust_remote_code), recipe.retrofit_config()).new_params
    costs = _block_costs(pc, folder, show)
    arms, pending = {}, []
    for method in methods:
        for lr in lrs:
            name = arm_name(method, lr)
            where = arm_folder(folder, name)
            if method not in chosen and not RunFolder(where).summary.is_file():
                pending.append(name)
                continue
            show(f"[experiment baselines] arm {name}")
            cfg = variant_config(method, dataclasses.replace(recipe, lr=lr), target)
            arms[name] = _train_arm(table[method], cfg, where, target, costs, not options.quiet)
    if pending:
        show(f"[experiment baselines] not trained yet: {', '.join(pending)}; results.json is written by the run "
             "that finds every arm finished")
        return None
    best = {m: min((n for n in arms if arms[n]["method"] == m), key=lambda n: arms[n][table[m].chosen_by])
            for m in methods}
    variants = [m for m in methods if m in RECIPE_VARIANTS]
    measured = _measure(pc, folder, best, costs, variants, show, table)
    out = {"experiment": "baselines", "preset": options.preset, "model": recipe.model, "data": list(recipe.data),
           "seed": recipe.seed, "dtype": measured["dtype"], "lrs": lrs, "target_params": target,
           "training": {"steps": recipe.steps, "batch_size": recipe.batch_size, "seq_len": recipe.seq_len,
                      "tokens": recipe.steps * recipe.batch_size * recipe.seq_len},
           "backbone_blocks": {**costs.to_dict(), "dropped": {str(k): costs.cheapest(k) for k in (1, 2)},
                               "influence_would_drop": {str(k): costs.most_similar(k) for k in (1, 2)}},
           "sweep": arms, "chosen": best, "variants": variants, "heal": list(options.heal),
           "chosen_by": {m: table[m].chosen_by for m in methods}, **measured}
    out["claims"] = claims(out)
    out["tables"] = tables(out)
    out["verdict"] = verdict(out)
    png = fig_baselines(out)[1]
    atomic_write(folder / "frontier.png", lambda tmp: Path(tmp).write_bytes(png))
    return out


def arm_name(method: str, lr: float) -> str:
    """`method@lr`, the rate written as the shortest text that reads back as the same number (0.002, 0.0020001):
    two rates never share a folder."""
    return f"{method}@{float(lr)!r}"


def arm_slug(name: str) -> str:
    """An arm's folder name: its name with ':' (not allowed in file names everywhere) as '-'."""
    return name.replace(":", "-")


def arm_folder(folder: Path, name: str) -> Path:
    """An arm's run folder, OUT/experiments/baselines/arms/<slug>; where only the folder an experiment made under the
    arm's name before a rename exists (`results_file.RENAMED`), that one: a finished arm is read back, not trained
    again."""
    where = folder / "arms" / arm_slug(name)
    for old, new in RENAMED:
        before = folder / "arms" / arm_slug(old + name.removeprefix(new))
        if name.startswith(new) and not where.exists() and before.is_dir():
            return before
    return where


def _variants(asked: list[str] | None) -> tuple[str, ...]:
    """The variants a run includes: none (None), every one ([]), or those named, in their table's order."""
    if asked is None:
        return ()
    unknown = [v for v in asked if v not in RECIPE_VARIANTS]
    if unknown:
        raise ReskipError(f"--variants: no variant {', '.join(map(repr, unknown))}; the variants: "
                          f"{', '.join(RECIPE_VARIANTS)}")
    return tuple(v for v in RECIPE_VARIANTS if not asked or v in asked)


def _chosen_arms(arms: list[str] | None, methods: tuple[str, ...]) -> set[str]:
    if not arms:
        return set(methods)
    unknown = [a for a in arms if a not in methods]
    if unknown:
        more = "" if set(unknown) - set(RECIPE_VARIANTS) else " (the variants need --variants)"
        raise ReskipError(f"`baselines` has no method {', '.join(map(repr, unknown))}; its methods: "
                          f"{', '.join(methods)}{more}")
    return set(arms)


def variant_config(method: str, cfg: TrainConfig, target: int) -> TrainConfig:
    """The training config of a recipe variant (the recipe's own for the others): `side+lora` halves the
    side-channel's ranks and gives the parameters that frees to a LoRA inside the blocks; `full-teacher`
    distils the skip branch toward the full path; `backbone-teacher` distils the full path toward the backbone
    instead of training it with CE on the mix (the backbone the only teacher)."""
    if method == "full-teacher":
        return dataclasses.replace(cfg, skip_teacher="full")
    if method == "backbone-teacher":
        return dataclasses.replace(cfg, full_objective="kd")
    if method != "side+lora":
        return cfg
    model_config = load_config(cfg.model, cfg.trust_remote_code)
    rc = cfg.retrofit_config()
    half = max(1, rc.resolved_rank(model_config.hidden_size) // 2)
    slim = {**cfg.retrofit, "rank": half, "shortcut_rank": half}
    side = count_params(model_config, RetrofitConfig(**{**cfg.resolved_retrofit(), **slim})).new_params
    if side >= target:
        raise ReskipError(f"side+lora: the side-channel at rank {half} already has {side:,} of the {target:,} "
                          "parameters; nothing is left for a LoRA")
    return dataclasses.replace(cfg, retrofit={**slim, "inner_lora": target - side})


def _block_costs(pc: PipelineConfig, folder: Path, show) -> BlockCosts:
    """The backbone's A(n) and block influence on the calibration split (the calibrate stage's sequences),
    computed once and kept in the experiment's folder with the settings they were measured under (other
    settings measure them anew)."""
    cfg = pc.train_config()
    rc = cfg.retrofit_config()
    n_seq = PRESETS[pc.preset]["calibrate"]["sequences"]
    settings = {"model": cfg.model, "data": list(cfg.data), "dtype": resolve_dtype_name(cfg.dtype),
                "seq_len": cfg.seq_len, "sequences": n_seq, "block_size": rc.block_size, "boundaries": rc.boundaries}
    path = folder / COSTS_FILE
    if path.is_file():
        d = read_json(path)
        if isinstance(d, dict) and d.get("settings") == settings:
            return BlockCosts.from_dict(d, str(path))
    splits, _ = load_splits(cfg.data)
    model, tok = load_backbone(cfg.model, cfg.dtype, cfg.trust_remote_code, cfg.device)
    data = pack(tok, splits["calib"], cfg.seq_len, n_seq, seed=0)
    show(f"[experiment] the backbone's block costs on {len(data)} calibration sequences")
    costs = backbone_block_costs(model, data, rc.block_size, rc.boundaries)
    atomic_write_json(path, {**costs.to_dict(), "settings": settings})
    return costs


def _train_arm(method: SweepMethod, cfg: TrainConfig, where: Path, target: int, costs: BlockCosts,
               progress: bool) -> dict:
    """Train one arm (or read it when finished); its row of the sweep."""
    files = RunFolder(where)
    if method.trains == "retrofit":
        # placement (device, sharding) is not what a run trains: a recipe run made elsewhere is reused here
        if files.config.is_file() and TrainConfig.from_file(files.config).what_it_trains() != dataclasses.replace(
                cfg, dtype=resolve_dtype_name(cfg.dtype)).what_it_trains():
            raise ReskipError(f"{where} holds a recipe run of other settings (its config.yaml differs): remove it")
        if not files.summary.is_file():
            train_run(where, cfg, resume=latest_checkpoint(where) is not None, show_progress=progress, overwrite=True)
        s = read_json(files.summary)
        params = count_params(load_config(cfg.model, cfg.trust_remote_code), cfg.retrofit_config()).new_params
        return {"method": method.name, "lr": cfg.lr, "val_ppl": s["ppl_full"]["end"],
                "val_ppl_backbone": s["ppl_backbone"], "val_kl": s["kl_full"]["end"], "params": params,
                "train_wall_s": _train_wall(files)}
    blocks = costs.cheapest(method.drop) if method.drop else []
    arm = HealingConfig(params=target, drop_layers=sorted(costs.layers_of(blocks)), drop_blocks=blocks,
                  objective=method.objective)
    s = train_lora(cfg, arm, where, show_progress=progress)
    return {"method": method.name, "lr": cfg.lr, "val_ppl": s["ppl_full"]["end"], "val_ppl_backbone": s["ppl_backbone"],
            "val_kl": (s.get("kl_full") or {}).get("end"), "params": s["lora"]["parameters"],
            "ranks": s["lora"]["ranks"], "drop_blocks": blocks, "objective": method.objective,
            "train_wall_s": s["train_wall_s"]}


def _train_wall(files: RunFolder) -> float:
    trains = records(read_log(files.train_log), "train")
    return trains[-1]["elapsed_s"] if trains else 0.0


# ---- measuring the chosen arms on the eval's sequences ------------------------------------------------------
SEQUENCE = (1, 2)  # per-sequence selection of this many blocks (skipped from each sequence's second step on)
HELD = (1.0, 2.0)  # the budgets also measured with their rate held online
RECIPE_EVAL = "recipe-eval"  # recipe-eval/<arm>: a recipe-kind arm's eval with the rows the table needs


def _recipe_eval(pc: PipelineConfig, folder: Path, arm: str, full: bool, models: tuple[str, ...] = ()) -> dict:
    """The eval of a recipe-kind arm (calibrated first if it is not): the pipeline's methods with static pruning
    at exactly 1 and 2 blocks per step, and for the recipe itself (`full`) the held budgets and per-sequence
    selection too; on kjv the baselines matched again at the skips each method spends there. `models`: the
    trained methods scored in the same eval against the same references (`lora:RUN`, `healed:RUN`, `pruned:K`)."""
    rdir = folder / "arms" / arm_slug(arm)
    files = RunFolder(rdir)
    if not files.policy.is_file():
        calibrate_run(rdir, pc.calibrate_options())
    ev_dir = folder / RECIPE_EVAL / arm_slug(arm)  # per arm: a wider sweep may choose another
    path = ev_dir / "results.json"
    if not path.is_file() or not set(models) <= set(read_results(path, "methods")["methods"]):
        budgets = PolicyFile.load(files.policy).budgets()
        extra = ["static:1", "static:2"]
        if full:
            extra += [*(f"reskip:budget={b:g}:held" for b in HELD if b in budgets), *(f"sequence:{k}" for k in SEQUENCE)]
        opts = pc.eval_options()
        evaluate_run(rdir, dataclasses.replace(opts, methods=[*opts.methods, *parse_specs([*extra, *models], METHOD_KINDS)],
                                               benchmarks=[], out=str(ev_dir)))
    ev = read_results(path, "methods", "heldout")
    ev["path"] = str(path)
    return ev


def _trained_methods(folder: Path, best: dict, table: dict[str, SweepMethod]) -> dict[str, str]:
    """Each baseline row -> the eval method that scores it: the chosen LoRA and healed arms by their folders, the
    unhealed prunings by their block count."""
    out = {f"pruned:{k}": f"pruned:{k}" for k in (1, 2)}
    for name, method in table.items():
        if method.eval_kind is not None:
            out[name] = f"{method.eval_kind}:{arm_folder(folder, best[name])}"
    return out


def _measure(pc: PipelineConfig, folder: Path, best: dict, costs: BlockCosts, variants: list[str], show,
             table: dict[str, SweepMethod]) -> dict:
    """Every row of the table on the test split and kjv, from one eval of the chosen recipe run that scores the
    LoRA arms, the healed arms and the unhealed pruned backbones beside its own methods, against the same
    references (`_recipe_eval`); each variant's rows from an eval of its chosen run."""
    trained = _trained_methods(folder, best, table)
    ev = _recipe_eval(pc, folder, best["recipe"], full=True, models=tuple(trained.values()))
    methods = {"test": ev["methods"], "kjv": ev["heldout"]["methods"]}
    rows = {key: _recipe_row(methods, key, None if key == "backbone" else "recipe")
            for key in ("backbone", *RECIPE_ROWS) if all(key in methods[s] for s in SPLITS)}
    rows.update({key: _recipe_row(methods, name, key if key in table else None) for key, name in trained.items()})
    for v in variants:
        show(f"[experiment baselines] measuring {best[v]}")
        vev = _recipe_eval(pc, folder, best[v], full=False)
        vm = {"test": vev["methods"], "kjv": vev["heldout"]["methods"]}
        rows.update({variant_row(v, key): _recipe_row(vm, key, v) for key in VARIANT_ROWS
                     if all(key in vm[s] for s in SPLITS)})
    order = ("ce", "kd", "kd+ce", *OBJECTIVES)  # the table's columns: cross-entropy first, as they were measured
    heal = sorted({m.objective for m in table.values() if m.drop},
                  key=lambda h: (order.index(h.partition(":")[0]), h))
    return {"dtype": ev["meta"]["dtype"], "rows": rows, "intervals": intervals(rows, variants, heal),
            "fidelity_intervals": fidelity_intervals(rows, variants, heal),
            "at_spent_compute": {sp: at_spent_compute(methods[sp]) for sp in SPLITS}, "recipe_eval": ev["path"]}


def at_spent_compute(methods: dict) -> list[dict]:
    """Each skipping point of the recipe run that spends its own compute (the ReSkip budgets, per-sequence
    selection) beside static pruning at the skips it measured on that split (the eval's matched baselines),
    with the 95% interval of it - static."""
    back = methods["backbone"]["per_sequence"]
    full, targets = np.array(back["nll"], float), np.array(back["targets"], float)
    out = []
    for name, r in methods.items():
        budgeted = r["kind"] == "reskip" and "budget" in r["arguments"]
        if not (KINDS[r["kind"]].measured_compute and (budgeted or r["kind"] == "sequence")) or r["mean_skipped"] == 0:
            continue
        k = round(r["mean_skipped"], 2)
        st = next((n for n, m in methods.items() if m["kind"] == "static" and m["arguments"]["k"] == k), None)
        row = {"method": name, "skipped": r["mean_skipped"], "ppl_ratio": r["ppl_ratio"],
               "static": st or f"static:{int(k) if k == int(k) else k:g}",
               "static_ppl_ratio": methods[st]["ppl_ratio"] if st else None}
        if st:
            row["minus_static"] = bootstrap_difference(full, np.array(r["per_sequence"]["nll"], float),
                                                       np.array(methods[st]["per_sequence"]["nll"], float), targets)
        out.append(row)
    return out


def _recipe_row(methods: dict, key: str, arm: str | None) -> dict:
    """A row of the table from the eval's results: its kind and arguments as the eval typed them, the swept method
    whose chosen arm it comes from (`arm`: "recipe", a variant, a baseline's method; None: the backbone and the
    unhealed prunings, which train nothing), and per split its compute, perplexity / the backbone's, fidelity to
    the backbone (KL, top-1 agreement) and its per-sequence sums."""
    row = {field: {s: methods[s][key][name] for s in SPLITS}
           for field, name in (("blocks_skipped", "mean_skipped"), ("flops_executed_share", "flops_executed_share"),
                               ("ppl_ratio", "ppl_ratio"), ("kl_to_backbone", "kl_to_backbone"),
                               ("top1_agreement", "top1_agreement"), ("per_sequence", "per_sequence"))}
    return {"kind": methods["test"][key]["kind"], "arguments": methods["test"][key].get("arguments", {}), "arm": arm,
            **row}


