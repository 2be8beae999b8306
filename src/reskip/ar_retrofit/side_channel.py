"""The trainable side-channel: per block n >= 2 a depth router, a low-rank correction A_n and a gate.

(The correction's module is `LowRankCorrection` under the attribute `correction`; "the adapter" means the saved
side-channel, `adapter/`. Adapters saved before the rename name it `adapter`: `adapter_io.current_names` maps
those tensor names on load.)

    k_i        = RMSNorm(h_i) + b_i                     (no learned scale)
    alpha_i->n = softmax_i(w_n . k_i / sqrt(d))         i = 0..n-1
    r_n        = sum_i alpha_i->n h_i
    delta_n    = gamma_n * A_n(r_n - h_{n-1}),          A(u) = W_up sigma(W_down u)
    gamma_n    = c(t) * g_n

The block input becomes x_n = h_{n-1} + delta_n; at c = 0 it is h_{n-1} exactly.
All side-channel parameters are kept in float32 whatever the backbone dtype.
The rejected designs (`RetrofitConfig.variant`) change delta_n only: observer 0, interpolate
gamma_n (r_n - h_{n-1}), gamma_free A_n(r_n - h_{n-1}).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .config import RetrofitConfig

_ACT = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}
RMS_EPS = 1e-6


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


def score_root(hidden_size: int, device) -> torch.Tensor:
    """sqrt(d * eps) as a 0-dim float32 tensor: the RMS's eps in the norm's units (`source_scores`)."""
    return torch.tensor(math.sqrt(hidden_size * RMS_EPS), device=device)


def source_scores(queries: torch.Tensor, bias: torch.Tensor, states: torch.Tensor, root: torch.Tensor,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """w . (RMSNorm(h) + b) / sqrt(d) for every query and state: queries w (q, d) unscaled, bias (q,) the
    input-free w . b / sqrt(d) of each, states (..., d) float32, root `score_root` -> (..., q).

    w . RMSNorm(h) / sqrt(d) = w . h / sqrt(|h|^2 + d eps): one product against every query, the state's norm
    (one reduction), hypot(|h|, sqrt(d eps)) and one fused add-divide with the bias, four kernels per state and no
    normalised copy. out: where to write them (inference: a slot of the pass's score buffer).
    """
    den = torch.hypot(torch.linalg.vector_norm(states, dim=-1, keepdim=True), root)  # (..., 1)
    return torch.addcdiv(bias, F.linear(states, queries), den, out=out)


class MixStates(torch.autograd.Function):
    """sum_i c_i h_i over n separate states, (B, T, n) coefficients and n (B, T, d) float32 states -> (B, T, d).

    With autograd on, the states are never stacked: a (B, T, n, d) stack per block is written, read twice and
    differentiated (an O(N^2) traffic over the blocks that dominated the training side-channel); here each state is
    read once forward and once backward, and only the states that need a gradient get one."""

    @staticmethod
    def forward(ctx, coeff: torch.Tensor, *states: torch.Tensor) -> torch.Tensor:
        out = states[0] * coeff[..., :1]
        for i in range(1, len(states)):
            out.addcmul_(states[i], coeff[..., i:i + 1])
        ctx.save_for_backward(coeff, *states)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        coeff, *states = ctx.saved_tensors
        need = ctx.needs_input_grad
        grad_coeff = torch.stack([(s * grad).sum(-1) for s in states], -1) if need[0] else None  # (B, T, n)
        grads = [grad * coeff[..., i:i + 1] if need[i + 1] else None for i in range(len(states))]
        return grad_coeff, *grads


def mix(coeff: torch.Tensor, sources) -> torch.Tensor:
    """sum_i c_i h_i: coeff (B, T, n); sources (B, T, n, d) float32 (one batched product, (B, T, 1, n) @ (B, T, n, d):
    no (B, T, n, d) temporary) or a sequence of n (B, T, d) float32 states (`MixStates`) -> (B, T, d)."""
    if isinstance(sources, torch.Tensor):
        return (coeff.unsqueeze(-2) @ sources).squeeze(-2)
    return MixStates.apply(coeff, *sources)


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
        # a constant of the model's width, made once and moved with the module (not one host copy per pass)
        self.register_buffer("root", score_root(hidden_size, None), persistent=False)

    def bias(self) -> torch.Tensor:
        """w . b_i / sqrt(d) for every source, (n_sources,); it does not depend on the input."""
        return (self.source_bias @ self.query) * (1.0 / math.sqrt(self.hidden_size))

    def logits(self, sources: torch.Tensor) -> torch.Tensor:
        """(B, T, n, d) -> (B, T, n)."""
        return source_scores(self.query.unsqueeze(0), self.bias().unsqueeze(-1), sources, self.root).squeeze(-1)

    def forward(self, sources: torch.Tensor) -> torch.Tensor:
        return self.logits(sources).softmax(dim=-1)


class LowRankCorrection(nn.Module):
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


class SkipShortcut(nn.Module):
    """S_n(x) = W_up sigma(W_down x) for a skipped block n; W_up starts at exactly zero, so a skipped
    block is the identity until training moves it. Computed in float32, returned in x's dtype."""

    def __init__(self, hidden_size: int, rank: int, config: RetrofitConfig, generator: torch.Generator):
        super().__init__()
        self.low_rank = LowRankCorrection(hidden_size, rank, config, generator)
        with torch.no_grad():
            self.low_rank.up.weight.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x + S(x): block n's output when it is skipped (B, T, d)."""
        s = self.low_rank(x.float())
        return x + (s if x.dtype == torch.float32 else s.to(x.dtype))


class BlockTensors(NamedTuple):
    """One block's side-channel tensors, read once per pass (a pass never changes them).

    At decode each attribute read through nn.Module costs a visible share of the block's
    budget, so a pass reads them all up front (`SideChannel.pass_tensors`)."""

    query: torch.Tensor  # w_n, (1, d)
    bias: torch.Tensor  # w_n . b_i / sqrt(d), (n,): folded into each state's scores (`PassTensors.bias`)
    last: torch.Tensor  # the one-hot of h_{n-1} among the n sources, (n,): r_n - h_{n-1} = sum_i (alpha_i - last_i) h_i
    down: torch.Tensor  # W_down (r, d)
    gated_up: torch.Tensor  # gamma_n W_up, (d, r): the gate folded into the up-projection (W_up for gamma_free)
    act: Callable[[torch.Tensor], torch.Tensor]
    variant: str = "recipe"
    gamma: torch.Tensor | None = None  # gamma_n = c(t) g_n, a scalar: only `interpolate` reads it
    root: torch.Tensor | None = None  # `score_root`, the router's buffer


def block_input(t: BlockTensors, scores: torch.Tensor, sources, hidden: torch.Tensor):
    """Block n's input x_n = h_{n-1} + gamma_n A_n(r_n - h_{n-1}), and alpha.

    scores: router n's logits of h_0..h_{n-1} (`source_scores`, the bias term included), (B, T, n); sources:
    h_0..h_{n-1} in float32, (B, T, n, d) or a sequence of n (B, T, d) (see `mix`), the last being h_{n-1}; hidden:
    h_{n-1} (B, T, d) in the backbone dtype. Returns (x_n like hidden, alpha (B, T, n)). c(t) is already folded into
    `t.gated_up`. r_n - h_{n-1} is never built as r_n and a subtraction: in inference it is one batched product
    -h_{n-1} + alpha @ H (`baddbmm`), with autograd on one mix of the separate states with alpha - last as its
    coefficients. At decode every op here is a fixed per-call cost (about 10 us on a CPU, a kernel launch on a GPU),
    so the fewer the better (`benchmarks/speed.py` measures the result).
    """
    alpha = scores.softmax(dim=-1)  # (B, T, n)
    if t.variant == "observer":  # alpha is read (and trained by the loss's own terms), the stream is untouched
        return hidden, alpha
    if isinstance(sources, torch.Tensor):  # inference: -h_{n-1} + alpha @ H in one batched product
        b, l, n, d = sources.shape
        u = torch.baddbmm(sources[..., -1, :].reshape(b * l, 1, d), alpha.view(b * l, 1, n),
                          sources.reshape(b * l, n, d), beta=-1).view(b, l, d)  # r_n - h_{n-1}
    else:
        u = mix(alpha - t.last, sources)  # r_n - h_{n-1}, (B, T, d) float32
    if t.variant == "interpolate":  # (1 - gamma) h + gamma r = h + gamma (r - h)
        delta = t.gamma * u
    else:
        delta = F.linear(t.act(F.linear(u, t.down)), t.gated_up)  # gamma W_up sigma(W_down u), (B, T, d)
    x = hidden + (delta if hidden.dtype == torch.float32 else delta.to(hidden.dtype))
    return x, alpha


class BlockSideChannel(nn.Module):
    """Router + correction A_n + learnable gate g_n (starts at 1) for one block n >= 2."""

    def __init__(self, hidden_size: int, n_sources: int, rank: int, config: RetrofitConfig, generator):
        super().__init__()
        self.n_sources = n_sources
        self.variant = config.variant
        self.router = DepthRouter(hidden_size, n_sources, config, generator)
        self.correction = LowRankCorrection(hidden_size, rank, config, generator)
        self.gate = nn.Parameter(torch.ones(()))
        self._tensors = DerivedCache()

    def parameter_tensors(self) -> tuple[torch.Tensor, ...]:
        """w_n, b_i, W_down, W_up, g_n, read from the module dicts: a pass reads them at every decode
        step, and each attribute lookup through nn.Module costs about a microsecond. A test checks
        that these are exactly `self.parameters()`."""
        r, a = self._modules["router"]._parameters, self._modules["correction"]._modules
        return (r["query"], r["source_bias"], a["down"]._parameters["weight"], a["up"]._parameters["weight"],
                self._parameters["gate"])

    def tensors(self, curriculum: float) -> BlockTensors:
        """This block's tensors at c(t) = curriculum; the derived ones (the router's scaled query and bias
        term, and the gated up-projection) are computed once and kept while autograd is off."""
        params = self.parameter_tensors()
        return self._tensors.get(params, curriculum, lambda: self._compute_tensors(curriculum))

    def _compute_tensors(self, curriculum: float) -> BlockTensors:
        r, a = self.router, self.correction
        gamma = curriculum * self.gate
        last = torch.zeros(self.n_sources, dtype=self.gate.dtype, device=self.gate.device)
        last[-1] = 1.0
        if self.variant == "gamma_free":  # no gate and no curriculum: A_n acts from step 0
            return BlockTensors(r.query.unsqueeze(0), r.bias(), last, a.down.weight, a.up.weight, a.act, self.variant,
                                root=r.root)
        return BlockTensors(r.query.unsqueeze(0), r.bias(), last, a.down.weight, a.up.weight * gamma, a.act,
                            self.variant, gamma, r.root)

    def forward(self, sources: torch.Tensor, hidden: torch.Tensor, curriculum: float):
        """(x_n, alpha) for sources h_0..h_{n-1} (B, T, n, d) float32 and h_{n-1} (B, T, d): see `block_input`."""
        t = self.tensors(curriculum)
        return block_input(t, source_scores(t.query, t.bias.unsqueeze(-1), sources, t.root).squeeze(-1), sources, hidden)


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
        # Made after the blocks' modules, so an identity-path retrofit draws the same numbers as before.
        shortcut_rank = config.resolved_shortcut_rank(hidden_size)
        self.shortcut_rank = shortcut_rank
        self.shortcuts = nn.ModuleDict(
            {str(n): SkipShortcut(hidden_size, shortcut_rank, config, generator) for n in range(2, n_blocks)}
        ) if shortcut_rank is not None else None
        self.curriculum = 1.0
        self._pass_tensors = DerivedCache()

    def block(self, n: int) -> BlockSideChannel:
        return self.per_block[str(n)]

    def skipped_output(self, n: int, x: torch.Tensor) -> torch.Tensor:
        """h_n of a skipped block n from its input x_n: x_n itself (identity), or x_n + S_n(x_n)."""
        if self.shortcuts is None or str(n) not in self.shortcuts:
            return x
        return self.shortcuts[str(n)](x)

    def shortcut_modules(self) -> list[SkipShortcut]:
        return [m for m in self.modules() if isinstance(m, SkipShortcut)]

    def routers(self) -> list[DepthRouter]:
        """The depth routers of blocks 2..N, in order."""
        return [m for m in self.modules() if isinstance(m, DepthRouter)]

    def pass_tensors(self) -> PassTensors:
        """Every block's tensors for one pass and the routers' stacked queries. While autograd is off they are kept
        whole, under one key over every block's parameters and c(t): one check per decode step instead of one per
        block."""
        blocks = list(self.per_block._modules.values())  # blocks 2..N in order
        c = self.curriculum

        def compute():
            per_block = [blk.tensors(c) for blk in blocks]
            queries = torch.cat([t.query for t in per_block])  # (N - 1, d)
            # zero rows up to a multiple of 8: a product with 7 output columns runs at a third of the speed of 8 on
            # this CPU's kernels (the router of block n reads column n - 2; the padding's scores are never read)
            pad = -len(blocks) % 8
            queries = F.pad(queries, (0, 0, 0, pad))
            # bias[i, n - 2] = w_n . b_i / sqrt(d): state i's input-free term against router n (0 where n cannot read i)
            bias = torch.stack([F.pad(t.bias, (0, len(blocks) + 1 - len(t.bias))) for t in per_block], -1)
            bias = F.pad(bias, (0, pad))  # (N, P)
            return PassTensors([None, None] + per_block, queries, list(bias.unbind(0)), per_block[0].root)

        if torch.is_grad_enabled():
            return compute()
        params = [p for blk in blocks for p in blk.parameter_tensors()]
        return self._pass_tensors.get(params, c, compute)


class PassTensors(NamedTuple):
    """What one pass reads off the side-channel: blocks[n] is block n's `BlockTensors` (None for n = 0, 1);
    queries: every router's w_n / sqrt(d), block n's in row n - 2, zero-padded (P, d): a state's `source_scores`
    against all routers in one product."""

    blocks: list
    queries: torch.Tensor
    bias: list  # bias[i]: state i's input-free score term against every router, (P,)
    root: torch.Tensor  # `score_root`


def count_side_channel_params(hidden_size: int, n_blocks: int, rank: int, shortcut_rank: int | None = None) -> int:
    """Closed form of the parameters `SideChannel` creates (checked against it in the tests)."""
    total = 0 if shortcut_rank is None else 2 * hidden_size * shortcut_rank * max(0, n_blocks - 2)
    for n in range(2, n_blocks + 1):
        total += hidden_size + n * hidden_size  # w_n and b_i
        total += 2 * hidden_size * rank  # W_down, W_up
        total += 1  # g_n
    return total
