"""The retrofit's configuration: one dataclass, validated before any model is touched, and the
names of the two files an adapter is saved as (so that code which only locates adapters needs
neither torch nor safetensors)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config_fields import described
from ..errors import RetrofitConfigError

ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"

ACTIVATIONS = ("silu", "gelu", "relu")
SKIP_PATHS = ("identity", "shortcut")
# How the routed mix r_n enters block n (the first source document's recipe and its three rejected designs):
#   recipe       x_n = h_{n-1} + gamma_n A_n(r_n - h_{n-1})
#   observer     x_n = h_{n-1}: alpha is computed and trained but never changes the forward pass
#   interpolate  x_n = (1 - gamma_n) h_{n-1} + gamma_n r_n: no adapter, the same gate and curriculum
#   gamma_free   x_n = h_{n-1} + A_n(r_n - h_{n-1}) from step 0: no gate, no curriculum
VARIANTS = ("recipe", "observer", "interpolate", "gamma_free")


def check_rank(config: "RetrofitConfig", hidden_size: int) -> None:
    """The correction and the shortcut are bottlenecks: a rank above the hidden size d adds parameters and
    nothing a rank-d map could not do."""
    for name, rank in (("rank", config.rank), ("shortcut_rank", config.shortcut_rank)):
        if rank is not None and rank > hidden_size:
            raise RetrofitConfigError(f"{name} {rank} exceeds the model's hidden size {hidden_size}: a low-rank "
                                      f"map has rank at most {hidden_size}")


def default_rank(hidden_size: int) -> int:
    """Adapter rank when none is given: the source design's 256 from d >= 1024, 64 below.

    A rank of 256 on a d=576 model would be almost half of d; 64 keeps the
    adapter a bottleneck on small backbones.
    """
    return 256 if hidden_size >= 1024 else 64


@dataclass
class RetrofitConfig:
    """What AR-Retrofit adds to a frozen backbone. Each field's help text (`config_fields.described`) is what the
    command line's help and docs/guide.md's table say of it.

    `variant`: only the recipe and `observer` are the backbone exactly at c = 0; `interpolate` is at c = 0 too
    (gamma = 0); `gamma_free` is not (it has no gate), which is the design's point.
    """

    block_size: int = described(4, "layers per block when boundaries are not given (sizes balanced to differ by at "
                                   "most one when it does not divide the layer count)")
    boundaries: list[int] | None = described(None, "explicit first layer of every block after the first, e.g. [4, 8, "
                                                   "12] for 16 layers")
    rank: int | None = described(None, "rank of the correction A_n (null: 256 for d >= 1024, else 64)")
    activation: str = described("silu", "sigma in A_n(u) = W_up sigma(W_down u): silu, gelu or relu")
    up_init_std: float = described(1e-3, "std of W_up at init: small but nonzero, so gradients reach W_down from the "
                                         "first step the gate opens")
    prev_logit_init: float = described(2.0, "initial routing logit of h_{n-1} over every other source's 0: a mild "
                                            "peak on n-1, not one-hot")
    router_init_std: float = described(0.02, "std of the router query w_n at init")
    skip_path: str = described("identity", "what replaces a skipped block n in 2..N-1: identity (h_n = x_n, the "
                                           "source design's) or shortcut (h_n = x_n + S_n(x_n), low rank, zero at "
                                           "init; the training recipe's); the skipped layers' K/V still come from x_n",
                               choices=("identity", "shortcut"))
    shortcut_rank: int | None = described(None, "rank of S_n (null: the correction's rank)")
    variant: str = described("recipe", "how r_n enters block n: recipe, or one of the source design's rejected "
                                       "designs (observer, interpolate, gamma_free; `reskip experiment variants`)",
                             choices=VARIANTS)
    inner_lora: int = described(0, "trainable parameters of a LoRA inside the frozen blocks (every linear projection "
                                   "of the decoder layers, ranks dealt evenly), trained with the side-channel; 0: none")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise RetrofitConfigError(f"block_size must be a positive integer, got {self.block_size!r}")
        if self.rank is not None and (not isinstance(self.rank, int) or self.rank <= 0):
            raise RetrofitConfigError(f"rank must be a positive integer (or None for the default), got {self.rank!r}")
        if self.activation not in ACTIVATIONS:
            raise RetrofitConfigError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.boundaries is not None:
            b = list(self.boundaries)
            if any(not isinstance(x, int) for x in b) or b != sorted(set(b)) or (b and b[0] <= 0):
                raise RetrofitConfigError(
                    f"boundaries must be strictly increasing positive layer indices, got {self.boundaries!r}"
                )
        if self.skip_path not in SKIP_PATHS:
            raise RetrofitConfigError(f"skip_path must be one of {SKIP_PATHS}, got {self.skip_path!r}")
        if self.variant not in VARIANTS:
            raise RetrofitConfigError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.shortcut_rank is not None and (not isinstance(self.shortcut_rank, int) or self.shortcut_rank <= 0):
            raise RetrofitConfigError(f"shortcut_rank must be a positive integer (or None: the correction's rank), "
                                      f"got {self.shortcut_rank!r}")
        if not isinstance(self.inner_lora, int) or isinstance(self.inner_lora, bool) or self.inner_lora < 0:
            raise RetrofitConfigError(f"inner_lora must be a whole number of parameters >= 0, got {self.inner_lora!r}")
        if not self.up_init_std > 0:
            raise RetrofitConfigError("up_init_std must be > 0: W_up starts small but nonzero")

    def resolved_rank(self, hidden_size: int) -> int:
        return self.rank if self.rank is not None else default_rank(hidden_size)

    def resolved_shortcut_rank(self, hidden_size: int) -> int | None:
        """The shortcut's rank, or None when skipped blocks are the identity."""
        if self.skip_path != "shortcut":
            return None
        return self.shortcut_rank if self.shortcut_rank is not None else self.resolved_rank(hidden_size)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RetrofitConfig":
        reject_unknown_keys(cls, data, "retrofit config", RetrofitConfigError)
        return cls(**data)


def reject_unknown_keys(cls, data: dict, what: str, error: type[Exception]) -> None:
    """One clear error, listing the valid keys, for keys of `data` that are not fields of dataclass `cls`."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise error(f"unknown {what} keys {unknown}; known keys: {sorted(known)}")
