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
from ..chat.prompt_sets import PromptSet
from ..chat.sampling import Sampling, write_all
from ..chat.template import end_of_turn_ids
from ..data.packing import pack
from ..data.sources import load_splits
from ..skip.spec import Spec
from .chat_fidelity import BATCH, REPLY_TOKENS, chat_rows, chat_summary, original_replies
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
              show=print, split: str = "test") -> dict[str, dict]:
        """split name -> the evaluator's rows, on `sequences` sequences of `seq_len` tokens of each source (data
        specs) from their `split` (test for figures; val where settings are chosen)."""
        out = {}
        for name, specs in sources.items():
            docs, record = load_splits(list(specs))
            data = pack(self.tokenizer, docs[split], seq_len, sequences, seed=0)
            show(f"scoring {len(methods)} models on {len(data)} sequences of {name} ({split} split)")
            rows = evaluate_methods(self.reference, data, methods, window=1, chunk_size=seq_len)
            out[name] = {"data": list(specs), "test_split": record["splits"][split], "split": split, "rows": rows}
        return out

    def chat(self, methods: list[Method], prompts: PromptSet, max_new_tokens: int = REPLY_TOKENS,
             show_progress: bool = True, show=print) -> dict:
        """Chat fidelity (`chat_fidelity`) of the backbone's row and the model methods against the original's own
        greedy replies to `prompts`; load the reference in float32 for it (greedy agreement in bfloat16 measures
        rounding too)."""
        tok = self.tokenizer
        with self.reference.backbone_only() as original:
            replies = original_replies(original, tok, prompts, max_new_tokens, show_progress=show_progress)
        texts, stops = replies.texts(tok), end_of_turn_ids(tok)

        def write(m: Method):
            show(f"chat: {m.name} answers {len(texts)} prompts")
            return write_all(m.scorer.model, tok, texts, Sampling(max_new_tokens=max_new_tokens), stops,
                             batch_size=BATCH, desc=f"chat: {m.name}", show_progress=show_progress)

        return chat_summary(replies, tok, chat_rows(self.reference, tok, replies, methods, write, show=show))
