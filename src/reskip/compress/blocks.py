"""Static pruning of the frozen backbone, as a user would do it before healing: rank the blocks by what
removing each costs on the calibration split, drop the cheapest, and keep a plain model of fewer layers.

The ranking is the backbone's own (no side-channel): the retrofit at c = 0 *is* the backbone bit for bit, so its
calibration pass with the identity skip path measures A(n) = ppl(block n removed) / ppl(backbone) and
ShortGPT's block influence (mean cos(input, output) of the block) in one pass per block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import compat
from ..ar_retrofit.blocks import retrofit_blocks
from ..ar_retrofit.config import RetrofitConfig
from ..ar_retrofit.model import retrofit
from ..backbones.devices import model_device
from ..data.packing import Packed
from ..errors import ReskipError
from ..skip.ablation import measure_blocks

RANKINGS = ("ppl", "kl", "influence")  # how the cheapest blocks are chosen (`BlockCosts.cheapest`)


@dataclass
class BlockCosts:
    """The backbone's blocks (layer indices per block) and, per block n (1-based), A(n) (perplexity with block n
    removed / without), the same ablation read as KL(backbone || block n removed) per position, and cos(x_n, h_n)
    (ShortGPT's block influence is 1 - cos; the angular distance of the block's input and output, arccos(cos) / pi,
    ranks the blocks the same way)."""

    blocks: list[list[int]]
    A: dict[int, float]
    cos_in_out: dict[int, float]
    kl: dict[int, float] | None = None

    def middle(self) -> list[int]:
        """The blocks static pruning may drop: every block but the first and the last (the retrofit's skip branch
        draws from the same set)."""
        return list(range(2, len(self.blocks)))

    def ranked(self, by: str = "ppl") -> list[int]:
        """The middle blocks, cheapest to remove first: by A(n) (`ppl`), by KL to the backbone (`kl`), or by
        ShortGPT's block influence (`influence`: the output most like the input)."""
        if by == "kl" and self.kl is None:
            raise ReskipError("these block costs were measured without KL: measure them again")
        key = {"ppl": lambda n: self.A[n], "kl": lambda n: self.kl[n], "influence": lambda n: -self.cos_in_out[n]}[by]
        return sorted(self.middle(), key=key)

    def cheapest(self, k: int, by: str = "ppl") -> list[int]:
        """The k middle blocks cheapest to remove (`ranked`'s first k), sorted."""
        ranked = self.ranked(by)
        if k > len(ranked):
            raise ReskipError(f"cannot drop {k} blocks: the model has {len(ranked)} middle blocks")
        return sorted(ranked[:k])

    def most_similar(self, k: int) -> list[int]:
        """ShortGPT's choice: the k middle blocks whose output is most like their input."""
        return sorted(sorted(self.middle(), key=lambda n: -self.cos_in_out[n])[:k])

    def layers_of(self, blocks: list[int]) -> set[int]:
        return {layer for n in blocks for layer in self.blocks[n - 1]}

    def blocks_within(self, layers: list[int]) -> list[int]:
        """The blocks (1-based) whose every layer is among `layers`: what a cut of single layers removes whole."""
        return [n for n, held in enumerate(self.blocks, start=1) if set(held) <= set(layers)]

    def to_dict(self) -> dict:
        out = {"blocks": self.blocks, "A": {str(n): a for n, a in self.A.items()},
               "cos_in_out": {str(n): c for n, c in self.cos_in_out.items()}}
        return out if self.kl is None else {**out, "kl": {str(n): v for n, v in self.kl.items()}}

    @classmethod
    def from_dict(cls, d, where: str = "blocks.json") -> "BlockCosts":
        """The costs a file recorded, checked: a list of blocks (lists of layers) and, per block number, A(n),
        cos(x_n, h_n) and (when measured) the KL; anything else is one error naming the file."""
        def per_block(key: str, n: int) -> dict[int, float]:
            values = d.get(key)
            ok = isinstance(values, dict) and len(values) == n and all(
                str(k).isdigit() and 1 <= int(k) <= n and isinstance(v, (int, float)) and not isinstance(v, bool)
                and math.isfinite(v) for k, v in values.items())
            if not ok:
                raise ReskipError(f"{where}: {key} must hold a finite number for each of the {n} blocks; the file was "
                                  "edited or cut: delete it and rerun (the block costs are measured again)")
            return {int(k): float(v) for k, v in values.items()}

        blocks = d.get("blocks") if isinstance(d, dict) else None
        if not (isinstance(blocks, list) and blocks and all(isinstance(b, list) and b and all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in b) for b in blocks)):
            raise ReskipError(f"{where}: blocks must be a list of the blocks' layers; the file was edited or cut: "
                              "delete it and rerun (the block costs are measured again)")
        n = len(blocks)
        return cls(blocks, per_block("A", n), per_block("cos_in_out", n), per_block("kl", n) if "kl" in d else None)


def backbone_block_costs(model: nn.Module, data: Packed, block_size: int, boundaries: list[int] | None = None,
                         batch_size: int = 4, progress=None) -> BlockCosts:
    """A(n) and cos(x_n, h_n) of the backbone's blocks on `data` (the calibration split). The model is wrapped
    for the measurement and given back unwrapped."""
    n_layers = len(compat.decoder_layers(model))
    wrapped = retrofit(model, RetrofitConfig(block_size=block_size, boundaries=boundaries, skip_path="identity"))
    try:
        wrapped.set_curriculum(0.0)  # the backbone, bit for bit
        m = measure_blocks(wrapped, data, window=1, batch_size=batch_size, progress=progress)
    finally:
        wrapped.unretrofit()
    blocks = [list(b) for b in retrofit_blocks(n_layers, block_size, boundaries)]
    a = {n: math.exp((m.ce_skip[n] - m.ce_full) / m.n_targets) for n in range(1, len(blocks) + 1)}
    cos = {n: m.cos_sum[n] / m.positions for n in range(1, len(blocks) + 1)}
    kl = {n: m.kl_skip[n] / m.positions for n in range(1, len(blocks) + 1)}
    return BlockCosts(blocks, a, cos, kl)


def prune(model: nn.Module, layers: set[int]) -> nn.Module:
    """Remove these decoder layers from the model in place (`compat.remove_layers`); returns it."""
    compat.remove_layers(model, set(layers))
    return model


def prune_keeping(model: nn.Module, layers: set[int]) -> compat.RemovedLayers:
    """Remove these decoder layers in place and keep them, so that the unpruned backbone can run again as the
    teacher of healing by distillation (`compat.layers_put_back`) without a second copy of its weights."""
    return compat.remove_layers(model, set(layers))


@dataclass
class LayerDistances:
    """Gromov et al.'s angular distance between the inputs of the backbone's layers: d[a][b] = arccos(cos(x_a, x_b))
    / pi, per token, averaged over the calibration positions (x_l: the input of layer l, (B, T, d)). A run of n
    layers starting at l is cheap to remove when x_l and x_(l+n) point the same way."""

    d: list[list[float]]  # (L, L), upper triangle filled

    def cheapest_run(self, n: int) -> list[int]:
        """The n consecutive layers whose removal changes the residual stream's direction least, never the first
        layer nor the last (the blocks' rule: their first and last blocks are never dropped)."""
        n_layers = len(self.d)
        starts = range(1, n_layers - n)
        if not starts:
            raise ReskipError(f"no run of {n} layers between the first and the last of {n_layers}")
        best = min(starts, key=lambda start: self.d[start][start + n])
        return list(range(best, best + n))

    def cheapest_single(self, n: int) -> list[int]:
        """The n layers, each one alone the cheapest by d(x_l, x_(l+1)), first and last excluded."""
        inner = range(1, len(self.d) - 1)
        return sorted(sorted(inner, key=lambda layer: self.d[layer][layer + 1])[:n])


@torch.no_grad()
def layer_distances(model: nn.Module, data: Packed, batch_size: int = 4) -> LayerDistances:
    """Every pair of the backbone's layer inputs on `data`, from one pass per batch (the layers' inputs are the
    model's hidden states 0..L-1; the L-th is after the final norm and is not a layer's input)."""
    n_layers = len(compat.decoder_layers(model))
    device = model_device(model)
    sums = torch.zeros(n_layers, n_layers, dtype=torch.float64, device=device)  # summed on the device, read once
    positions = 0
    for ids, _ in data.batches(batch_size, device):
        states = model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
        xs = [F.normalize(h.float(), dim=-1) for h in states[:n_layers]]  # L x (B, T, d)
        for a in range(n_layers):
            for b in range(a + 1, n_layers):
                cos = (xs[a] * xs[b]).sum(-1).clamp(-1.0, 1.0)  # (B, T)
                sums[a, b] += (torch.arccos(cos) / math.pi).double().sum()
        positions += ids.numel()
    return LayerDistances((sums / positions).cpu().tolist())
