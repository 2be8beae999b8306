"""A LoRA inside the frozen blocks, carried by the retrofit (`RetrofitConfig.inner_lora`): the backbone exactly at
the start, switched off with the side-channel for the teacher, counted, saved and loaded with the adapter, and
trained by the recipe's loop."""

import pytest
import torch
from safetensors import safe_open

from helpers import batch, tiny_model
from reskip import RetrofitConfig, retrofit
from reskip.ar_retrofit.accounting import count_params
from reskip.ar_retrofit.model import load_adapter
from reskip.errors import RetrofitConfigError
from reskip.reading import read_json
from reskip.train.run import train_run


def _model(family="llama", inner=2000, seed=0):
    rm = retrofit(tiny_model(family, init_std=0.3, seed=seed),
                  RetrofitConfig(block_size=2, rank=8, up_init_std=0.3, inner_lora=inner))
    return rm


def _perturb_lora(rm):
    from reskip.ar_retrofit import inner_lora

    with torch.no_grad():
        for layer in inner_lora.lora_layers(rm.base_model):
            layer.lora_B["default"].weight.normal_(0, 0.3)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_a_fresh_inner_lora_is_the_backbone_and_the_teacher_switches_it_off(family):
    ids, mask = batch()
    base = tiny_model(family, init_std=0.3)
    with torch.no_grad():
        want = base(input_ids=ids, attention_mask=mask).logits
    rm = _model(family)
    rm.set_curriculum(0.0)
    with torch.no_grad():
        assert torch.equal(rm(input_ids=ids, attention_mask=mask).logits, want)
        _perturb_lora(rm)
        moved = rm(input_ids=ids, attention_mask=mask).logits
        with rm.side_channel_disabled():
            teacher = rm(input_ids=ids, attention_mask=mask).logits
        again = rm(input_ids=ids, attention_mask=mask).logits  # switched back on afterwards
    assert (moved - want).abs().max() > 1e-2 and torch.equal(teacher, want) and torch.equal(again, moved)
    assert all(p.requires_grad for p in rm.trainable_parameters())


def test_inner_lora_parameters_are_counted_and_matched():
    rm = _model(inner=2000)
    side = sum(p.numel() for p in rm.side_channel.parameters())
    lora = sum(p.numel() for p in rm.trainable_parameters()) - side
    # one rank on every projection of a tiny llama layer costs 512 (q, o: 32 + 32; k, v: 32 + 16; gate, up, down:
    # 32 + 64): the count lands within half of that
    assert lora == rm.lora_accounting["parameters"] and abs(lora - 2000) <= 256
    report = count_params(tiny_model().config, RetrofitConfig(block_size=2, rank=8, inner_lora=2000))
    assert report.inner_lora_params == lora and report.new_params == side + lora
    with pytest.raises(RetrofitConfigError, match="inner_lora"):
        RetrofitConfig(inner_lora=-1)


def test_the_adapter_saves_and_loads_the_inner_lora(tmp_path):
    ids, mask = batch()
    rm = _model()
    rm.set_curriculum(1.0)
    _perturb_lora(rm)
    with torch.no_grad():
        want = rm(input_ids=ids, attention_mask=mask).logits
    rm.save_adapter(tmp_path / "a")
    with safe_open(str(tmp_path / "a" / "adapter_model.safetensors"), "pt") as f:
        assert any(k.startswith("inner_lora.0.") for k in f.keys())
    loaded = load_adapter(tiny_model(init_std=0.3), tmp_path / "a")
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids, attention_mask=mask).logits, want)
    plain = loaded.unretrofit()  # the backbone's own modules back
    from torch import nn

    assert all(type(m) is nn.Linear for layer in plain.model.layers for m in layer.modules()
               if isinstance(m, nn.Linear))


def test_training_with_an_inner_lora_moves_it_and_resumes_exactly(tiny_run, tmp_path):
    from reskip.ar_retrofit import inner_lora
    from reskip.ar_retrofit.adapter_io import WEIGHTS_NAME

    cfg = tiny_run(retrofit={"block_size": 2, "rank": 8, "inner_lora": 3000})
    summary = read_json(train_run(tmp_path / "run", cfg, show_progress=False))
    assert summary["ppl_full"]["end"] < summary["ppl_full"]["start"]

    def crash(step, model):
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_run(tmp_path / "again", cfg, on_step_end=crash, show_progress=False)
    train_run(tmp_path / "again", cfg, resume=True, show_progress=False)
    assert (tmp_path / "run" / "adapter" / WEIGHTS_NAME).read_bytes() == (
        tmp_path / "again" / "adapter" / WEIGHTS_NAME).read_bytes()
    from reskip.backbones.loading import load_backbone

    rm = load_adapter(load_backbone(cfg.model, "float32")[0], tmp_path / "run" / "adapter")
    assert any(layer.lora_B["default"].weight.abs().max() > 0 for layer in inner_lora.lora_layers(rm.base_model))
