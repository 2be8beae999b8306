"""The suite's fixtures; the helpers they use live in `helpers`, which tests import directly."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from helpers import FAMILIES, save_tiny, write_corpus


@pytest.fixture(params=sorted(FAMILIES))
def family(request):
    return request.param


@pytest.fixture(scope="session")
def smollm2():
    """The real bundled backbone (fp32), loaded once per session."""
    from reskip.backbones.loading import load_backbone

    return load_backbone(None, torch.float32)


@pytest.fixture
def tiny_run(tmp_path):
    """A TrainConfig factory for a tiny llama on a random-word corpus (4 steps of 4 x 16 tokens); keys override."""
    from reskip.train_config import TrainConfig

    model_dir = save_tiny(tmp_path / "model", "llama")
    data_dir = write_corpus(tmp_path / "corpus")

    def config(**kw):
        base = dict(model=str(model_dir), data=[str(data_dir)], seq_len=16, steps=4, batch_size=4,
                    eval_every=2, save_every=2, eval_sequences=4, lr=1e-2, retrofit={"block_size": 2, "rank": 8})
        base.update(kw)
        return TrainConfig(**base)

    return config
