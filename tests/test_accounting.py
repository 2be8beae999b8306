"""Parameter accounting on the meta device, for shipped architecture configs."""

import json

import pytest

from reskip.ar_retrofit.accounting import count_params
from reskip.ar_retrofit.config import RetrofitConfig
from reskip.ar_retrofit.side_channel import count_side_channel_params
from reskip.backbones.architectures import architecture_config, shipped_architectures
from reskip.cli import main

SHIPPED = ["Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B", "Llama-3.2-1B", "Llama-3.2-3B",
           "Llama-3.1-8B", "SmolLM2-135M", "SmolLM2-360M", "SmolLM2-1.7B"]


def test_every_required_architecture_ships():
    assert set(SHIPPED) <= set(shipped_architectures().values())


@pytest.mark.parametrize("name", SHIPPED)
def test_counts_match_closed_form(name):
    cfg = architecture_config(name)
    report = count_params(cfg, RetrofitConfig(rank=256), name)
    n_blocks = -(-cfg.num_hidden_layers // 4)
    assert report.new_params == count_side_channel_params(cfg.hidden_size, n_blocks, 256)
    assert len(report.blocks) == n_blocks


def test_qwen3_4b_at_rank_256_is_under_half_a_percent(capsys):
    assert main(["params", "--backbone", "Qwen3-4B", "--rank", "256", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert {"new_params", "backbone_params", "fraction", "blocks"} <= set(r)
    assert 3.9e9 < r["backbone_params"] < 4.1e9  # the published ~4.0B
    assert r["fraction"] < 0.005 and r["n_blocks"] == 9 and r["rank"] == 256


def test_published_sizes_are_reproduced():
    # Backbone sizes as published for these checkpoints (rounded).
    expected = {"SmolLM2-135M": 134.5e6, "Llama-3.2-1B": 1.236e9, "Llama-3.1-8B": 8.03e9, "Qwen3-8B": 8.19e9}
    for name, n in expected.items():
        got = count_params(architecture_config(name), RetrofitConfig(rank=256), name).backbone_params
        assert abs(got - n) / n < 0.01, (name, got)


def test_config_json_path_and_block_size(tmp_path, capsys):
    cfg = architecture_config("Qwen3-0.6B")
    (tmp_path / "config.json").write_text(cfg.to_json_string())
    assert main(["params", "--backbone", str(tmp_path), "--rank", "32", "--block-size", "7", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["n_blocks"] == 4 and r["rank"] == 32


def test_unknown_backbone_is_a_clear_error(capsys):
    assert main(["params", "--backbone", "Nope-1B", "--rank", "8"]) == 2
    err = capsys.readouterr().err
    assert "unknown backbone" in err and "Qwen3-4B" in err
