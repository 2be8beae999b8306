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

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import RetrofitConfig

_ACT = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}
RMS_EPS = 1e-6


def source_scale(h: torch.Tensor) -> torch.Tensor:
    """1 / (sqrt(d) RMS(h)) over the last dim of a float32 h: (..., d) -> (...).

    RMSNorm has no learned weight here, so w . RMSNorm(h) / sqrt(d) = (w . h) * source_scale(h),
    with RMS(h) = sqrt(mean(h^2) + eps), i.e. sqrt(d) RMS(h) = sqrt(sum(h^2) + d eps).
    """
    return torch.linalg.vecdot(h, h).add(h.shape[-1] * RMS_EPS).rsqrt()


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
        self._bias_cache: tuple | None = None

    def bias_logits(self) -> torch.Tensor:
        """w . b_i / sqrt(d) for every source: (n_sources,).

        It does not depend on the input, so while autograd is off (inference) it is computed
        once and kept until a parameter changes (in-place updates bump a tensor's version;
        moving or replacing the data changes its pointer).
        """
        w, b = self.query, self.source_bias
        cached = not torch.is_grad_enabled()
        if cached:
            key = (w._version, b._version, w.data_ptr(), b.data_ptr())
            if self._bias_cache is not None and self._bias_cache[0] == key:
                return self._bias_cache[1]
        value = (b @ w) * (1.0 / math.sqrt(self.hidden_size))
        if cached:
            self._bias_cache = (key, value)
        return value

    def logits(self, sources: torch.Tensor) -> torch.Tensor:
        """sources: h_i stacked, (B, T, n_sources, d) float32 -> (B, T, n_sources).

        w . (RMSNorm(h_i) + b_i) / sqrt(d) = (w . h_i) * source_scale(h_i) + w . b_i / sqrt(d), so
        the normalised copies of the sources are never built.
        """
        return torch.addcmul(self.bias_logits(), sources @ self.query, source_scale(sources))

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
        # F.linear directly: at decode shapes the Linear modules' call overhead is most of the cost.
        return F.linear(self.act(F.linear(u, self.down.weight)), self.up.weight)


class BlockSideChannel(nn.Module):
    """Router + adapter + learnable gate g_n (starts at 1) for one block n >= 2."""

    def __init__(self, hidden_size: int, n_sources: int, rank: int, config: RetrofitConfig, generator):
        super().__init__()
        self.n_sources = n_sources
        self.router = DepthRouter(hidden_size, n_sources, config, generator)
        self.adapter = LowRankAdapter(hidden_size, rank, config, generator)
        self.gate = nn.Parameter(torch.ones(()))

    def forward(self, sources: torch.Tensor, hidden: torch.Tensor, curriculum: float):
        """Block n's input x_n = h_{n-1} + gamma_n A_n(r_n - h_{n-1}), and alpha.

        sources: h_0..h_{n-1} (B, T, n, d) float32; hidden: h_{n-1} (B, T, d) in the backbone
        dtype. Returns (x_n like hidden, alpha (B, T, n)).
        At decode every op here is a fixed per-call cost, so the steps are fused where an op allows.
        """
        # Methods, not module calls: at decode the module-call machinery is a visible share of the cost.
        alpha = self.router.logits(sources).softmax(dim=-1)
        *lead, n, d = sources.shape
        # r_n - h_{n-1} = sum_i alpha_i h_i - h_{n-1}, as one batched product:
        # (BT, 1, n) @ (BT, n, d) - (BT, 1, d)
        u = torch.baddbmm(sources[..., -1, :].reshape(-1, 1, d), alpha.reshape(-1, 1, n), sources.reshape(-1, n, d),
                          beta=-1).view(*lead, d)
        correction = self.adapter.forward(u)
        gamma = self.gate if curriculum == 1.0 else curriculum * self.gate  # c(t) = 1 after the ramp
        if hidden.dtype == correction.dtype:
            return torch.addcmul(hidden, gamma, correction), alpha
        return hidden + (gamma * correction).to(hidden.dtype), alpha


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

    def block(self, n: int) -> BlockSideChannel:
        return self.per_block[str(n)]


def count_side_channel_params(hidden_size: int, n_blocks: int, rank: int) -> int:
    """Closed form of the parameters `SideChannel` creates (checked against it in the tests)."""
    total = 0
    for n in range(2, n_blocks + 1):
        total += hidden_size + n * hidden_size  # w_n and b_i
        total += 2 * hidden_size * rank  # W_down, W_up
        total += 1  # g_n
    return total
