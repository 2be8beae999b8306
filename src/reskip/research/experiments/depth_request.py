"""`reskip experiment depth-request`: the depth chosen once per request, from what exists after its prefill. The
nested model (`reskip experiment nested`: one set of weights, depths 0..K) serves each request at one depth; a
request's first quarter is its prompt, run whole (the same in every arm), and the rest is scored at the
depth chosen for it. The signals a router has after the prefill, each a number per request (high: hard):

- `prompt_nll`: the backbone's mean next-token loss on the prompt (how surprising the text is);
- `prompt_entropy`: the mean entropy of the backbone's next-token distribution on the prompt (how unsure it is);
- `prompt_gap`: the mean KL(backbone || the deepest cut) on the prompt (how much this text needs the removed
  blocks; one more pass over the prompt at that depth). The prompt's length says nothing here: every scored
  sequence has the same length.

At a target mean depth t between the whole depths k and k + 1, the share f = t - k of requests whose signal is
lowest (a threshold read on the validation split) are served at k + 1, the rest at k. Against it, at the compute it
realised on each split: the fixed depths' per-sequence mixture at the same mean (what a user serving static depths
gets), and the hindsight oracle (the f requests that lose least by the deeper cut), the ceiling of any signal.
The signal is chosen on the validation split; test and the held-out source are reported. In generation (the
sixteen fixed prompts of `evaluate.generation`), each prompt's depth is chosen by the same signal, ranked among the
prompts (a batch-relative threshold, said so), and its greedy continuation compared with the backbone's.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from ...backbones.devices import model_device
from ...compress.healing_run import load_healed_model, read_healing_run
from ...data.packing import pack
from ...data.sources import load_splits
from ...errors import ReskipError
from ...evaluate.generation import PROMPTS, agreement, greedy_continuations, prompt_ids
from ...losses import ce_tokens, kl_sum
from ...options import HELDOUT, PRESETS
from ...statistics import bootstrap_mean_difference
from .baselines import arm_name, arm_slug
from .options import ExperimentOptions
from .record import claim, interval_text
from .results_file import read_results

PROMPT_SHARE = 4  # each scored sequence's first quarter is its prompt (64 tokens of the standard 256)
SIGNALS = ("prompt_nll", "prompt_entropy", "prompt_gap")
TARGETS = (0.5, 1.0, 1.5, 2.0, 2.5)  # mean blocks removed per request
SPLITS = ("val", "test", HELDOUT)


def run(options: ExperimentOptions, folder: Path, show=print) -> dict:
    nested_dir = folder.parent / "nested"
    if not (nested_dir / "results.json").is_file():
        raise ReskipError(f"{nested_dir} has no results.json: run `reskip experiment nested` with the same --out "
                          "first (its nested model is what this experiment serves at a depth per request)")
    nested = read_results(nested_dir / "results.json", "lr", "rows")
    variant = nested.get("variants", ["nested"])[-1]  # the longest-trained nested model there is
    arm_dir = nested_dir / "arms" / arm_slug(arm_name(variant, nested["lr"]))
    cfg, arm = read_healing_run(arm_dir)
    depths = arm.depths
    models, tok = {}, None
    for k in range(depths + 1):
        models[k], tok = load_healed_model(arm_dir, options.dtype, options.device, options.trust_remote_code, depth=k)
    n_layers = models[0].config.num_hidden_layers
    share = {k: 1 - len(arm.layers_at(k)) / n_layers for k in models}  # layer FLOPs per token at each depth
    n = PRESETS[options.preset]["eval"]["sequences"]
    per = {}
    for split in SPLITS:
        docs, _ = load_splits([HELDOUT] if split == HELDOUT else list(options.data))
        data = pack(tok, docs["test" if split == HELDOUT else split], cfg.seq_len, n, seed=0)
        show(f"[experiment depth-request] {len(data)} {split} sequences at depths 0 to {depths}")
        per[split] = _score(models, data, depths, cfg.seq_len // PROMPT_SHARE)
    signal = min(SIGNALS, key=lambda s: sum(_routed(per["val"], s, t, per["val"], share)["kl"] for t in TARGETS
                                           if t < depths))
    out = {"experiment": "depth-request", "preset": options.preset, "model": cfg.model, "data": list(options.data),
           "seed": options.seed, "nested": str(arm_dir), "variant": variant, "depths": depths, "prompt_tokens": cfg.seq_len // PROMPT_SHARE,
           "seq_len": cfg.seq_len, "layer_share": {str(k): v for k, v in share.items()}, "signal": signal,
           "validation": {s: [_routed(per["val"], s, t, per["val"], share) for t in TARGETS if t < depths]
                          for s in SIGNALS},
           "splits": {s: [_compare(per[s], signal, t, per["val"], share) for t in TARGETS if t < depths]
                      for s in ("test", HELDOUT)},
           "generation": _generation(models, tok, depths, signal)}
    out["claims"] = [_claim(out, i) for i in range(len(out["splits"]["test"]))]
    out["tables"] = {f"Depth per request against fixed depths ({s})": _table(out["splits"][s])
                     for s in ("test", HELDOUT)}
    return out


@torch.no_grad()
def _score(models: dict, data, depths: int, prompt: int) -> dict:
    """Per sequence: the three signals on its prompt and, per depth, KL to the backbone, top-1 agreements and NLL
    summed over the rest (the continuation), with its count."""
    out = {"signals": {s: [] for s in SIGNALS}, "kl": {k: [] for k in models}, "agree": {k: [] for k in models},
           "nll": {k: [] for k in models}, "positions": [], "targets": []}
    for ids, labels in data.batches(1, model_device(models[0])):
        z0 = models[0](input_ids=ids, use_cache=False).logits.float()  # (1, T, V): the backbone
        p = z0[:, :prompt].log_softmax(-1)
        out["signals"]["prompt_nll"].append(ce_tokens(z0[:, :prompt], labels[:, :prompt]).mean().item())
        out["signals"]["prompt_entropy"].append(-(p.exp() * p).sum(-1).mean().item())
        rest = labels[:, prompt - 1:]  # the targets of the continuation's positions
        for k, model in models.items():
            z = z0 if k == 0 else model(input_ids=ids, use_cache=False).logits.float()
            if k == depths:
                out["signals"]["prompt_gap"].append(kl_sum(z0[:, :prompt], z[:, :prompt]).item() / prompt)
            out["kl"][k].append(kl_sum(z0[:, prompt:], z[:, prompt:]).item())
            out["agree"][k].append(int((z0[:, prompt:].argmax(-1) == z[:, prompt:].argmax(-1)).sum()))
            out["nll"][k].append(ce_tokens(z[:, prompt - 1:], rest).double().sum().item())
        out["positions"].append(ids.shape[1] - prompt)
        out["targets"].append(int((rest[:, 1:] != -100).sum()))
    return out


def _threshold(val: dict, signal: str, f: float) -> float:
    """The signal value below which a share f of the validation requests fall (served at the deeper cut)."""
    return float(np.quantile(np.array(val["signals"][signal]), f)) if f > 0 else -math.inf


def _assign(scored: dict, signal: str, target: float, val: dict) -> np.ndarray:
    """Each request's depth: the deeper cut where its signal is below the validation threshold."""
    lo = int(math.floor(target))
    tau = _threshold(val, signal, target - lo)
    return np.where(np.array(scored["signals"][signal]) < tau, lo + 1, lo)


def _sums(scored: dict, depth_of) -> dict:
    """Per-sequence sums of the requests served at `depth_of[i]`."""
    return {m: np.array([scored[m][d][i] for i, d in enumerate(depth_of)], float) for m in ("kl", "agree", "nll")}


def _routed(scored: dict, signal: str, target: float, val: dict, share: dict) -> dict:
    depth_of = _assign(scored, signal, target, val)
    s = _sums(scored, depth_of)
    positions = float(sum(scored["positions"]))
    return {"target": target, "mean_depth": float(depth_of.mean()),
            "flops_share": float(np.mean([share[int(d)] for d in depth_of])),
            "kl": float(s["kl"].sum() / positions), "top1": float(s["agree"].sum() / positions)}


def _mixture(scored: dict, mean_depth: float) -> dict:
    """The fixed depths around `mean_depth`, mixed per sequence: (1 - f) of each request at k and f at k + 1."""
    lo = min(int(math.floor(mean_depth)), max(scored["kl"]) - 1)
    f = mean_depth - lo
    return {m: (1 - f) * np.array(scored[m][lo], float) + f * np.array(scored[m][lo + 1], float)
            for m in ("kl", "agree", "nll")}


def _oracle(scored: dict, mean_depth: float) -> dict:
    """Hindsight: the requests that lose least KL by the deeper cut take it, at the same count as the router's."""
    lo = min(int(math.floor(mean_depth)), max(scored["kl"]) - 1)
    count = round((mean_depth - lo) * len(scored["positions"]))
    loss = np.array(scored["kl"][lo + 1], float) - np.array(scored["kl"][lo], float)
    depth_of = np.full(len(loss), lo)
    depth_of[np.argsort(loss, kind="stable")[:count]] = lo + 1
    return _sums(scored, depth_of)


def _compare(scored: dict, signal: str, target: float, val: dict, share: dict) -> dict:
    """The router at `target` on this split, beside the fixed depths' mixture and the oracle at the mean depth it
    realised, with router - mixture and oracle - mixture (95% intervals over sequences)."""
    depth_of = _assign(scored, signal, target, val)
    mean = float(depth_of.mean())
    routed, mix, oracle = _sums(scored, depth_of), _mixture(scored, mean), _oracle(scored, mean)
    counts = np.array(scored["positions"], float)
    row = {"target": target, "mean_depth": mean, "flops_share": float(np.mean([share[int(d)] for d in depth_of]))}
    for name, s in (("routed", routed), ("mixture", mix), ("oracle", oracle)):
        row[name] = {"kl": float(s["kl"].sum() / counts.sum()), "top1": float(s["agree"].sum() / counts.sum()),
                     "ppl_ratio": math.exp((s["nll"].sum() - np.sum(scored["nll"][0])) / sum(scored["targets"]))}
    for name, s in (("routed", routed), ("oracle", oracle)):
        row[f"{name}_minus_mixture"] = {m: bootstrap_mean_difference(s[f], mix[f], counts)
                                        for m, f in (("kl", "kl"), ("top1", "agree"))}
    return row


def _generation(models: dict, tok, depths: int, signal: str) -> dict:
    """Greedy continuations of the fixed prompts at every depth; each prompt's signal from its own prefill; per
    target, the router's choice (ranked among the prompts) beside the fixed depths' mixture, on the share of
    tokens before the first divergence from the backbone and on the same first sentence."""
    texts = {k: greedy_continuations(m, tok) for k, m in models.items()}
    per = {k: agreement(tok, texts[0], texts[k]) for k in models if k}
    sig = []
    with torch.no_grad():
        for ids in prompt_ids(tok, PROMPTS):
            ids = ids.to(model_device(models[0]))
            z0 = models[0](input_ids=ids, use_cache=False).logits.float()
            labels = ids.clone()
            p = z0.log_softmax(-1)
            zk = models[depths](input_ids=ids, use_cache=False).logits.float()
            sig.append({"prompt_nll": ce_tokens(z0, labels).mean().item(),
                        "prompt_entropy": -(p.exp() * p).sum(-1).mean().item(),
                        "prompt_gap": kl_sum(z0, zk).item() / ids.shape[1]}[signal])
    order = np.argsort(sig, kind="stable")  # the easiest prompts first
    rows = []
    for t in (t for t in TARGETS if t < depths):
        lo = int(math.floor(t))
        deeper = set(order[: round((t - lo) * len(PROMPTS))].tolist())
        at = [lo + 1 if i in deeper else lo for i in range(len(PROMPTS))]

        def value(k: int, i: int, key: str) -> float:
            return 1.0 if k == 0 else float(per[k][key][i])

        f = len(deeper) / len(PROMPTS)
        row = {"target": t, "mean_depth": float(np.mean(at))}
        for key, name in (("per_prompt_prefix", "prefix_share"), ("per_prompt_same", "same_first_sentence")):
            row[name] = {"routed": float(np.mean([value(at[i], i, key) for i in range(len(PROMPTS))])),
                         "mixture": float(np.mean([(1 - f) * value(lo, i, key) + f * value(lo + 1, i, key)
                                                   for i in range(len(PROMPTS))]))}
        rows.append(row)
    return {"prompts": len(PROMPTS), "signal": signal, "fixed": {str(k): {x: per[k][x] for x in (
        "prefix_share", "same_first_sentence")} for k in per}, "targets": rows}


def _claim(out: dict, i: int) -> dict:
    at = {s: out["splits"][s][i] for s in out["splits"]}
    measured = "; ".join(f"{s}: KL {r['routed']['kl']:.3f} vs fixed {r['mixture']['kl']:.3f} at mean depth "
                         f"{r['mean_depth']:.2f} (oracle {r['oracle']['kl']:.3f}), difference "
                         f"{r['routed_minus_mixture']['kl']['mean']:+.3f} [{r['routed_minus_mixture']['kl']['lo']:+.3f}, "
                         f"{r['routed_minus_mixture']['kl']['hi']:+.3f}]" for s, r in at.items())
    held = all(r["routed_minus_mixture"]["kl"]["hi"] < 0 and r["routed_minus_mixture"]["top1"]["hi"] > 0
               for r in at.values())
    return claim(f"a depth per request by {out['signal']} at {at['test']['target']:g} blocks removed on average is "
                 "closer to the backbone than fixed depths at the same mean", measured, held)


def _table(rows: list[dict]) -> list[str]:
    lines = ["| target | mean depth | layer FLOPs | routed KL | fixed KL | oracle KL | routed - fixed: KL [95%] "
             "| top-1 [95%] | routed top-1 | fixed top-1 |", "| --- |" + " --- |" * 9]
    for r in rows:
        d = r["routed_minus_mixture"]
        lines.append(f"| {r['target']:g} | {r['mean_depth']:.2f} | {r['flops_share']:.3f} | {r['routed']['kl']:.4f} "
                     f"| {r['mixture']['kl']:.4f} | {r['oracle']['kl']:.4f} | "
                     + " | ".join(interval_text(d[m]) for m in ("kl", "top1"))
                     + f" | {r['routed']['top1']:.3f} | {r['mixture']['top1']:.3f} |")
    return lines
