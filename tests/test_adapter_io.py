"""Adapter files: round trip, wrong backbone, corrupt files, nothing half-written."""

import json
import os

import pytest
import torch

from helpers import batch, tiny_model
from reskip import AdapterError, RetrofitConfig, load_adapter, retrofit
from reskip.ar_retrofit.adapter_io import CONFIG_NAME, WEIGHTS_NAME, fingerprint


def trained_adapter(tmp_path, family="llama"):
    model = tiny_model(family)
    rm = retrofit(model, RetrofitConfig(block_size=2, rank=8), seed=3)
    rm.set_curriculum(1.0)
    opt = torch.optim.AdamW(rm.trainable_parameters(), lr=1e-2)
    ids, mask = batch()
    rm(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
    opt.step()
    rm.save_adapter(tmp_path / "adapter")
    with torch.no_grad():
        logits = rm(input_ids=ids, attention_mask=mask).logits
    return tmp_path / "adapter", logits


def test_round_trip_gives_identical_logits(tmp_path, family):
    path, logits = trained_adapter(tmp_path, family)
    assert sorted(os.listdir(path)) == ["README.md", CONFIG_NAME, WEIGHTS_NAME]  # no temp files left behind
    cfg = json.loads((path / CONFIG_NAME).read_text())
    assert cfg["backbone"]["family"] == tiny_model(family).config.model_type
    assert cfg["rank"] == 8 and cfg["retrofit"]["block_size"] == 2
    rm = load_adapter(tiny_model(family), path)
    ids, mask = batch()
    with torch.no_grad():
        assert torch.equal(rm(input_ids=ids, attention_mask=mask).logits, logits)


def test_every_saved_adapter_has_a_model_card(tmp_path):
    """A bare ReskipModel.save_adapter writes README.md too: backbone and fingerprint, blocks, rank, the
    parameter count of the weights file, and how to load it (no training section without training metadata)."""
    path, _ = trained_adapter(tmp_path)
    card = (path / "README.md").read_text()
    cfg = json.loads((path / CONFIG_NAME).read_text())
    n = sum(p.numel() for p in retrofit(tiny_model(), RetrofitConfig(block_size=2, rank=8)).side_channel.parameters())
    assert card.startswith("---\nlibrary_name: reskip") and cfg["backbone"]["weights_digest"] in card
    assert f"{n:,} parameters" in card and "rank 8" in card and "load_adapter" in card
    assert "## Training" not in card and "## Calibrated" not in card


def test_weights_file_holds_side_channel_only(tmp_path):
    from safetensors.torch import load_file

    path, _ = trained_adapter(tmp_path)
    state = load_file(path / WEIGHTS_NAME)
    assert all(k.startswith("per_block.") for k in state)
    assert sum(v.numel() for v in state.values()) < 0.2 * sum(p.numel() for p in tiny_model().parameters())


def test_other_architecture_is_refused(tmp_path):
    path, _ = trained_adapter(tmp_path, "llama")
    with pytest.raises(AdapterError, match="another backbone"):
        load_adapter(tiny_model("qwen3"), path)


def test_other_weights_are_refused_unless_allowed(tmp_path):
    path, _ = trained_adapter(tmp_path, "llama")
    other = tiny_model("llama", seed=99)
    with pytest.raises(AdapterError, match="weights_digest"):
        load_adapter(other, path)
    load_adapter(other, path, strict_weights=False)


def test_fingerprint_does_not_depend_on_dtype_or_wrapping():
    model = tiny_model("llama")
    fp = fingerprint(model)
    assert fingerprint(tiny_model("llama", torch.bfloat16)) == fp
    retrofit(model)
    assert fingerprint(model) == fp


def test_truncated_weights_give_clear_error(tmp_path):
    path, _ = trained_adapter(tmp_path)
    data = (path / WEIGHTS_NAME).read_bytes()
    (path / WEIGHTS_NAME).write_bytes(data[: len(data) // 2])
    model = tiny_model("llama")
    with pytest.raises(AdapterError, match="truncated or corrupt"):
        load_adapter(model, path)
    assert type(model.model.layers[0]).__name__ == "LlamaDecoderLayer"  # left un-retrofitted


def test_corrupt_config_gives_clear_error(tmp_path):
    path, _ = trained_adapter(tmp_path)
    (path / CONFIG_NAME).write_text("{not json")
    with pytest.raises(AdapterError, match="corrupt"):
        load_adapter(tiny_model("llama"), path)


@pytest.mark.parametrize("mutate,said", [
    (lambda d: [d], "top level is a list"),
    (lambda d: {**d, "seed": "abc"}, "seed 'abc'"),
    (lambda d: {**d, "seed": 2**64}, "seed"),
    (lambda d: {**d, "curriculum": "x"}, "curriculum"),
    (lambda d: {**d, "retrofit": [1, 2]}, "must be objects"),
    (lambda d: {**d, "backbone": []}, "must be objects"),
    (lambda d: {**d, "retrofit": {**d["retrofit"], "inner_lora": -3}}, "inner_lora"),
])
def test_adapter_config_fields_are_checked_on_read(tmp_path, mutate, said):
    path, _ = trained_adapter(tmp_path)
    data = json.loads((path / CONFIG_NAME).read_text())
    (path / CONFIG_NAME).write_text(json.dumps(mutate(data)))
    with pytest.raises(AdapterError, match="corrupt or incomplete") as e:
        load_adapter(tiny_model("llama"), path)
    assert said in str(e.value)


def test_mismatched_tensors_give_clear_error(tmp_path):
    path, _ = trained_adapter(tmp_path)
    cfg = json.loads((path / CONFIG_NAME).read_text())
    cfg["retrofit"]["rank"] = 4
    (path / CONFIG_NAME).write_text(json.dumps(cfg))
    model = tiny_model("llama")
    with pytest.raises(AdapterError, match="does not match"):
        load_adapter(model, path)
    assert type(model.model.layers[0]).__name__ == "LlamaDecoderLayer"


def test_missing_folder_gives_clear_error(tmp_path):
    with pytest.raises(AdapterError, match="not an adapter folder"):
        load_adapter(tiny_model("llama"), tmp_path / "nope")


def test_failed_save_leaves_previous_files_intact(tmp_path, monkeypatch):
    path, _ = trained_adapter(tmp_path)
    before = (path / WEIGHTS_NAME).read_bytes()
    import reskip.ar_retrofit.adapter_io as io

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(io, "save_file", boom)
    rm = retrofit(tiny_model("llama"), RetrofitConfig(block_size=2, rank=8))
    with pytest.raises(RuntimeError):
        rm.save_adapter(path)
    assert (path / WEIGHTS_NAME).read_bytes() == before
    assert sorted(os.listdir(path)) == ["README.md", CONFIG_NAME, WEIGHTS_NAME]


def test_blocks_are_written_as_inclusive_layer_ranges(tmp_path):
    path, _ = trained_adapter(tmp_path)  # 6 layers in blocks of 2
    cfg = json.loads((path / CONFIG_NAME).read_text())
    assert cfg["format_version"] == 3 and cfg["blocks"] == [[0, 1], [2, 3], [4, 5]]


def test_an_adapter_written_before_inclusive_ranges_still_loads(tmp_path):
    """Format 1 wrote blocks as [start, stop); it loads unchanged and reads back as [first, last]."""
    from reskip.ar_retrofit.adapter_io import read_adapter_config

    path, logits = trained_adapter(tmp_path)
    cfg = json.loads((path / CONFIG_NAME).read_text())
    cfg["format_version"], cfg["blocks"] = 1, [[0, 2], [2, 4], [4, 6]]
    (path / CONFIG_NAME).write_text(json.dumps(cfg))
    assert read_adapter_config(path)["blocks"] == [[0, 1], [2, 3], [4, 5]]
    rm = load_adapter(tiny_model("llama"), path)
    ids, mask = batch()
    with torch.no_grad():
        assert torch.equal(rm(input_ids=ids, attention_mask=mask).logits, logits)
    cfg["format_version"] = 99
    (path / CONFIG_NAME).write_text(json.dumps(cfg))
    with pytest.raises(AdapterError, match="format_version"):
        load_adapter(tiny_model("llama"), path)


def test_an_adapter_saved_under_the_old_tensor_names_loads_as_it_was(tmp_path):
    """Before format 3 the correction A_n (and a shortcut's low-rank map) was saved as `adapter`: the names are
    mapped on load, as PEFT maps renamed keys, and the logits are the same."""
    from safetensors.torch import load_file, save_file

    from reskip.ar_retrofit.adapter_io import names_before_rename

    path, logits = trained_adapter(tmp_path)
    state = load_file(path / WEIGHTS_NAME)
    old = {names_before_rename(k): v for k, v in state.items()}
    assert any(".adapter." in k for k in old) and not any(".adapter." in k for k in state)
    save_file(old, str(path / WEIGHTS_NAME))
    cfg = json.loads((path / CONFIG_NAME).read_text())
    cfg["format_version"] = 2
    (path / CONFIG_NAME).write_text(json.dumps(cfg))
    rm = load_adapter(tiny_model("llama"), path)
    ids, mask = batch()
    with torch.no_grad():
        assert torch.equal(rm(input_ids=ids, attention_mask=mask).logits, logits)


def test_a_save_stopped_between_its_files_leaves_the_previous_adapter_whole(tmp_path, monkeypatch):
    """The weights, the config and the model card are written into a temporary folder that replaces the adapter
    folder in one rename: stopped after the weights, the folder is the previous adapter, every file of it."""
    path, _ = trained_adapter(tmp_path)
    before = {f: (path / f).read_bytes() for f in os.listdir(path)}
    import reskip.ar_retrofit.adapter_io as io

    def killed(*a, **k):
        raise KeyboardInterrupt  # after save_file wrote the new weights into the temporary folder

    monkeypatch.setattr(io, "write_card", killed)
    rm = retrofit(tiny_model("llama"), RetrofitConfig(block_size=2, rank=8), seed=9)
    with pytest.raises(KeyboardInterrupt):
        rm.save_adapter(path)
    assert {f: (path / f).read_bytes() for f in os.listdir(path)} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # the temporary is gone
    monkeypatch.undo()
    rm.save_adapter(path)  # and the next save replaces it whole
    assert (path / WEIGHTS_NAME).read_bytes() != before[WEIGHTS_NAME]
    assert sorted(os.listdir(tmp_path)) == ["adapter"]


def test_a_leftover_temporary_is_removed_by_the_next_save(tmp_path):
    path, _ = trained_adapter(tmp_path)
    (tmp_path / ".adapter.x1.tmp").mkdir()
    (tmp_path / ".adapter.x2.old").mkdir()
    retrofit(tiny_model("llama"), RetrofitConfig(block_size=2, rank=8)).save_adapter(path)
    assert sorted(os.listdir(tmp_path)) == ["adapter"]


def test_weights_that_are_not_finite_are_refused_at_load_and_at_save(tmp_path):
    from safetensors.torch import load_file, save_file

    path, _ = trained_adapter(tmp_path)
    state = load_file(path / WEIGHTS_NAME)
    name = sorted(state)[0]
    state[name] = torch.full_like(state[name], float("nan"))
    save_file(state, str(path / WEIGHTS_NAME))
    with pytest.raises(AdapterError, match="not finite"):
        load_adapter(tiny_model("llama"), path)
    rm = retrofit(tiny_model("llama"), RetrofitConfig(block_size=2, rank=8))
    with torch.no_grad():
        next(iter(rm.side_channel.parameters())).fill_(float("inf"))
    with pytest.raises(AdapterError, match="not finite"):
        rm.save_adapter(tmp_path / "other")
    assert not (tmp_path / "other").exists()
