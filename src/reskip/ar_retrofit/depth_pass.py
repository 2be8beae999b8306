"""One forward pass through the blocks: layer wrappers and the per-pass depth state.

The family's own forward loop (masks, rotary, cache) runs unchanged; each decoder
layer is wrapped by `BlockLayer`, which tells the `DepthPass` when a block starts
(to apply the side-channel correction to its input) and when it ends (to record
h_n). A block replaced by identity passes its input through without running its
layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .. import compat
from .kv_cache import append_kv
from .side_channel import SideChannel, block_input, source_scores


@dataclass
class Captured:
    """A finished pass: states h_0..h_N, the routers' float32 copies of them and their scores, block inputs x_n."""

    states: list[torch.Tensor]
    float_states: list[torch.Tensor]  # h_0..h_{k-1} in float32, (B, T, d) each, k = the sources the last router read
    scores: list[torch.Tensor]  # their `source_scores` against every router, (B, T, P) each
    inputs: dict[int, torch.Tensor]


class DepthPass:
    """Settings and state of the passes of one retrofitted model (a plain object, not a Module).

    enabled: False -> the side-channel is off and the model is the backbone (teacher).
    skip: blocks replaced by identity in the next passes.
    states: h_0..h_n of the current pass, each (B, T, d) in the backbone dtype.
    float_states: the float32 copies of states made so far (in a float32 stream, the states).
    scores: each float state's `source_scores` against every router (B, T, P), one product per state per pass.
    With autograd on these are separate tensors (nothing written in place; the mix reads the states without
    stacking them, `side_channel.MixStates`); in inference they are views of one (B, T, N, d) and one (B, T, N, P)
    buffer per pass, into which each state is written once, when it is first read: block k's router then reads
    h_0..h_{k-1} as one (B, T, k, d) view and its scores as one (B, T, k) view.
    alphas: block n -> alpha (B, T, n) of the last pass, when `record_alphas`.
    """

    def __init__(self, side_channel: SideChannel, n_blocks: int):
        self.side_channel = side_channel
        self.n_blocks = n_blocks
        self.enabled = True
        self.skip: frozenset[int] = frozenset()
        self.record_alphas = False
        self.states: list[torch.Tensor] = []
        self.float_states: list[torch.Tensor] = []
        self.scores: list[torch.Tensor] = []
        self.buffer: tuple[torch.Tensor, torch.Tensor] | None = None  # inference: (B, T, N, d) and (B, T, N, P)
        self.inputs: dict[int, torch.Tensor] = {}
        self.alphas: dict[int, torch.Tensor] = {}
        self.tensors = None  # the side-channel's `PassTensors` for this pass
        # capture: keep the pass's states and block inputs after it ends (in `captured`).
        # replay: (k, captured, identity) -> blocks 1..k are not run; the stream continues
        # after block k from the captured x_k (identity: block k skipped) or h_k (block k as it
        # ran), and blocks k+1..N run on the captured prefix states h_0..h_{k-1}.
        self.capture = False
        self.captured: Captured | None = None
        self.replay: tuple[int, Captured, bool] | None = None
        # ReSkip: `runtime` decides per pass (step) which blocks to skip, before each block
        # runs. `idle`: the blocks whose layers do not run in this pass (skipped, replayed or
        # decided by the runtime). `position_skip` skips block n only at the positions where its
        # (B, T) bool mask is True (the block runs; identity there). `pass_skip`: this pass's
        # masks, position_skip's plus the rows a runtime deciding per row skips block n on.
        self.runtime = None
        self.idle: set[int] = set()
        self.position_skip: dict[int, torch.Tensor] = {}
        self.pass_skip: dict[int, torch.Tensor] = {}
        # recompute: run each frozen layer under activation checkpointing when gradients flow through
        # it, so only its input is kept and its inner activations are recomputed in the backward pass.
        self.recompute = False

    def enter_block(self, n: int, hidden: torch.Tensor) -> torch.Tensor:
        """Called before block n's first layer with h_{n-1}; returns the block input x_n."""
        if n == 1:
            self.states, self.float_states, self.scores = [hidden], [], []
            self.inputs, self.alphas, self.buffer = {}, {}, None
            self.tensors = self.side_channel.pass_tensors() if self.enabled else None
            self.idle = set(self.skip)
            self.pass_skip = self.position_skip  # copied before a runtime adds to it (`_decide`)
            if self.replay is not None:
                self.idle.update(range(1, self.replay[0] + 1))
            if self.runtime is not None:
                self.runtime.begin_step(hidden.shape[1])
                self._decide(1, None, hidden)  # block 1 has no router: only static policies skip it
        if self.replay is not None and n <= self.replay[0]:
            return hidden
        if n == 1 or not self.enabled:
            self.inputs[n] = hidden
            return hidden
        scores, sources = self._router_inputs(n)
        x, alpha = block_input(self.tensors.blocks[n], scores, sources, hidden)
        if self.record_alphas:
            self.alphas[n] = alpha
        if self.runtime is not None:
            self._decide(n, alpha, x)
        self.inputs[n] = x
        return x

    def _decide(self, n: int, alpha, x: torch.Tensor) -> None:
        """Ask the runtime about block n: True skips it on every row (its layers do not run), False runs
        it; B bools, some True (a runtime deciding per row, `skip.runtime.RowsRuntime`), or a (B,) bool
        mask on the device (`skip.device_runtime.DeviceRowsRuntime`: no host read), run it and make it the
        identity on those rows, as `position_skip` does."""
        decision = self.runtime.decide(n, alpha)
        if decision is True:
            self.idle.add(n)
        elif decision is not False:
            if self.pass_skip is self.position_skip:
                self.pass_skip = dict(self.position_skip)
            rows = decision if isinstance(decision, torch.Tensor) else torch.tensor(decision, device=x.device)  # (B,)
            self.pass_skip[n] = rows[:, None].expand(x.shape[:2])  # (B, T)

    def _router_inputs(self, n: int):
        """Block n's router reads the scores (B, T, n) and the float32 sources h_0..h_{n-1} (a (B, T, n, d) view,
        or n (B, T, d) tensors with autograd on); each state is cast and scored once per pass, when first read."""
        if not torch.is_grad_enabled():
            return self._grow_buffer(n)
        fs, pt = self.float_states, self.tensors
        while len(fs) < n:  # usually just h_{n-1}; the float() of a float32 state is the state itself
            fs.append(self.states[len(fs)].float())
            self.scores.append(source_scores(pt.queries, pt.bias[len(fs) - 1], fs[-1], pt.root))  # (B, T, P)
        scores = torch.stack([s[..., n - 2] for s in self.scores[:n]], dim=-1)  # (B, T, n): small
        return scores, fs[:n]

    def _grow_buffer(self, n: int):
        """Inference: the sources and their scores as views of one buffer each per pass, each state written once."""
        fs, pt = self.float_states, self.tensors
        if self.buffer is None:
            h0 = self.states[0]
            shape = (*h0.shape[:-1], self.n_blocks)
            self.buffer = (h0.new_empty(*shape, h0.shape[-1], dtype=torch.float32),
                           h0.new_empty(*shape, pt.queries.shape[0], dtype=torch.float32))
            for k, (f, sc) in enumerate(zip(fs, self.scores)):  # a replayed prefix's states, scored already
                self.buffer[0][..., k, :].copy_(f)
                self.buffer[1][..., k, :].copy_(sc)
        values, scores = self.buffer
        while len(fs) < n:
            k = len(fs)
            slot = values[..., k, :]  # (B, T, d)
            slot.copy_(self.states[k])
            fs.append(slot)
            self.scores.append(source_scores(pt.queries, pt.bias[k], slot, pt.root, out=scores[..., k, :]))  # (B, T, P)
        return scores[..., :n, n - 2], values[..., :n, :]

    def skipped_output(self, n: int, x: torch.Tensor) -> torch.Tensor:
        """h_n of skipped block n from x_n: the identity, or the learned shortcut when the retrofit has one
        (never with the side-channel off: the backbone's own ablation is the identity)."""
        return self.side_channel.skipped_output(n, x) if self.enabled else x

    def leave_block(self, n: int, hidden: torch.Tensor) -> torch.Tensor:
        """Called after block n's last layer with h_n; returns the h_n the stream continues with."""
        if self.replay is not None and n <= self.replay[0]:
            k, cap, identity = self.replay
            if n < k:
                return hidden  # placeholder flowing through un-run blocks; replaced at block k
            hidden = self.skipped_output(k, cap.inputs[k]) if identity else cap.states[k]
            self.states = cap.states[:k] + [hidden]
            self.float_states, self.scores = cap.float_states[:k], cap.scores[:k]
            self.inputs = {j: x for j, x in cap.inputs.items() if j <= k}
        else:
            if n in self.idle:  # skipped: `hidden` is x_n, passed through its layers unchanged
                hidden = self.skipped_output(n, hidden)
            self.states.append(hidden)
        if n == self.n_blocks:
            if self.capture:
                self.captured = Captured(self.states, self.float_states, self.scores, self.inputs)
            # Drop references so activations are not kept alive between passes.
            self.states, self.float_states, self.scores = [], [], []
            self.inputs, self.tensors, self.buffer = {}, None, None
        return hidden


class BlockLayer(nn.Module):
    """Wraps one frozen decoder layer; attribute lookups fall through to it.

    The family's loop reads attributes such as `attention_type` off each layer, so
    anything this wrapper does not define is looked up on the wrapped layer.

    The family's loop calls every wrapper at every step, so the wrapper keeps its own cost
    down: calling it runs `forward` directly (hooks belong on the wrapped layer, which is
    called the usual way), and the wrapped layer is also kept outside `_modules` for a
    plain attribute read.
    """

    def __init__(self, layer: nn.Module, block: int, is_first: bool, is_last: bool, depth_pass: DepthPass):
        super().__init__()
        self.layer = layer
        self.block = block
        self.is_first = is_first
        self.is_last = is_last
        object.__setattr__(self, "_depth_pass", depth_pass)  # not a submodule
        object.__setattr__(self, "_inner", layer)  # the same module as self.layer

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("layer"), name)

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        dp = self._depth_pass
        n = self.block
        if self.is_first:
            hidden_states = dp.enter_block(n, hidden_states)
        if n not in dp.idle:
            if dp.recompute and hidden_states.requires_grad and torch.is_grad_enabled():
                # The layer is frozen and deterministic (eval mode): recomputing it gives the same output.
                out = checkpoint(self._inner, hidden_states, *args, use_reentrant=False, **kwargs)
            else:
                out = self._inner(hidden_states, *args, **kwargs)
            if dp.pass_skip:
                mask = dp.pass_skip.get(n)
                if mask is not None:  # reference mode: identity at the skipped positions only
                    # every layer of the block passes x_n through there; the last also adds the shortcut
                    kept = dp.skipped_output(n, hidden_states) if self.is_last else hidden_states
                    h = torch.where(mask[..., None], kept, compat.layer_hidden(out))
                    out = compat.identity_output(h)
        else:
            if dp.replay is None and compat.layer_cache(kwargs) is not None:
                append_kv(self._inner, hidden_states, kwargs)  # later tokens still attend here
            out = compat.identity_output(hidden_states)
        if self.is_last:
            h = compat.layer_hidden(out)
            h_next = dp.leave_block(n, h)
            if h_next is not h:
                out = compat.identity_output(h_next)
        return out

    __call__ = forward  # one call per layer per step: skip nn.Module's dispatch
