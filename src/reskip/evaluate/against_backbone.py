"""Models of their own (`lora:`, `healed:`, `nested:`, `export:` methods) scored against the backbone they came
from, without a retrofit run: the reference is the backbone wrapped at c = 0 (the retrofit there *is* the backbone,
bit for bit; its side-channel is never used), scored by the one evaluator (`evaluate.methods`) on the test split of
some data and on held-out sources. For `reskip compress` and the experiments that train no recipe."""

from __future__ import annotations

from dataclasses import dataclass

from ..ar_retrofit.config import RetrofitConfig
from ..ar_retrofit.model import ReskipModel, retrofit
from ..backbones.devices import device_name, model_device
from ..backbones.dtypes import resolve_dtype_name
from ..backbones.loading import load_backbone
from ..data.packing import pack
from ..data.sources import load_splits
from ..skip.spec import Spec
from .methods import Method, evaluate_methods, open_scorers
from .scorers import ScorerContext


@dataclass
class Reference:
    """The backbone as the reference of the evaluation (`reference`, a retrofit at c = 0), its tokenizer, and the
    context that opens the models scored against it."""

    reference: ReskipModel
    tokenizer: object
    context: ScorerContext

    @classmethod
    def load(cls, model: str | None, dtype: str, device: str, trust_remote_code: bool, block_size: int) -> "Reference":
        backbone, tok = load_backbone(model, dtype, trust_remote_code, device)
        reference = retrofit(backbone, RetrofitConfig(block_size=block_size, skip_path="identity"))
        reference.set_curriculum(0.0)  # the backbone, bit for bit
        ctx = ScorerContext(model, resolve_dtype_name(next(backbone.parameters()).dtype),
                            device_name(model_device(backbone)), trust_remote_code,
                            [list(b) for b in reference.blocks], lambda: None)
        return cls(reference, tok, ctx)

    def methods(self, specs: dict[str, Spec]) -> list[Method]:
        """The backbone's row and one row per spec (name -> a model method), their models opened."""
        methods = [Method("backbone", None, Spec("backbone", "backbone"))]
        methods += [Method(name, None, spec) for name, spec in specs.items()]
        open_scorers(methods, self.context)
        return methods

    def score(self, methods: list[Method], sources: dict[str, list[str]], sequences: int, seq_len: int,
              show=print) -> dict[str, dict]:
        """split name -> the evaluator's rows, on `sequences` test sequences of `seq_len` tokens of each source
        (data specs; their test split)."""
        out = {}
        for name, specs in sources.items():
            docs, record = load_splits(list(specs))
            data = pack(self.tokenizer, docs["test"], seq_len, sequences, seed=0)
            show(f"scoring {len(methods)} models on {len(data)} sequences of {name}")
            rows = evaluate_methods(self.reference, data, methods, window=1, chunk_size=seq_len)
            out[name] = {"data": list(specs), "test_split": record["splits"]["test"], "rows": rows}
        return out
