"""Shared test helpers: tiny random backbones of every supported family built in the test (no downloads),
a tiny saved model with its tokenizer, a random-word corpus, a tiny trained run."""

from __future__ import annotations

import importlib.util
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

VOCAB = 96
COMMON = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
)


def _gemma3():
    cfg = Gemma3TextConfig(
        **{**COMMON, "num_key_value_heads": 1}, head_dim=8, sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
    )
    return Gemma3ForCausalLM(cfg)


FAMILIES = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**COMMON)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**COMMON)),
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=8)),
    "mistral": lambda: MistralForCausalLM(MistralConfig(**COMMON, sliding_window=5)),
    "gemma3": _gemma3,
}


def tiny_model(family: str = "llama", dtype=torch.float32, seed: int = 0, init_std: float | None = None):
    """init_std: re-draw every weight matrix with this std. HF's default (0.02) leaves a
    tiny model's attention nearly uniform, too insensitive for tests of what it attends to."""
    torch.manual_seed(seed)
    model = FAMILIES[family]()
    if init_std is not None:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, init_std)
    return model.to(dtype).eval()


def batch(seed: int = 1, bsz: int = 3, seq: int = 12, pad: bool = True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (bsz, seq), generator=g)
    mask = torch.ones_like(ids)
    if pad:  # left padding of different lengths, as generation batches use
        for i in range(1, bsz):
            mask[i, : 2 * i] = 0
    return ids, mask


def has_package(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


# A chat template in the tiny vocabulary: w2 opens a user's turn, w3 an assistant's, w4 a system's; w1 (the
# end-of-sequence token) ends every turn, as <|im_end|> does SmolLM2's
TINY_CHAT_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}w2 {% elif m['role'] == 'system' %}w4 "
                      "{% else %}w3 {% endif %}{{ m['content'] }} w1 {% endfor %}"
                      "{% if add_generation_prompt %}w3 {% endif %}")


def save_tiny(folder, family: str = "llama", seed: int = 0, chat: bool = False):
    """A tiny random model + a word-level tokenizer (words w0..w94) saved like a real checkpoint; with `chat`, the
    tokenizer has a chat template (`TINY_CHAT_TEMPLATE`) and a pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = tiny_model(family, seed=seed)
    vocab = {f"w{i}": i for i in range(VOCAB - 1)}
    vocab["[UNK]"] = VOCAB - 1
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="w1",
                                   **({"pad_token": "w1", "chat_template": TINY_CHAT_TEMPLATE} if chat else {}))
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def write_corpus(folder, n_docs: int = 120, seed: int = 0):
    """Plain-text documents of random words (a few thousand tokens), one file each."""
    import random

    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n_docs):
        words = " ".join(f"w{rng.randrange(2, VOCAB - 1)}" for _ in range(rng.randrange(40, 120)))
        (folder / f"doc{i:03d}.txt").write_text(words)
    return folder


def tiny_trained_run(tmp, calibrate: list[str] | None = None, chat: bool = False):
    """A tiny llama trained 2 steps on a random-word corpus in tmp/run (and calibrated with `calibrate`'s
    extra flags when given): the run folder a command under test reads, in a few seconds. `chat`: its tokenizer has
    the tiny chat template."""
    from reskip.cli import main

    model_dir = save_tiny(tmp / "model", "llama", chat=chat)
    data_dir = write_corpus(tmp / "corpus", n_docs=300)
    run = tmp / "run"
    assert main(["train", "--model", str(model_dir), "--data", str(data_dir), "--seq-len", "16", "--steps", "2",
                 "--batch-size", "2", "--eval-every", "2", "--save-every", "2", "--eval-sequences", "2",
                 "--block-size", "2", "--rank", "8", "--quiet", "--out", str(run)]) == 0
    if calibrate is not None:
        assert main(["calibrate", "--adapter", str(run), "--sequences", "4", "--delta", "100", *calibrate]) == 0
    return run


def tiny_train_config(model, corpus, **overrides):
    """A TrainConfig of a few steps on a tiny model and corpus (float32, blocks of one layer): the trained arms and
    runs of the tests, each changing what it needs."""
    from reskip.train_config import TrainConfig

    base = dict(model=str(model), data=[str(corpus)], seq_len=16, steps=2, batch_size=2, eval_every=2, save_every=2,
                eval_sequences=2, lr=1e-2, dtype="float32", retrofit={"block_size": 1, "rank": 8})
    return TrainConfig(**{**base, **overrides})
