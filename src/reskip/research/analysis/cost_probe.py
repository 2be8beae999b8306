"""The predictability control: can what exists before block n runs tell where skipping n is cheap?

The router's w_recent(n) is one reading of the states before block n. A probe is another, as strong as
a fitted model can make it: it reads what exists at a position before block n runs, h_{n-1} (the last
state block n's router reads), w_recent(n) itself and the position in the sequence, and predicts the
per-token cost of skipping block n there, the signal test's oracle score (the next-token NLL with block
n as identity at every position, minus the full model's). Its inputs hold alpha's and the position
chooser's, so a probe no better than them says the cost cannot be predicted before execution (by a
model of this capacity fitted on this much data); a probe far ahead of alpha says the router's
parameterisation is the bottleneck. In the signal test it is one more position chooser: skip n where
the predicted cost is lowest.

Two families are fitted per block on the first part of the calibration split, a ridge regression over a
grid of penalties (closed form) and a small MLP (one hidden layer), on every feature, and a ridge on
w_recent and the position alone; the candidate whose chosen positions
cost least on the held-out rest of the split (the cheapest half of each sequence by prediction, the
signal test's rate 0.5) is refitted on the whole split and kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ...ar_retrofit.model import ReskipModel
from ...backbones.devices import model_device
from ...data.packing import Packed
from ...losses import ce_tokens
from ...skip.window import sliding_mean

RIDGE_PENALTIES = (1e-1, 1e1, 1e3, 1e5)  # on standardised features: from nearly unpenalised to nearly constant
MLP_HIDDEN = 64
MLP_STEPS = 300
HELD_OUT = 0.25  # the share of the calibration sequences the candidates are chosen on


@torch.no_grad()
def block_costs(model: ReskipModel, ids: torch.Tensor, labels: torch.Tensor, blocks: list[int]):
    """One full pass and one skip pass per block: (full pass output with alphas, its capture, the full
    model's per-token NLL (B, T), {n: per-token cost of block n as identity everywhere (B, T)})."""
    with model.capturing() as captured:
        full = model(input_ids=ids, use_cache=False, output_alphas=True)
        cap = captured()
    base = ce_tokens(full.logits, labels)  # (B, T)
    costs = {}
    for n in blocks:
        with model.replaying(cap, n):  # block n as identity everywhere; the blocks before it shared
            costs[n] = ce_tokens(model(input_ids=ids, use_cache=False).logits, labels) - base
    return full, cap, base, costs


def probe_features(cap, w_recent: torch.Tensor, n: int) -> torch.Tensor:
    """What exists before block n runs, per position (B, T, d + 2) float32: h_{n-1} of a captured pass, the
    router's w_recent(n) (B, T) and the position's share of the sequence."""
    h = cap.states[n - 1].float()  # (B, T, d)
    B, T = w_recent.shape
    where = (torch.arange(T, dtype=torch.float32, device=w_recent.device) / T).expand(B, T)
    return torch.cat([h, w_recent.float()[..., None], where[..., None]], dim=-1)


@dataclass
class Probe:
    """A fitted predictor of block n's per-token skip cost from h_{n-1}; `kind` names the candidate kept."""

    kind: str
    mean: torch.Tensor  # (F,) feature mean of the fitting data
    scale: torch.Tensor  # (F,) feature standard deviation
    net: torch.nn.Module  # standardised features (N, d) -> predicted cost (N, 1)
    held_out_cost: dict  # every candidate's cost of its chosen positions on the held-out sequences

    @torch.no_grad()
    def predict(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, F) features (`probe_features`) -> (B, T) predicted costs."""
        x = (h.float() - self.mean) / self.scale
        return self.net(x.reshape(-1, x.shape[-1])).reshape(h.shape[:-1])


def _ridge(x: torch.Tensor, y: torch.Tensor, penalty: float) -> torch.nn.Module:
    """Closed-form ridge on standardised x (N, d), y (N,): the intercept unpenalised (y centred)."""
    d = x.shape[1]
    x64, y64 = x.double(), y.double()
    w = torch.linalg.solve(x64.T @ x64 + penalty * torch.eye(d, dtype=torch.float64), x64.T @ (y64 - y64.mean()))
    lin = torch.nn.Linear(d, 1)
    lin.weight.data.copy_(w.float()[None])
    lin.bias.data.fill_(float(y64.mean()))
    return lin


def _mlp(x: torch.Tensor, y: torch.Tensor, seed: int) -> torch.nn.Module:
    """One hidden layer of MLP_HIDDEN GELUs, full-batch Adam on the squared error."""
    gen = torch.Generator().manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], MLP_HIDDEN), torch.nn.GELU(), torch.nn.Linear(MLP_HIDDEN, 1))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (p.shape[-1] ** -0.5 if p.dim() > 1 else 0.0))
        net[2].bias.fill_(float(y.mean()))
    opt = torch.optim.Adam(net.parameters(), lr=3e-3, weight_decay=1e-4)
    with torch.enable_grad():
        for _ in range(MLP_STEPS):
            opt.zero_grad(set_to_none=True)
            loss = (net(x).squeeze(1) - y).pow(2).mean()
            loss.backward()
            opt.step()
    return net.eval().requires_grad_(False)


class _LastTwo(torch.nn.Module):
    """A model of the last two features only (w_recent and the position): on a few thousand positions a
    fit over every feature can be worse at ranking them than these two alone, so they compete as well."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x[:, -2:])


# Each candidate: (standardised features (N, F), costs (N,), seed) -> a fitted predictor.
CANDIDATES = {
    **{f"ridge:{p:g}": (lambda x, y, seed, p=p: _ridge(x, y, p)) for p in RIDGE_PENALTIES},
    "mlp": _mlp,
    "ridge:w_recent+position": lambda x, y, seed: _LastTwo(_ridge(x[:, -2:], y, RIDGE_PENALTIES[0])),
}


def chosen_cost(pred: torch.Tensor, cost: torch.Tensor, share: float = 0.5) -> float:
    """Mean true cost (B, T) at the positions whose predicted cost (B, T) is lowest, `share` of each row."""
    k = max(1, round(share * cost.shape[1]))
    idx = (-pred).topk(k, dim=1).indices
    return float(cost.gather(1, idx).mean())


@torch.no_grad()
def fit_probe(states: torch.Tensor, costs: torch.Tensor, labelled: torch.Tensor, seed: int = 0) -> Probe:
    """states (S, T, F) features (`probe_features`), costs (S, T), labelled (S, T) bool (positions with a target; the only ones
    fitted on) of S calibration sequences -> the probe chosen on the held-out last HELD_OUT of them."""
    S = states.shape[0]
    n_fit = max(1, min(S - 1, round(S * (1 - HELD_OUT))))
    mean = states[:n_fit][labelled[:n_fit]].mean(0)
    scale = states[:n_fit][labelled[:n_fit]].std(0).clamp_min(1e-6)
    z = (states - mean) / scale  # (S, T, F)

    def fit(name: str, rows: slice) -> torch.nn.Module:
        m = labelled[rows]
        return CANDIDATES[name](z[rows][m], costs[rows][m].float(), seed)

    held = slice(n_fit, S)
    scores = {}
    for name in CANDIDATES:
        pred = fit(name, slice(0, n_fit))(z[held].reshape(-1, z.shape[-1])).reshape(costs[held].shape)
        scores[name] = chosen_cost(pred, costs[held])
    best = min(scores, key=scores.get)
    net = fit(best, slice(0, S))  # only the chosen candidate is refitted, on the whole split
    return Probe(best, mean, scale, net, scores)


@torch.no_grad()
def fit_probes(model: ReskipModel, data: Packed, blocks: list[int], window: int, batch_size: int = 4,
               seed: int = 0, progress: Callable[[int], None] | None = None) -> dict[int, Probe]:
    """Per block in `blocks`: a probe fitted on `data` (the calibration split); w_recent over `window` tokens.
    progress: called with the number of sequences after each batch."""
    was_training = model.training
    model.eval()
    states = {n: [] for n in blocks}
    costs = {n: [] for n in blocks}
    labelled = []
    for ids, labels in data.batches(batch_size, model_device(model)):
        full, cap, base, cost = block_costs(model, ids, labels, blocks)
        # the probes are small and fitted on the host, whatever device the model is on
        labelled.append(torch.nn.functional.pad(labels[:, 1:] != -100, (0, 1)).cpu())  # (B, T): t predicts t+1
        for n in blocks:
            w = sliding_mean(full.alphas[n][..., -1].float(), window)  # (B, T)
            states[n].append(probe_features(cap, w, n).cpu())
            costs[n].append(cost[n].cpu())
        if progress is not None:
            progress(len(ids))
    model.train(was_training)
    mask = torch.cat(labelled)
    return {n: fit_probe(torch.cat(states[n]), torch.cat(costs[n]), mask, seed) for n in blocks}
