"""Step-zero parity: with c = 0 the retrofitted model's logits equal the backbone's, bit for bit."""

from __future__ import annotations

import torch
from torch import nn

from .config import RetrofitConfig
from .model import retrofit

# Mixed lengths so the batch needs padding; prose, dialogue and code like the training mix.
PARITY_TEXTS = (
    "The residual stream carries every layer's contribution forward, diluted but never erased.",
    "User: What's the capital of France?\nAssistant: Paris.",
    "def add(a, b):\n    return a + b\n",
)


def tokenize_batch(tokenizer, texts=PARITY_TEXTS, device="cpu") -> dict:
    """Left-padded batch (the padding generation uses); pad = eos when the tokenizer has none."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    batch = tokenizer(list(texts), return_tensors="pt", padding=True)
    return {k: v.to(device) for k, v in batch.items()}


@torch.no_grad()
def check_parity(
    base_model: nn.Module, inputs: dict, config: RetrofitConfig | None = None
) -> dict:
    """Logits of the untouched backbone vs the retrofit at c = 0, padded batch and unpadded rows.

    The side-channel runs in full (routers, adapters, gates); only c(t) = 0. The model
    is unretrofitted afterwards. Returns {'max_abs_diff', 'equal', 'tokens', 'padded_rows'}.
    """
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    # Each row alone and unpadded, then the padded batch.
    cases = [({"input_ids": ids[i : i + 1, mask[i].bool()]}, None) for i in range(ids.shape[0])]
    cases.append(({"input_ids": ids, "attention_mask": mask}, mask.bool()))
    refs = [base_model(**kw, use_cache=False).logits for kw, _ in cases]
    model = retrofit(base_model, config)
    try:
        model.set_curriculum(0.0)
        outs = [model(**kw, use_cache=False).logits for kw, _ in cases]
    finally:
        model.unretrofit()
    max_diff, equal = 0.0, True
    for (_, valid), ref, out in zip(cases, refs, outs):
        if valid is not None:  # padded positions carry no meaning; compare real tokens only
            ref, out = ref[valid], out[valid]
        equal &= torch.equal(ref, out)
        max_diff = max(max_diff, (ref.float() - out.float()).abs().max().item())
    return {
        "max_abs_diff": max_diff,
        "equal": bool(equal),
        "tokens": int(mask.sum().item()),
        "padded_rows": int((mask == 0).any(dim=1).sum().item()),
        "n_blocks": model.n_blocks,
        "rank": model.rank,
    }
