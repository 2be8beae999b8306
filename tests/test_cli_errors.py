"""Bad input to every command: one line on stderr, exit code 2, no traceback, before any weights load,
and no half-written folder left behind. New commands join the table."""

from __future__ import annotations

import pytest
import transformers

from helpers import save_tiny
from reskip.cli import build_parser, main

MISSING = "/nonexistent/reskip-test"

BAD = [
    # (argv, a word the message must contain)
    ([], "required"),
    (["frobnicate"], "invalid choice"),
    (["parity", "--model", MISSING], "cannot find model"),
    (["parity", "--dtype", "float16"], "invalid choice"),
    (["parity", "--block-size", "0"], "block_size"),
    (["parity", "--boundaries", "a"], "--boundaries"),
    (["parity", "--rank", "-1"], "rank"),
    (["params", "--backbone", "/etc/passwd", "--rank", "8"], "not a JSON model config"),
    (["params", "--backbone", "Qwen3-4B", "--rank", "256", "--block-size", "1000"], "at least two blocks"),
    (["params", "--backbone", "no-such-model", "--rank", "8"], "unknown backbone"),
    (["params", "--backbone", "Qwen3-4B", "--rank", "0"], "rank"),
    (["params", "--rank", "8"], "--backbone"),
    (["run-parity", "--boundaries", "3,2", "--out", "{tmp}/p"], "boundaries"),
    (["run-parity"], "--out"),
    (["train", "--lr", "nan", "--out", "{tmp}/t"], "lr must be a finite number"),
    (["experiment", "frobnicate"], "invalid choice"),
    (["lab", MISSING], "neither a run folder"),
    (["lab", "{tmp}/x", "--port", "0"], "port"),
    (["experiment", "variants", "--model", MISSING, "--out", "{tmp}/e"], "cannot find model"),
    (["experiment", "placement", "--budget-bytes", "0", "--out", "{tmp}/e"], "budget-bytes"),
    (["experiment", "variants", "--model", "{model}", "--steps", "0", "--out", "{tmp}/e"], "steps"),
    (["experiment", "variants", "--model", "{model}", "--block-size", "2", "--arms", "recipe", "nope", "--out", "{tmp}/e"], "no arm 'nope'"),
    (["experiment", "placement", "--arms", "recipe", "--out", "{tmp}/e"], "has no arms"),
    (["train", "--lr", ".nan", "--out", "{tmp}/t"], "lr must be a finite number"),
    (["train", "--lr", "fast", "--out", "{tmp}/t"], "lr must be a finite number"),
    (["train", "--boundaries", "a", "--out", "{tmp}/t"], "--boundaries"),
    (["train", "--steps", "0", "--out", "{tmp}/t"], "steps"),
    (["train", "--steps", "2.5", "--out", "{tmp}/t"], "steps must be an integer"),
    (["train", "--skip-blocks", "x", "--out", "{tmp}/t"], "skip_blocks"),
    (["train", "--skip-fraction", "0", "--out", "{tmp}/t"], "skip_fraction"),
    (["train", "--router-lr-mult", "-1", "--out", "{tmp}/t"], "router_lr_mult"),
    (["train", "--config", MISSING + ".yaml", "--out", "{tmp}/t"], "does not exist"),
    (["train", "--resume", MISSING], "not a run folder"),
    (["train", "--block-size", "1000", "--model", "{model}", "--out", "{tmp}/t"], "at least two blocks"),
    (["calibrate", "--adapter", MISSING], "neither a run folder"),
    (["calibrate", "--adapter", MISSING, "--delta", "-1"], "--delta"),
    (["calibrate", "--adapter", MISSING, "--quantile", "2"], "--quantile"),
    (["calibrate", "--adapter", MISSING, "--window", "0"], "--window"),
    (["calibrate", "--adapter", MISSING, "--delta", "abc"], "invalid float"),
    (["generate", "hi", "--adapter", MISSING], "neither a run folder"),
    (["generate", "hi", "--adapter", MISSING, "--policy", "sometimes"], "unknown policy"),
    (["generate", "hi", "--adapter", MISSING, "--policy", "reskip:2"], "quantile"),
    (["generate", "hi", "--adapter", MISSING, "--max-new-tokens", "0"], "--max-new-tokens"),
    (["generate", "--adapter", MISSING], "prompt"),
    (["eval", "--adapter", MISSING], "neither a run folder"),
    (["eval", "--adapter", MISSING, "--methods", "sometimes"], "unknown policy"),
    (["eval", "--adapter", MISSING, "--chunk-size", "0"], "--chunk-size"),
    (["diagnose", MISSING], "neither a run folder"),
    (["diagnose", MISSING, "--context", "0"], "--context"),
    (["report", MISSING], "not a run folder"),
    (["run", "--preset", "huge", "--out", "{tmp}/r"], "invalid choice"),
    (["run", "--delta", "-1", "--out", "{tmp}/r"], "--delta"),
    (["run", "--lr", "nan", "--out", "{tmp}/r"], "lr must be a finite number"),
    (["run", "--steps", "0", "--out", "{tmp}/r"], "steps"),
    (["run", "--boundaries", "a", "--out", "{tmp}/r"], "--boundaries"),
    (["run", "--block-size", "1000", "--model", "{model}", "--out", "{tmp}/r"], "at least two blocks"),
    (["run", "--model", MISSING, "--out", "{tmp}/r"], "cannot find model"),
    (["run", "--resume", MISSING], "not a pipeline run folder"),
]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny") / "m", "llama")


@pytest.fixture
def no_weights(monkeypatch):
    """Loading any weights is a failure of these tests: every refusal comes first."""

    def refuse(*a, **k):
        raise AssertionError("weights were loaded before the input was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", refuse)


@pytest.mark.parametrize("argv,word", BAD, ids=[" ".join(a) or "(nothing)" for a, _ in BAD])
def test_bad_invocation_is_one_line_and_exit_2(argv, word, tmp_path, capsys, tiny_model_dir, no_weights):
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{model}", str(tiny_model_dir)) for a in argv]
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own refusals exit from inside parse_args
        code = e.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured.err
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err and word in lines[0], lines[0]
    assert not list(tmp_path.iterdir()), "a refused command left files behind"


def test_the_table_covers_every_command():
    commands = set(build_parser()._subparsers._group_actions[0].choices)
    assert commands == {argv[0] for argv, _ in BAD if argv and argv[0] in commands}


def test_benchmarks_none_means_no_multiple_choice():
    """`--benchmarks none`, as the help says, and a bare `--benchmarks` both switch multiple choice off."""
    from reskip.cli.evaluate import eval_options

    parser = build_parser()
    for tail in (["--benchmarks", "none"], ["--benchmarks"]):
        assert eval_options(parser.parse_args(["eval", "--adapter", "x", *tail])).benchmarks == []
    assert eval_options(parser.parse_args(["eval", "--adapter", "x"])).benchmarks == ["mmlu"]
