"""The trainable side-channel: per block n >= 2 a depth router, a low-rank adapter and a gate.

    k_i        = RMSNorm(h_i) + b_i                     (no learned scale)
    alpha_i->n = softmax_i(w_n . k_i / sqrt(d))         i = 0..n-1
    r_n        = sum_i alpha_i->n h_i
    delta_n    = gamma_n * A_n(r_n - h_{n-1}),          A(u) = W_up sigma(W_down u)
    gamma_n    = c(t) * g_n

The block input becomes x_n = h_{n-1} + delta_n; at c = 0 it is h_{n-1} exactly.
All side-channel parameters are kept in float32 whatever the backbone dtype.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .config import RetrofitConfig

_ACT = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}
RMS_EPS = 1e-6


@functools.lru_cache(maxsize=None)
def _norm_floor(hidden_size: int, device: torch.device) -> torch.Tensor:
    # Kept across calls, so never an inference tensor (autograd may not save those for backward).
    with torch.inference_mode(False):
        return torch.tensor(math.sqrt(hidden_size * RMS_EPS), device=device)


def source_norm(h: torch.Tensor, floor: torch.Tensor | None = None) -> torch.Tensor:
    """sqrt(d) RMS(h) over the last dim of a float32 h: (..., d) -> (...).

    RMSNorm has no learned weight here, so w . RMSNorm(h) / sqrt(d) = (w . h) / source_norm(h),
    with RMS(h) = sqrt(mean(h^2) + eps), i.e. sqrt(d) RMS(h) = sqrt(|h|^2 + d eps) = hypot(|h|, floor),
    floor = sqrt(d eps): two ops (the norm and hypot), not four.
    """
    if floor is None:
        floor = _norm_floor(h.shape[-1], h.device)
    return torch.hypot(torch.linalg.vector_norm(h, dim=-1), floor)


class DerivedCache:
    """A value derived from parameters (no input), kept while autograd is off (inference).

    It is recomputed when a parameter changes: an in-place update bumps a tensor's version,
    moving or replacing the data changes its pointer, and a new Parameter object has a new id
    (the cache holds the ones it was computed from, so neither an id nor a data pointer can
    be reused while it is kept); `extra` is any other input (c(t)).
    With autograd on, it is computed every time, so gradients flow as usual.
    """

    def __init__(self):
        self.key = None
        self.value = None
        self.params = ()

    def get(self, params, extra, compute: Callable[[], object]):
        if torch.is_grad_enabled():
            return compute()
        key = (extra, *map(id, params), *[p._version for p in params], *[p.data_ptr() for p in params])
        if key != self.key:
            self.value, self.key, self.params = compute(), key, tuple(params)
        return self.value


def router_logits(query: torch.Tensor, bias_logits: torch.Tensor, sources: torch.Tensor,
                  floor: torch.Tensor | None = None) -> torch.Tensor:
    """sources: h_i stacked, (B, T, n_sources, d) float32 -> logits (B, T, n_sources).

    w . (RMSNorm(h_i) + b_i) / sqrt(d) = (w . h_i) / source_norm(h_i) + w . b_i / sqrt(d), so
    the normalised copies of the sources are never built.
    """
    return torch.addcdiv(bias_logits, sources @ query, source_norm(sources, floor))


class DepthRouter(nn.Module):
    """Scores the sources h_0..h_{n-1} of one block; returns alpha (B, T, n_sources)."""

    def __init__(self, hidden_size: int, n_sources: int, config: RetrofitConfig, generator: torch.Generator):
        super().__init__()
        self.hidden_size = hidden_size
        w = torch.randn(hidden_size, generator=generator) * config.router_init_std
        # b_{n-1} is set so that w . b_{n-1} / sqrt(d) == prev_logit_init: a mild
        # initial preference for the standard residual, every other source at logit ~0.
        b = torch.zeros(n_sources, hidden_size)
        b[-1] = config.prev_logit_init * math.sqrt(hidden_size) * w / w.dot(w)
        self.query = nn.Parameter(w)  # w_n: (d,)
        self.source_bias = nn.Parameter(b)  # b_i: (n_sources, d)

    def bias_logits(self) -> torch.Tensor:
        """w . b_i / sqrt(d) for every source: (n_sources,); it does not depend on the input."""
        return (self.source_bias @ self.query) * (1.0 / math.sqrt(self.hidden_size))

    def logits(self, sources: torch.Tensor) -> torch.Tensor:
        return router_logits(self.query, self.bias_logits(), sources)

    def forward(self, sources: torch.Tensor) -> torch.Tensor:
        return self.logits(sources).softmax(dim=-1)


class LowRankAdapter(nn.Module):
    """A(u) = W_up sigma(W_down u); W_up starts small but nonzero."""

    def __init__(self, hidden_size: int, rank: int, config: RetrofitConfig, generator: torch.Generator):
        super().__init__()
        self.down = nn.Linear(hidden_size, rank, bias=False)
        self.up = nn.Linear(rank, hidden_size, bias=False)
        self.act = _ACT[config.activation]  # a function, not a Module: nothing to train or save
        with torch.no_grad():
            self.down.weight.copy_(torch.randn(rank, hidden_size, generator=generator) / math.sqrt(hidden_size))
            self.up.weight.copy_(torch.randn(hidden_size, rank, generator=generator) * config.up_init_std)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.up(self.act(self.down(u)))


class BlockTensors(NamedTuple):
    """One block's side-channel tensors, read once per pass (a pass never changes them).

    At decode each attribute read through nn.Module costs a visible share of the block's
    budget, so a pass reads them all up front (`SideChannel.pass_tensors`)."""

    query: torch.Tensor  # w_n (d,)
    bias_logits: torch.Tensor  # w_n . b_i / sqrt(d), (n,)
    down: torch.Tensor  # W_down (r, d)
    gated_up_t: torch.Tensor  # (gamma_n W_up)^T, (r, d): the gate folded into the up-projection
    act: Callable[[torch.Tensor], torch.Tensor]
    norm_floor: torch.Tensor  # sqrt(d eps), () (see `source_norm`)


def block_input(t: BlockTensors, sources: torch.Tensor, hidden: torch.Tensor):
    """Block n's input x_n = h_{n-1} + gamma_n A_n(r_n - h_{n-1}), and alpha.

    sources: h_0..h_{n-1} (B, T, n, d) float32; hidden: h_{n-1} (B, T, d) in the backbone
    dtype. Returns (x_n like hidden, alpha (B, T, n)). c(t) is already folded into `t.gated_up_t`.
    At decode every op here is a fixed per-call cost, so the steps are fused where an op allows.
    """
    alpha = router_logits(t.query, t.bias_logits, sources, t.norm_floor).softmax(dim=-1)
    n, d = sources.shape[-2:]
    # h_{n-1} in float32, rows flattened: (BT, d). In float32 `hidden` is the very tensor stacked
    # last in `sources`; otherwise that stacked entry is its exact float32 copy (no new cast).
    h = (hidden if hidden.dtype == torch.float32 else sources[..., -1, :]).reshape(-1, d)
    # r_n - h_{n-1} = sum_i alpha_i h_i - h_{n-1}, as one batched product:
    # (BT, 1, n) @ (BT, n, d) - (BT, 1, d)
    u = torch.baddbmm(h.unsqueeze(1), alpha.reshape(-1, 1, n), sources.reshape(-1, n, d), beta=-1).view(-1, d)
    z = t.act(F.linear(u, t.down))  # sigma(W_down u), (BT, r)
    if hidden.dtype == torch.float32:  # x_n = h_{n-1} + z (gamma W_up)^T in one product
        return torch.addmm(h, z, t.gated_up_t).view_as(hidden), alpha
    return hidden + (z @ t.gated_up_t).view_as(hidden).to(hidden.dtype), alpha


class BlockSideChannel(nn.Module):
    """Router + adapter + learnable gate g_n (starts at 1) for one block n >= 2."""

    def __init__(self, hidden_size: int, n_sources: int, rank: int, config: RetrofitConfig, generator):
        super().__init__()
        self.n_sources = n_sources
        self.router = DepthRouter(hidden_size, n_sources, config, generator)
        self.adapter = LowRankAdapter(hidden_size, rank, config, generator)
        self.gate = nn.Parameter(torch.ones(()))
        self._tensors = DerivedCache()

    def parameter_tensors(self) -> tuple[torch.Tensor, ...]:
        """w_n, b_i, W_down, W_up, g_n, read from the module dicts: a pass reads them at every decode
        step, and each attribute lookup through nn.Module costs about a microsecond. A test checks
        that these are exactly `self.parameters()`."""
        r, a = self._modules["router"]._parameters, self._modules["adapter"]._modules
        return (r["query"], r["source_bias"], a["down"]._parameters["weight"], a["up"]._parameters["weight"],
                self._parameters["gate"])

    def tensors(self, curriculum: float) -> BlockTensors:
        """This block's tensors at c(t) = curriculum; the derived ones (the router's bias term and the
        gated up-projection) are computed once and kept while autograd is off."""
        params = self.parameter_tensors()
        return self._tensors.get(params, curriculum, lambda: self._compute_tensors(curriculum))

    def _compute_tensors(self, curriculum: float) -> BlockTensors:
        r, a = self.router, self.adapter
        q, up = r.query, a.up.weight
        floor = _norm_floor(r.hidden_size, q.device)
        return BlockTensors(q, r.bias_logits(), a.down.weight, (up * (curriculum * self.gate)).t(), a.act, floor)

    def forward(self, sources: torch.Tensor, hidden: torch.Tensor, curriculum: float):
        """(x_n, alpha) for sources h_0..h_{n-1} (B, T, n, d) and h_{n-1} (B, T, d): see `block_input`."""
        return block_input(self.tensors(curriculum), sources, hidden)


class SideChannel(nn.Module):
    """All blocks' side-channel modules; `curriculum` is c(t), set by whoever drives training."""

    def __init__(self, hidden_size: int, n_blocks: int, config: RetrofitConfig, seed: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        rank = config.resolved_rank(hidden_size)
        self.hidden_size = hidden_size
        self.rank = rank
        self.n_blocks = n_blocks
        # Block 1 has one source (h_0) and no router; blocks 2..N each get one.
        self.per_block = nn.ModuleDict(
            {str(n): BlockSideChannel(hidden_size, n, rank, config, generator) for n in range(2, n_blocks + 1)}
        )
        self.curriculum = 1.0
        self._pass_tensors = DerivedCache()

    def block(self, n: int) -> BlockSideChannel:
        return self.per_block[str(n)]

    def pass_tensors(self) -> list[BlockTensors | None]:
        """Every block's tensors for one pass, indexed by n (None for n = 0, 1). While autograd is off
        the list is kept whole, under one key over every block's parameters and c(t): one check per
        decode step instead of one per block."""
        blocks = list(self.per_block._modules.values())  # blocks 2..N in order
        c = self.curriculum

        def compute():
            return [None, None] + [blk.tensors(c) for blk in blocks]

        if torch.is_grad_enabled():
            return compute()
        params = [p for blk in blocks for p in blk.parameter_tensors()]
        return self._pass_tensors.get(params, c, compute)


def count_side_channel_params(hidden_size: int, n_blocks: int, rank: int) -> int:
    """Closed form of the parameters `SideChannel` creates (checked against it in the tests)."""
    total = 0
    for n in range(2, n_blocks + 1):
        total += hidden_size + n * hidden_size  # w_n and b_i
        total += 2 * hidden_size * rank  # W_down, W_up
        total += 1  # g_n
    return total
