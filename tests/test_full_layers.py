"""Healing capacity beyond a LoRA: the kept layers next to the cut and the final norm trained in full (PEFT's
modules_to_save, float32 master weights), chosen by structure, the teacher still the backbone bit for bit, saved,
resumed, loaded and exported through the one adapter path."""

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import save_tiny, tiny_model, tiny_train_config, write_corpus
from reskip import compat
from reskip.cli import main
from reskip.compress.blocks import prune_keeping
from reskip.compress.full_layers import full_copies, layers_next_to_cut, train_in_float32
from reskip.compress.healing_run import HealingConfig, load_healed_model
from reskip.compress.lora import add_lora
from reskip.compress.objectives import HealingObjective
from reskip.compress.train import train_lora
from reskip.errors import ReskipError
from reskip.lora_ranks import full_module_names, matched_lora_config


def test_the_layers_next_to_the_cut_are_the_nearest_kept_ones_after_before_before():
    # layers 16-19 of 30 removed: layer 20 (index 16 once pruned), then 15, then 21
    assert layers_next_to_cut(30, [16, 17, 18, 19], 1) == [16]
    assert layers_next_to_cut(30, [16, 17, 18, 19], 2) == [15, 16]
    assert layers_next_to_cut(30, [16, 17, 18, 19], 3) == [15, 16, 17]
    assert layers_next_to_cut(30, [8, 9, 10, 11, 16, 17, 18, 19], 2) == [8, 12]  # after each of the two cuts
    assert layers_next_to_cut(6, [5], 1) == [4]  # nothing after the last layer: the one before it
    for bad in ((30, [], 1), (6, [2], 0), (6, [2], 6)):
        with pytest.raises(ReskipError, match="layers next to the cut"):
            layers_next_to_cut(*bad)


def _arm_model(dtype=torch.float32):
    model = tiny_model("llama", dtype, init_std=0.2)
    ids = torch.randint(3, 90, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = model(input_ids=ids, use_cache=False).logits
    removed = prune_keeping(model, {2, 3})
    full = layers_next_to_cut(6, [2, 3], 1)
    names = full_module_names(model, full)
    config, _ = matched_lora_config(model, 2_000, full)
    assert list(config.modules_to_save) == names  # the layers and the norm, by their exact names
    peft = add_lora(model, config)
    return peft, removed, ids, whole, full, names


def test_the_full_layers_start_as_the_model_exactly_and_the_teacher_is_the_backbone():
    peft, removed, ids, whole, full, names = _arm_model()
    assert full == [2] and names == ["model.layers.2", "model.norm"]
    # no LoRA on the layer trained in full: its projections are plain, the others carry the ranks
    layer = compat.decoder_layers(peft.get_base_model())[2]
    assert not any("lora" in n for n, _ in layer.named_parameters())
    params = train_in_float32(peft)
    assert len(full_copies(peft)) == 2 and all(p.dtype == torch.float32 and p.requires_grad for p in params)
    with torch.no_grad():
        for p in params:  # a trained copy that has moved
            p.add_(torch.randn_like(p) * 0.05)
    objective = HealingObjective(peft, "kd", removed=removed)
    with objective.teacher():
        assert torch.equal(peft(input_ids=ids, use_cache=False).logits, whole)  # the originals, not the copies
    with torch.no_grad():
        assert not torch.allclose(peft(input_ids=ids, use_cache=False).logits, whole)


def test_float32_copies_compute_between_bfloat16_layers():
    peft, removed, ids, *_ = _arm_model(torch.bfloat16)
    before = peft(input_ids=ids, use_cache=False).logits
    train_in_float32(peft)
    after = peft(input_ids=ids, use_cache=False).logits
    assert after.dtype == torch.bfloat16  # the head still reads the model's dtype
    assert (after.float() - before.float()).abs().max() < 0.1  # the same model, computed at float32 in two places
    loss = HealingObjective(peft, "kd", removed=removed)(ids, ids, ids.numel(), ids.numel())["loss"]
    loss.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for c in full_copies(peft)
               for p in c.parameters())


def test_an_arm_with_full_layers_trains_resumes_loads_and_exports(tmp_path):
    model, corpus = save_tiny(tmp_path / "model", "llama"), write_corpus(tmp_path / "corpus", n_docs=200)
    cfg = tiny_train_config(model, corpus, steps=4, dtype="bfloat16")
    arm = HealingConfig(params=2_000, drop_layers=[2, 3], drop_blocks=[2], objective="kd", full_layers=1)
    summary = train_lora(cfg, arm, tmp_path / "arm", show_progress=False)
    assert summary["lora"]["full_layers"] == [2] and summary["lora"]["full_parameters"] > 0
    assert summary["kl_full"]["end"] < summary["kl_full"]["start"]
    # stopped after its step-2 checkpoint, resumed: the float32 master weights and their optimizer state come back
    stopped = tmp_path / "stopped"
    shutil.copytree(tmp_path / "arm", stopped)
    for name in ("adapter", "summary.json", "checkpoints/step-000004"):
        shutil.rmtree(stopped / name) if (stopped / name).is_dir() else (stopped / name).unlink()
    (stopped / "checkpoints" / "latest").write_text("step-000002")
    train_lora(cfg, arm, stopped, show_progress=False)
    weights = "adapter/adapter_model.safetensors"
    assert (stopped / weights).read_bytes() == (tmp_path / "arm" / weights).read_bytes()
    in_project, _ = load_healed_model(tmp_path / "arm", "float32")
    assert main(["export", str(tmp_path / "arm"), "--out", str(tmp_path / "out")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    assert exported.config.num_hidden_layers == 4
    ids = torch.randint(3, 90, (2, 12))
    with torch.no_grad():
        a, b = exported(input_ids=ids).logits, in_project(input_ids=ids).logits
    assert (a - b).abs().max().item() < 1e-3


def test_full_layers_need_a_cut():
    with pytest.raises(ReskipError, match="needs drop_layers"):
        HealingConfig(params=2_000, full_layers=1).check("config.yaml")
