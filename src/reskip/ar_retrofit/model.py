"""`ReskipModel`: a frozen Hugging Face causal LM with the AR-Retrofit side-channel attached."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from .. import compat
from ..errors import AdapterError
from ..losses import token_entropy
from . import inner_lora
from .adapter_io import WEIGHTS_NAME, check_backbone, read_adapter_config, read_adapter_weights, save_adapter
from .blocks import retrofit_blocks
from .config import RetrofitConfig
from .depth_pass import BlockLayer, DepthPass
from .side_channel import SideChannel


@dataclass
class ReskipOutput(CausalLMOutputWithPast):
    """The usual causal-LM output plus, on request, each router's alpha.

    alphas: block n (2..N) -> (B, T, n) routing weights over sources h_0..h_{n-1}.
    """

    alphas: dict | None = None
    last_hidden_state: torch.Tensor | None = None  # (B, T, d), set by forward(hidden_only=True)


class ReskipModel(nn.Module):
    """The backbone (frozen, never modified) plus the side-channel (the only trainable part).

    Build it with `retrofit(model, config)`. The backbone's own `forward` and
    `generate` run unchanged; its decoder layers are wrapped in place.
    """

    def __init__(self, base_model: nn.Module, config: RetrofitConfig | None = None, seed: int = 0):
        super().__init__()
        config = config or RetrofitConfig()
        layers = compat.decoder_layers(base_model)
        if any(isinstance(layer, BlockLayer) for layer in layers):
            raise ValueError("this model is already retrofitted; call unretrofit() first")
        self.config = config
        self.seed = seed
        self.blocks = retrofit_blocks(len(layers), config.block_size, config.boundaries)
        hidden_size = base_model.config.hidden_size
        self.base_model = base_model
        base_model.requires_grad_(False)
        # a LoRA inside the blocks, before the layers are wrapped (B = 0: still the backbone exactly)
        self.lora_accounting = inner_lora.inject(base_model, config.inner_lora) if config.inner_lora else None
        layers = compat.decoder_layers(base_model)
        device = base_model.get_input_embeddings().weight.device
        self.side_channel = SideChannel(hidden_size, len(self.blocks), config, seed).to(device)
        self.depth_pass = DepthPass(self.side_channel, len(self.blocks))
        for n, block in enumerate(self.blocks, start=1):
            for i in block:
                layers[i] = BlockLayer(layers[i], n, i == block.start, i == block[-1], self.depth_pass)

    # ---- structure -------------------------------------------------------------------------
    @property
    def n_blocks(self) -> int:
        return len(self.blocks)

    @property
    def rank(self) -> int:
        return self.side_channel.rank

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The side-channel's parameters and the inner LoRA's, if any: chosen by structure (the modules we added),
        never by name."""
        extra = inner_lora.parameters(self.base_model) if self.lora_accounting else []
        return list(self.side_channel.parameters()) + extra

    def adapter_state(self) -> dict:
        """Every tensor the adapter saves: the side-channel's, and the inner LoRA's (`inner_lora.` names)."""
        state = dict(self.side_channel.state_dict())
        if self.lora_accounting:
            state.update(inner_lora.state_dict(self.base_model))
        return state

    def load_adapter_state(self, state: dict) -> None:
        """Load `adapter_state`'s tensors (strict: a missing or unexpected name raises KeyError or RuntimeError)."""
        side = {k: v for k, v in state.items() if not k.startswith(inner_lora.PREFIX)}
        lora = {k: v for k, v in state.items() if k.startswith(inner_lora.PREFIX)}
        if lora and not self.lora_accounting:
            raise KeyError(f"inner LoRA tensors ({next(iter(lora))}) for a retrofit without one")
        self.side_channel.load_state_dict(side)
        if self.lora_accounting:
            inner_lora.load_state_dict(self.base_model, lora)

    def unretrofit(self) -> nn.Module:
        """Put the original decoder layers back and return the untouched backbone."""
        layers = compat.decoder_layers(self.base_model)
        for i, layer in enumerate(layers):
            if isinstance(layer, BlockLayer):
                layers[i] = layer.layer
        if self.lora_accounting:
            inner_lora.remove(self.base_model)
        return self.base_model

    @contextlib.contextmanager
    def backbone_only(self):
        """The untouched backbone modules for the passes inside (no wrappers at all): the honest
        baseline for timing. The wrappers are put back afterwards."""
        layers = compat.decoder_layers(self.base_model)
        wrappers = list(layers)
        for i, w in enumerate(wrappers):
            layers[i] = w.layer
        try:
            yield self.base_model
        finally:
            for i, w in enumerate(wrappers):
                layers[i] = w

    # ---- switches ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def _depth_setting(self, name: str, value):
        """Set one DepthPass setting for the passes inside the context, then restore it."""
        previous = getattr(self.depth_pass, name)
        setattr(self.depth_pass, name, value)
        try:
            yield
        finally:
            setattr(self.depth_pass, name, previous)

    def set_curriculum(self, c: float) -> None:
        """Set c(t) in gamma_n = c(t) * g_n. At c = 0 the logits equal the backbone's exactly."""
        if not 0.0 <= float(c) <= 1.0:
            raise ValueError(f"curriculum c(t) must lie in [0, 1], got {c}")
        self.side_channel.curriculum = float(c)

    @contextlib.contextmanager
    def side_channel_disabled(self):
        """The teacher: the same weights with the side-channel switched off (no router runs), and the inner LoRA
        too: the frozen backbone exactly."""
        with self._depth_setting("enabled", False), (inner_lora.disabled(self.base_model) if self.lora_accounting
                                                     else contextlib.nullcontext()):
            yield self

    @contextlib.contextmanager
    def recomputing_layers(self, on: bool = True):
        """Activation checkpointing of the frozen layers for the passes inside: each layer keeps only
        its input for the backward pass and recomputes its own activations there (one more forward
        of the layers gradients flow through, for much less memory)."""
        with self._depth_setting("recompute", on):
            yield self

    @contextlib.contextmanager
    def blocks_skipped(self, *blocks: int):
        """Replace blocks (1-based) by identity for the passes inside the context."""
        bad = [n for n in blocks if not 1 <= n <= self.n_blocks]
        if bad:
            raise ValueError(f"blocks {bad} out of range: this model has blocks 1..{self.n_blocks}")
        with self._depth_setting("skip", frozenset(blocks) | self.depth_pass.skip):
            yield self

    @contextlib.contextmanager
    def capturing(self):
        """Keep the states and block inputs of the passes inside; yields a getter for the last one."""
        dp = self.depth_pass
        dp.capture, dp.captured = True, None
        try:
            yield lambda: dp.captured
        finally:
            dp.capture, dp.captured = False, None

    @contextlib.contextmanager
    def replaying(self, captured, skip_block: int):
        """Skip branch sharing a captured full pass: block `skip_block` as identity, blocks before it not
        recomputed (their states are the full pass's, autograd included), blocks after it run anew."""
        with self._replay(captured, skip_block, identity=True):
            yield self

    @contextlib.contextmanager
    def continuing(self, captured, after_block: int):
        """Start the passes inside from a captured pass's h_{after_block} (blocks up to it not rerun).

        Training uses it to share block 1, which has no side-channel, between teacher and full path."""
        with self._replay(captured, after_block, identity=False):
            yield self

    @contextlib.contextmanager
    def _replay(self, captured, block: int, identity: bool):
        if not 1 <= block <= self.n_blocks:
            raise ValueError(f"block {block} out of range 1..{self.n_blocks}")
        if captured is None:
            raise ValueError("nothing captured: run a pass inside capturing() first")
        with self._depth_setting("replay", (block, captured, identity)):
            yield

    @contextlib.contextmanager
    def skipping(self, policy, window: int, track_all: bool = False, on_device: bool | None = None):
        """Apply a skip policy (`reskip.skip.policies`) to every pass inside (scoring, chunks,
        `generate`); yields the runtime, whose `trace` records which blocks ran at each step, and
        w_recent for the blocks the policy reads (every block with `track_all`). A pass that starts
        with an empty cache starts a new sequence (history and trace reset). The policy builds its
        own runtime (`policy.runtime(window, track_all, on_device)`), so the retrofit needs no skip code.
        on_device: the runtime's windows on the model's device (None: `runtime_on_device`)."""
        with self.stepping(policy.runtime(window, track_all, self.runtime_on_device(on_device))) as runtime:
            yield runtime

    def runtime_on_device(self, asked: bool | None = None) -> bool:
        """Whether a skip runtime keeps its state where the routers' alpha is: as `asked`, else unless that is the
        CPU (where a host read costs nothing, so the host runtimes are the cheapest)."""
        if asked is not None:
            return asked
        return next(self.side_channel.parameters()).device.type != "cpu"

    @contextlib.contextmanager
    def stepping(self, runtime):
        """Hand every pass inside to `runtime`: before each forward it gets the step's (B, T) mask of
        real tokens and whether a new sequence starts (`set_step_mask`); each pass then calls its
        `begin_step(length)` and, before every block, `decide(n, alpha) -> skip?`."""

        def before_forward(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            length = (ids if ids is not None else kwargs["inputs_embeds"]).shape[1]
            cache = compat.layer_cache(kwargs)
            mask = kwargs.get("attention_mask")
            valid = mask[:, -length:].bool() if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None
            runtime.set_step_mask(valid, new_sequence=cache is None or cache.get_seq_length() == 0)

        handle = self.base_model.register_forward_pre_hook(before_forward, with_kwargs=True)
        try:
            with self._depth_setting("runtime", runtime):
                yield runtime
        finally:
            handle.remove()

    @contextlib.contextmanager
    def skipping_positions(self, masks: dict):
        """Reference mode (no cache): block n acts as identity exactly where masks[n] (B, T) is True."""
        with self._depth_setting("position_skip", dict(masks)):
            yield self

    # ---- running ----------------------------------------------------------------------------
    def forward(self, input_ids=None, attention_mask=None, labels=None, output_alphas: bool = False,
                hidden_only: bool = False, **kwargs):
        """Run the backbone's own forward; with `output_alphas`, attach every router's alpha. With
        `hidden_only`, run the family's decoder without its LM head: no logits, `last_hidden_state`
        (B, T, d) set instead (for training losses; not under `stepping`, whose hook is on the head model)."""
        dp = self.depth_pass
        dp.record_alphas = output_alphas
        try:
            if hidden_only:
                if labels is not None:
                    raise ValueError("hidden_only computes no logits, so it takes no labels")
                out = compat.decoder_body(self.base_model)(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
            else:
                out = self.base_model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs)
            alphas = dict(dp.alphas) if output_alphas else None
        finally:
            dp.record_alphas, dp.alphas = False, {}
        return ReskipOutput(**out, alphas=alphas)

    def generate(self, *args, **kwargs):
        return self.base_model.generate(*args, **kwargs)

    def save_adapter(self, path, metadata: dict | None = None):
        """Write adapter_config.json + adapter_model.safetensors into folder `path` (see `adapter_io`)."""
        return save_adapter(self, path, metadata)


def retrofit(model: nn.Module, config: RetrofitConfig | None = None, seed: int = 0) -> ReskipModel:
    """Attach the AR-Retrofit side-channel to a loaded causal LM (frozen in place)."""
    return ReskipModel(model, config, seed)


def load_adapter(base_model: nn.Module, path, strict_weights: bool = True, device=None) -> ReskipModel:
    """Retrofit `base_model` and load the saved side-channel of adapter folder `path` into it, on the backbone's
    device (moved to `device` first when given: a torch device or 'cpu', 'cuda', 'cuda:N'; for 'auto' see
    `backbones.devices.resolve_device`).

    Refuses another architecture, and other weights of the same architecture unless
    `strict_weights=False`."""
    path = Path(path)
    if device is not None:
        base_model.to(device)
    cfg = read_adapter_config(path)
    check_backbone(cfg["backbone"], base_model, strict_weights)
    state = read_adapter_weights(path)
    model = ReskipModel(base_model, RetrofitConfig.from_dict(cfg["retrofit"]), seed=cfg.get("seed", 0))
    expected = model.adapter_state()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    bad_shapes = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or unexpected or bad_shapes:
        model.unretrofit()
        raise AdapterError(
            f"{path / WEIGHTS_NAME} does not match its config (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}, wrong shape {bad_shapes[:3]})"
        )
    model.load_adapter_state(state)
    model.set_curriculum(cfg.get("curriculum", 1.0))
    return model


def alpha_entropy(alphas: dict, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean entropy of alpha over tokens and blocks (padding excluded): a scalar tensor."""
    per_block = []
    for alpha in alphas.values():  # (B, T, n)
        h = token_entropy(alpha)  # (B, T)
        if attention_mask is not None:
            m = attention_mask.to(h.dtype)
            per_block.append((h * m).sum() / m.sum().clamp_min(1))
        else:
            per_block.append(h.mean())
    return torch.stack(per_block).mean()
