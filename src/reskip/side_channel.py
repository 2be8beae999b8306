"""The trainable side-channel: per block n >= 2 a depth router, a low-rank adapter and a gate.

    k_i        = RMSNorm(h_i) + b_i                     (no learned scale)
    alpha_i->n = softmax_i(w_n . k_i / sqrt(d))         i = 0..n-1
    r_n        = sum_i alpha_i->n h_i
    delta_n    = gamma_n * A_n(r_n - h_{n-1}),          A(u) = W_up sigma(W_down u)
    gamma_n    = c(t) * g_n

The block input becomes x_n = h_{n-1} + delta_n; at c = 0 delta is an exact zero.
All side-channel parameters are kept in float32 whatever the backbone dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import RetrofitConfig

_ACT = {"silu": nn.SiLU, "gelu": nn.GELU, "relu": nn.ReLU}
RMS_EPS = 1e-6


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

    def logits(self, normed_sources: torch.Tensor) -> torch.Tensor:
        """normed_sources: RMSNorm(h_i) stacked, (B, T, n_sources, d) float32 -> (B, T, n_sources)."""
        scale = 1.0 / math.sqrt(self.hidden_size)
        # w . (k_hat_i + b_i) = w . k_hat_i + w . b_i; the second term is (n_sources,)
        return (normed_sources @ self.query + self.source_bias @ self.query) * scale

    def forward(self, normed_sources: torch.Tensor) -> torch.Tensor:
        return self.logits(normed_sources).softmax(dim=-1)


class LowRankAdapter(nn.Module):
    """A(u) = W_up sigma(W_down u); W_up starts small but nonzero."""

    def __init__(self, hidden_size: int, rank: int, config: RetrofitConfig, generator: torch.Generator):
        super().__init__()
        self.down = nn.Linear(hidden_size, rank, bias=False)
        self.up = nn.Linear(rank, hidden_size, bias=False)
        self.act = _ACT[config.activation]()
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

    def forward(self, sources: torch.Tensor, normed_sources: torch.Tensor, curriculum: float):
        """sources, normed_sources: (B, T, n, d) float32. Returns (delta (B, T, d), alpha (B, T, n))."""
        alpha = self.router(normed_sources)
        routed = (alpha.unsqueeze(-2) @ sources).squeeze(-2)  # r_n: (B, T, 1, n) @ (B, T, n, d) -> (B, T, d)
        correction = self.adapter(routed - sources[..., -1, :])
        return (curriculum * self.gate) * correction, alpha


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

    @staticmethod
    def normalize(h: torch.Tensor) -> torch.Tensor:
        """RMSNorm without a learned scale, in float32: (..., d) -> (..., d)."""
        return F.rms_norm(h.float(), (h.shape[-1],), eps=RMS_EPS)


def count_side_channel_params(hidden_size: int, n_blocks: int, rank: int) -> int:
    """Closed form of the parameters `SideChannel` creates (checked against it in the tests)."""
    total = 0
    for n in range(2, n_blocks + 1):
        total += hidden_size + n * hidden_size  # w_n and b_i
        total += 2 * hidden_size * rank  # W_down, W_up
        total += 1  # g_n
    return total
