"""Depth diagnostics (`reskip diagnose`): dilution, depth-state memory, routing health, reading
discipline, and a per-token skip trace of a sample text. Writes diagnostics.json.

Each diagnostic is a measurement with its limits stated beside it: the dilution toy model
1/(1 + 0.25 l) assumes orthogonal contributions of norm 0.5; a routing weight measures a
source's influence inside one router, and every claim "block n matters" is set beside the
ablation that could refute it (A(n)).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from ...ar_retrofit.model import ReskipModel
from ...compat import cache_kwarg
from ...skip.policies import SkipPolicy
from ...skip.policy_file import PolicyFile
from ...skip.scoring import on_model

FLAT, COLLAPSED = 0.95, 0.95


@torch.no_grad()
def dilution(model: ReskipModel, ids: torch.Tensor) -> dict:
    """Share of h_0 in every later layer state of the backbone (side-channel off).

    energy_ratio(l) = |h_0|^2 / |h_l|^2 (what the toy model predicts under orthogonality);
    cos2(l) = cos(h_0, h_l)^2 (the share of h_l's energy along h_0's direction).
    Means over tokens; the first token (often a huge-norm attention sink) is excluded.
    """
    ids = on_model(model, ids)
    outputs = []
    hooks = [w.layer.register_forward_hook(lambda m, a, o: outputs.append(o[0] if isinstance(o, tuple) else o))
             for w in model.base_model.model.layers]
    try:
        with model.side_channel_disabled(), model.capturing() as captured:
            model(input_ids=ids, use_cache=False)
            h0 = captured().states[0].float()[:, 1:]
    finally:
        for h in hooks:
            h.remove()
    energy, cos2 = [1.0], [1.0]
    energy_0 = h0.pow(2).sum(-1)
    for out in outputs:
        hl = out.float()[:, 1:]
        energy.append(float((energy_0 / hl.pow(2).sum(-1)).mean()))
        cos2.append(float(F.cosine_similarity(h0, hl, dim=-1).pow(2).mean()))
    layers = list(range(len(energy)))
    block_ends = [b.stop for b in model.blocks]
    return {"layers": layers, "energy_ratio": energy, "cos2": cos2,
            "toy_model": [1 / (1 + 0.25 * l) for l in layers], "block_ends": block_ends,
            "tokens": int(h0.shape[0] * h0.shape[1])}


def memory_table(n_layers: int, hidden_size: int, context: int, dtype_bytes: int, block_starts: list[int]) -> dict:
    """Bytes of keeping depth states at each granularity, and what each can no longer address."""
    state = context * hidden_size * dtype_bytes
    every4 = sorted(set(range(0, n_layers + 1, 4)) | {n_layers})
    per_block = sorted(set(block_starts) | {n_layers})
    rows = []
    for name, states in (("every layer", list(range(n_layers + 1))), ("every 4 layers", every4),
                         ("per block (this retrofit)", per_block), ("h_0 only", [0])):
        missing = [l for l in range(n_layers + 1) if l not in states]
        rows.append({"granularity": name, "states": len(states), "bytes": len(states) * state,
                     "mib": len(states) * state / 2**20, "addressable": states,
                     "not_addressable": len(missing),
                     "cannot_ask": ("nothing: every layer state is kept" if not missing else
                                    f"for any of the {len(missing)} states between kept ones (e.g. x_{missing[0]})")})
    return {"context": context, "hidden_size": hidden_size, "dtype_bytes": dtype_bytes, "state_bytes": state,
            "n_layers": n_layers, "rows": rows}


def routing_health(mean_alpha: dict, entropy: dict, signal: dict | None = None) -> list[dict]:
    """Per block: entropy vs log n, where the weight goes, and whether alpha depends on the input.

    Failures, in this order: FLAT (near uniform), COLLAPSED (near one-hot, on h_{n-1}: the standard
    residual rebuilt, or on an earlier state, which leaves w_recent at zero so ReSkip never skips),
    INPUT-INDEPENDENT (`analysis.signal_health`: w_recent hardly moves from token to token). signal: block ->
    `signal_health` (str keys), measured on the caller's tokens."""
    out = []
    for n_str, alpha in sorted(mean_alpha.items(), key=lambda kv: int(kv[0])):
        n = int(n_str)
        h = entropy.get(n_str)
        hmax = math.log(n)
        ratio = h / hmax if h is not None else None
        prev = alpha[-1]
        top = max(range(len(alpha)), key=lambda i: alpha[i])
        health = (signal or {}).get(n_str)
        status = "ok"
        if ratio is not None and ratio >= FLAT:
            status = "FLAT: near-uniform routing retrieves nothing the residual does not"
        elif prev >= COLLAPSED:
            status = "COLLAPSED: one-hot on h_{n-1}, the standard residual rebuilt"
        elif alpha[top] >= COLLAPSED or (ratio is not None and ratio <= 1 - COLLAPSED):
            status = (f"COLLAPSED onto an earlier state: {alpha[top]:.2f} on h_{top}, so w_recent stays near "
                      f"{prev:.2f} and ReSkip would never skip block {n}")
        elif health is not None and health["status"] != "ok":
            status = health["status"]
        row = {"block": n, "entropy": h, "entropy_max": hmax, "entropy_ratio": ratio,
               "alpha_on_prev": prev, "top_source": top, "alpha_on_top": alpha[top], "status": status}
        if health is not None:
            row.update(alpha_prev_std=health["alpha_prev"]["std"], w_recent_std=health["w_recent"]["std"],
                       w_recent_p05=health["w_recent"]["p05"], w_recent_p95=health["w_recent"]["p95"],
                       w_recent_range=health["w_recent"]["range"])
        out.append(row)
    return out


def spearman(x: list[float], y: list[float]) -> float | None:
    if len(x) < 3:
        return None
    rank = lambda v: torch.tensor(v).argsort().argsort().float()  # noqa: E731
    rx, ry = rank(x), rank(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = float(rx.norm() * ry.norm())
    return float((rx * ry).sum()) / denom if denom else None


def reading_discipline(policy: PolicyFile) -> dict:
    blocks = [b for b in policy.data["blocks"] if b["I"] is not None]
    rho = spearman([b["I"] for b in blocks], [b["A"] for b in blocks])
    delta = policy.data["delta"]
    claims = []
    for b in blocks:
        verdict = "supported" if b["A"] >= 1 + delta else "refuted"
        claims.append({
            "block": b["block"], "I": b["I"], "A": b["A"],
            "claim": f"block {b['block']} matters (later routers put up to {b['I']:.2f} on h_{b['block']})",
            "refuting_ablation": (f"replace block {b['block']} by identity on the calibration split: A(n) < {1 + delta:.2f} "
                                  f"would refute the claim; measured A({b['block']}) = {b['A']:.3f}"),
            "verdict": verdict,
        })
    return {"spearman_I_vs_A": rho, "delta": delta, "claims": claims,
            "note": "alpha measures a source's influence inside one router for the tokens seen; the residual path "
                    "carries h_n whatever alpha says, so only the ablation A(n) tests whether block n matters."}


@torch.no_grad()
def token_trace(model: ReskipModel, ids: torch.Tensor, policy: SkipPolicy, window: int) -> dict:
    """Teacher-forced decoding, one token per step: per token, w_recent of every block and the blocks skipped."""
    ids = on_model(model, ids)
    with model.skipping(policy, window, track_all=True) as runtime:
        cache = DynamicCache()
        for t in range(ids.shape[1]):
            model(input_ids=ids[:, t : t + 1], use_cache=True, **{cache_kwarg(): cache})
        trace = list(runtime.trace)
    return {"steps": [t.to_dict() for t in trace], "window": window, "policy": policy.describe()}
