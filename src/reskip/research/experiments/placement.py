"""`reskip experiment placement`: where to keep depth states under a memory limit (the second source
document), answered with numbers for the user's model.

States are x_0..x_L (x_l: the input of layer l, x_L the last layer's output), each context x d values.
A limit of B bytes keeps k = B // (context d bytes) of them. A placement is which k: `uniform` (every
L / k layers from x_0) or `front-loaded` (spacing growing quadratically with depth: more early states,
the "denser at the start" intuition the document names as a misconception, since dilution mostly makes
late phases hard to address). What a placement can no longer address is every state it drops.

The reconstruction test measures what a dropped state costs: on the real backbone, x_j of a dropped
layer j is predicted from the kept states that bracket it (the nearest kept below and above, ridge least
squares fitted on calibration tokens) and scored on test tokens (R^2 over every feature), beside the
no-fit answer (copy the nearest kept state below). The incident (a router at layer 30 of 48 needs layer
18's state) is scaled to the user's depth and answered for each placement: is the state kept, and if
not, how well the states a router at the requesting layer may read reconstruct it."""

from __future__ import annotations

from pathlib import Path

import torch

from ... import compat
from ...backbones.devices import model_device
from ...backbones.loading import load_backbone, load_config
from ...data.packing import pack
from ...data.sources import load_splits
from ...errors import ReskipError
from ..diagnose import SOURCE_INSTANCE
from ..pipeline import PRESETS
from .arm_set import base_config, header
from .options import SOURCE_MEMORY_BYTES, ExperimentOptions
from .record import claim

RIDGE = 1e-4  # times the mean diagonal of X^T X: keeps the solve stable where kept states are near-collinear
# How much more mean R^2 front-loading must reach to count as helping: one fit on one test set, so a
# difference in the third decimal is not one placement beating another.
R2_MARGIN = 0.01


def feasible_states(memory_bytes: int, context: int, hidden_size: int, dtype_bytes: int) -> int:
    return memory_bytes // (context * hidden_size * dtype_bytes)


def placements(n_layers: int, k: int) -> dict[str, list[int]]:
    """k of the states 0..n_layers, always x_0 (the embeddings, every router's first source)."""
    total = n_layers + 1
    if k >= total:
        every = list(range(total))
        return {"uniform": every, "front-loaded": every}
    k = max(1, k)
    uniform = sorted({round(i * n_layers / k) for i in range(k)})  # 8 of 48: x_0, x_6, ..., x_42 (the document's)
    front = sorted({round(n_layers * (i / k) ** 2) for i in range(k)})
    j = 1
    while len(front) < k:  # quadratic spacing rounds early indices together: fill the earliest gaps
        if j not in front:
            front = sorted(front + [j])
        j += 1
    return {"uniform": uniform, "front-loaded": front}


def incident(n_layers: int) -> tuple[int, int]:
    """The document's incident (layer 30 of 48 needs layer 18's state) at this depth: (needed, requester)."""
    return round(18 / 48 * n_layers), round(30 / 48 * n_layers)


def gaps(kept: list[int], n_layers: int) -> str:
    dropped = [l for l in range(n_layers + 1) if l not in kept]
    if not dropped:
        return "nothing: every state is kept"
    runs, start = [], dropped[0]
    for a, b in zip(dropped, dropped[1:] + [None]):
        if b != a + 1:
            runs.append(f"x_{start}" if start == a else f"x_{start}..x_{a}")
            if b is not None:
                start = b
    return f"{len(dropped)} states: " + ", ".join(runs)


@torch.no_grad()
def layer_states(model, input_ids: torch.Tensor) -> torch.Tensor:
    """x_0..x_L of the backbone on input_ids (B, T) -> (L + 1, B * T, d) float32, read by hooks on the
    family's own layers (the inputs of each layer, then the last layer's output)."""
    layers = compat.decoder_layers(model)
    states: list[torch.Tensor] = []

    def before(module, args, kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        states.append(h.detach().float().reshape(-1, h.shape[-1]).cpu())  # the fits run on the host

    def after(module, args, kwargs, out):
        h = compat.layer_hidden(out)
        states.append(h.detach().float().reshape(-1, h.shape[-1]).cpu())

    handles = [l.register_forward_pre_hook(before, with_kwargs=True) for l in layers]
    handles.append(layers[-1].register_forward_hook(after, with_kwargs=True))
    try:
        model(input_ids=input_ids.to(model_device(model)), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return torch.stack(states)


def r2(y: torch.Tensor, pred: torch.Tensor, mean: torch.Tensor) -> float:
    """1 - SS_res / SS_tot over every feature, SS_tot about the fitting tokens' mean."""
    return float(1 - (y - pred).pow(2).sum() / (y - mean).pow(2).sum())


def reconstruct(train: torch.Tensor, test: torch.Tensor, j: int, sources: list[int]) -> dict:
    """R^2 on test of x_j from x_sources (ridge least squares with a bias, fitted on train), and of copying
    the nearest source below j. train/test: (L + 1, N, d)."""
    def design(s):
        x = torch.cat([s[i] for i in sources], dim=-1).double()
        return torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], dim=-1)

    X, Y = design(train), train[j].double()
    gram = X.T @ X
    gram += RIDGE * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=gram.dtype)
    W = torch.linalg.solve(gram, X.T @ Y)
    mean = Y.mean(0)
    below = max(i for i in sources if i < j)
    return {"layer": j, "from": sources, "r2_fit": r2(test[j].double(), design(test) @ W, mean),
            "r2_copy": r2(test[j].double(), test[below].double(), mean), "copy_from": below}


def reconstruction_test(train: torch.Tensor, test: torch.Tensor, kept: list[int]) -> list[dict]:
    """Every dropped state from the kept states that bracket it."""
    L = train.shape[0] - 1
    rows = []
    for j in range(L + 1):
        if j in kept:
            continue
        below = [i for i in kept if i < j]
        above = [i for i in kept if i > j]
        rows.append(reconstruct(train, test, j, [max(below)] + ([min(above)] if above else [])))
    return rows


def answer_incident(train: torch.Tensor, test: torch.Tensor, kept: list[int]) -> dict:
    """Whether the scaled incident's state is kept; if not, its reconstruction from the kept states a
    router at the requesting layer may read (those at or below it: the nearest below and above the state)."""
    L = train.shape[0] - 1
    needed, requester = incident(L)
    out = {"needed": needed, "requester": requester, "kept": needed in kept}
    if not out["kept"]:
        readable = [i for i in kept if i <= requester]
        above = [i for i in readable if i > needed]
        out.update(reconstruct(train, test, needed, [max(i for i in readable if i < needed)] + above[:1]))
    return out


def run(options: ExperimentOptions, folder: Path, show=print) -> dict:
    """Budgets, placements and the reconstruction test on the user's backbone and data (the preset's config; nothing trains)."""
    if options.arms:
        raise ReskipError("`placement` has no arms (it trains nothing): drop --arms")
    base = base_config(options, check=False)
    cfg = load_config(base.model, base.trust_remote_code)
    L, d = cfg.num_hidden_layers, cfg.hidden_size
    context = options.context or min(getattr(cfg, "max_position_embeddings", 4096) or 4096, 8192)
    k_user = feasible_states(options.memory_bytes, context, d, options.dtype_bytes)
    doc = SOURCE_INSTANCE
    k_doc = feasible_states(SOURCE_MEMORY_BYTES, doc["context"], doc["hidden_size"], doc["dtype_bytes"])
    # The reconstruction test at the user's memory limit, at the source instance's share of its depth (8 of 48), and at half that
    # (the document's 4 states every 12 layers, where the incident is no longer absorbed).
    k_share = max(2, round(L * k_doc / doc["n_layers"]))
    k_half = max(2, round(L * k_doc / 2 / doc["n_layers"]))
    splits, _ = load_splits(base.data)
    model, tok = load_backbone(base.model, base.dtype, base.trust_remote_code, base.device)  # states read in float32
    # Enough fitting tokens for 2 d + 1 coefficients per dropped state (at most 16,384: the states are held whole).
    n_fit = options.calib_sequences or min(4 * PRESETS[options.preset]["calibrate"]["sequences"], 16384 // base.seq_len)
    n_test = options.test_sequences or 2 * PRESETS[options.preset]["diagnose"]["signal_sequences"]
    fit = pack(tok, splits["calib"], base.seq_len, n_fit, seed=0)
    test = pack(tok, splits["test"], base.seq_len, n_test, seed=0)
    show(f"[experiment placement] states of {len(fit)} calibration and {len(test)} test sequences x {base.seq_len} tokens")
    train_states = torch.cat([layer_states(model, fit.input_ids[i : i + 4]) for i in range(0, len(fit), 4)], 1)
    test_states = torch.cat([layer_states(model, test.input_ids[i : i + 4]) for i in range(0, len(test), 4)], 1)
    settings = {}
    for label, k in ((f"the memory limit at context {context}", k_user), ("the source instance's share of depth", k_share),
                     ("half the source instance's share", k_half)):
        rows = {}
        for name, kept in placements(L, k).items():
            dropped = reconstruction_test(train_states, test_states, kept)
            rows[name] = {"kept": kept, "not_addressable": gaps(kept, L), "reconstruction": dropped,
                          "mean_r2_fit": _mean([r["r2_fit"] for r in dropped]),
                          "min_r2_fit": min((r["r2_fit"] for r in dropped), default=None),
                          "mean_r2_copy": _mean([r["r2_copy"] for r in dropped]),
                          "incident": answer_incident(train_states, test_states, kept)}
        settings[label] = {"k": min(k, L + 1), "placements": rows}
    out = header(options, base) | {
        "training": None, "memory_bytes": options.memory_bytes,
        "this_model": {"n_layers": L, "hidden_size": d, "context": context, "dtype_bytes": options.dtype_bytes,
                       "state_bytes": context * d * options.dtype_bytes, "feasible_states": min(k_user, L + 1)},
        "source_instance": {**doc, "memory_bytes": SOURCE_MEMORY_BYTES, "state_bytes": doc["context"] * doc["hidden_size"] * doc["dtype_bytes"],
                          "feasible_states": k_doc,
                          "placements": {n: {"kept": p, "not_addressable": gaps(p, doc["n_layers"])}
                                         for n, p in placements(doc["n_layers"], k_doc).items()}},
        "tokens": {"fit": int(fit.input_ids.numel()), "test": int(test.input_ids.numel())},
        "settings": settings, "arms": {},
    }
    out["claims"], out["tables"] = claims(out), {"Placements and the reconstruction test": table(out)}
    return out


def _mean(values):
    return sum(values) / len(values) if values else None


def claims(r: dict) -> list[dict]:
    """The document's own answers (its instructor notes) for its instance, then the user's model measured."""
    doc = r["source_instance"]
    needed, requester = incident(doc["n_layers"])
    kept_doc = doc["placements"]["uniform"]["kept"]
    half = placements(doc["n_layers"], doc["feasible_states"] // 2)["uniform"]
    near = min(half, key=lambda i: abs(i - needed))
    out = [claim(f"{doc['memory_bytes'] / 2**20:.0f} MiB for {doc['n_layers']} layers keeps at most 8 states; uniform "
                 f"every 6 lets layer {requester} read x_{needed} exactly (the incident is absorbed)",
                 f"state = {doc['state_bytes'] / 2**20:.0f} MiB, {doc['feasible_states']} states; uniform keeps "
                 f"{kept_doc}: x_{needed} " + ("kept" if needed in kept_doc else "not kept"),
                 doc["feasible_states"] == 8 and needed in kept_doc),
           claim(f"With 4 states (every 12) the nearest to x_{needed} is 6 layers away",
                 f"uniform 4 keeps {half}: nearest x_{near}, {abs(near - needed)} layers away", abs(near - needed) == 6)]
    for label, s in r["settings"].items():
        rows = s["placements"]
        u, f = rows["uniform"], rows["front-loaded"]
        inc_u, inc_f = u["incident"], f["incident"]

        def said(inc):
            return "kept" if inc["kept"] else f"R^2 {inc['r2_fit']:.3f} from x_{inc['from']} (copy {inc['r2_copy']:.3f})"
        out.append(claim(
            f"{r['model']}, {label} (k = {s['k']}): keeping states denser at the start does not help "
            f"(the document's misconception; helping = {R2_MARGIN} more mean R^2)",
            ("every state is kept: nothing to reconstruct" if u["mean_r2_fit"] is None else
             f"R^2 of the dropped states from their bracketing kept states, mean (worst): uniform "
             f"{u['mean_r2_fit']:.3f} ({u['min_r2_fit']:.3f}), front-loaded {f['mean_r2_fit']:.3f} ({f['min_r2_fit']:.3f}); "
             f"incident (x_{inc_u['needed']} for a router at layer {inc_u['requester']}): uniform {said(inc_u)}, "
             f"front-loaded {said(inc_f)}"),
            None if u["mean_r2_fit"] is None else bool(f["mean_r2_fit"] <= u["mean_r2_fit"] + R2_MARGIN)))
    return out


def table(r: dict) -> list[str]:
    out = ["| setting | placement | kept states | cannot address | mean R^2 (fit) | min R^2 (fit) | mean R^2 (copy) |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for label, s in r["settings"].items():
        for name, p in s["placements"].items():
            f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
            out.append(f"| {label} (k = {s['k']}) | {name} | {p['kept']} | {p['not_addressable']} | "
                       f"{f(p['mean_r2_fit'])} | {f(p['min_r2_fit'])} | {f(p['mean_r2_copy'])} |")
    return out
