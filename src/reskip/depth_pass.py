"""One forward pass through the blocks: layer wrappers and the per-pass depth state.

The family's own forward loop (masks, rotary, cache) runs unchanged; each decoder
layer is wrapped by `BlockLayer`, which tells the `DepthPass` when a block starts
(to apply the side-channel correction to its input) and when it ends (to record
h_n). A block replaced by identity passes its input through without running its
layers.
"""

from __future__ import annotations

import torch
from torch import nn

from . import compat
from .side_channel import SideChannel


class DepthPass:
    """Settings and state of the passes of one retrofitted model (a plain object, not a Module).

    enabled: False -> the side-channel is off and the model is the backbone (teacher).
    skip: blocks replaced by identity in the next passes.
    states: h_0..h_n of the current pass, each (B, T, d) in the backbone dtype.
    alphas: block n -> alpha (B, T, n) of the last pass, when `record_alphas`.
    """

    def __init__(self, side_channel: SideChannel, n_blocks: int):
        self.side_channel = side_channel
        self.n_blocks = n_blocks
        self.enabled = True
        self.skip: frozenset[int] = frozenset()
        self.record_alphas = False
        self.states: list[torch.Tensor] = []
        self.normed: list[torch.Tensor] = []
        self.alphas: dict[int, torch.Tensor] = {}

    def enter_block(self, n: int, hidden: torch.Tensor) -> torch.Tensor:
        """Called before block n's first layer with h_{n-1}; returns the block input x_n."""
        if n == 1:
            self.states, self.normed, self.alphas = [hidden], [], {}
        if n == 1 or not self.enabled:
            return hidden
        # RMSNorm(h_i) has no learned scale, so each source is normalised once per pass
        # and shared by every later router.
        while len(self.normed) < len(self.states):
            self.normed.append(SideChannel.normalize(self.states[len(self.normed)]))
        sources = torch.stack([h.float() for h in self.states[:n]], dim=-2)  # (B, T, n, d)
        normed = torch.stack(self.normed[:n], dim=-2)  # (B, T, n, d)
        delta, alpha = self.side_channel.block(n)(sources, normed, self.side_channel.curriculum)
        if self.record_alphas:
            self.alphas[n] = alpha
        return hidden + delta.to(hidden.dtype)

    def leave_block(self, n: int, hidden: torch.Tensor) -> None:
        """Called after block n's last layer with h_n."""
        self.states.append(hidden)
        if n == self.n_blocks:
            # Drop references so activations are not kept alive between passes.
            self.states, self.normed = [], []


class BlockLayer(nn.Module):
    """Wraps one frozen decoder layer; attribute lookups fall through to it.

    The family's loop reads attributes such as `attention_type` off each layer, so
    anything this wrapper does not define is looked up on the wrapped layer.
    """

    def __init__(self, layer: nn.Module, block: int, is_first: bool, is_last: bool, depth_pass: DepthPass):
        super().__init__()
        self.layer = layer
        self.block = block
        self.is_first = is_first
        self.is_last = is_last
        object.__setattr__(self, "_depth_pass", depth_pass)  # not a submodule

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("layer"), name)

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        dp = self._depth_pass
        if self.is_first:
            hidden_states = dp.enter_block(self.block, hidden_states)
        if self.block in dp.skip:
            out = compat.identity_output(hidden_states)
        else:
            out = self.layer(hidden_states, *args, **kwargs)
        if self.is_last:
            dp.leave_block(self.block, compat.layer_hidden(out))
        return out
