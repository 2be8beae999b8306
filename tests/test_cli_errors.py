"""Bad input to every command: one line on stderr, exit code 2, no traceback, before any weights load,
and no half-written folder left behind. New commands join the table."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers

from helpers import save_tiny
from reskip import ReskipError
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
    (["experiment", "placement", "--memory-bytes", "0", "--out", "{tmp}/e"], "memory-bytes"),
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
    (["train", "--data-weights", "{nosuch: 1}", "--model", "{model}", "--seq-len", "16", "--block-size", "2",
      "--out", "{tmp}/t"], "data_weights names 'nosuch', which the data does not have"),
    (["generate", "hi", "--adapter", "{run}", "--seed", "2000000000000000000000"], "--seed must be"),
    (["generate", "hi", "--adapter", "{run}", "--sample", "--temperature", "1e-300"], "--temperature must be"),
    (["calibrate", "--adapter", MISSING], "neither a run folder"),
    (["calibrate", "--adapter", MISSING, "--delta", "-1"], "--delta"),
    (["calibrate", "--adapter", MISSING, "--quantile", "2"], "--quantile"),
    (["calibrate", "--adapter", MISSING, "--window", "0"], "--window"),
    (["calibrate", "--adapter", MISSING, "--delta", "abc"], "invalid float"),
    (["calibrate", "--adapter", MISSING, "--delta", "inf"], "finite"),
    (["calibrate", "--adapter", "{run}", "--seq-len", "100000"], "exceeds the model's limit"),
    (["calibrate", "--adapter", "{run}", "--out", "{run}"], "is a folder"),
    (["eval", "--adapter", "{run}", "--methods", "backbone", "retrofit", "--benchmarks", "none", "--seq-len", "100000"], "exceeds the model's limit"),
    (["generate", "hi", "--adapter", MISSING, "--policy", "static:inf"], "finite"),
    (["generate", "hi", "--adapter", MISSING, "--policy", "influence:1e400"], "finite"),
    (["generate", "hi", "--adapter", MISSING, "--sample", "--temperature", "0"], "--temperature must be [0.01"),
    (["generate", "hi", "--adapter", MISSING, "--sample", "--temperature", "nan"], "--temperature"),
    (["generate", "hi", "--adapter", MISSING, "--sample", "--top-p", "2"], "--top-p"),
    (["generate", "caf\udce9", "--adapter", MISSING], "not valid UTF-8"),
    (["generate", " ", "--adapter", MISSING], "the prompt is empty"),
    (["experiment", "scale", "--arms", "huge", "--out", "{tmp}/e"], "no arm 'huge'"),
    (["experiment", "baselines", "--variants", "nope", "--out", "{tmp}/e"], "no variant 'nope'"),
    (["diagnose", MISSING, "--probe-sequences", "-1"], "--probe-sequences"),
    (["params", "--backbone", "Qwen3-4B", "--rank", "1000000000"], "exceeds the model's hidden size"),
    (["train", "--config", "{files}/latin1.yaml", "--out", "{tmp}/t"], "is not UTF-8 text"),
    (["train", "--out", "{files}/latin1.json"], "is a file"),
    (["run", "--out", "{files}/latin1.json"], "is a file"),
    (["run", "--out", "{run}", "--preset", "quick"], "that `reskip run` did not start"),
    (["run-parity", "--out", "{files}/latin1.json"], "is a file"),
    (["eval", "--adapter", "{run}", "--out", "{files}/latin1.json"], "is a file"),
    (["report", "{run}", "--out", "{files}/latin1.json"], "is a file"),
    (["experiment", "placement", "--out", "{files}/latin1.json"], "is a file"),
    (["diagnose", "{run}", "--out", "{files}"], "is a folder"),
    (["train", "--model", "{model}", "--data", "{files}/latin1.jsonl", "--seq-len", "16", "--block-size", "2",
      "--out", "{tmp}/t"], "is not UTF-8 text"),
    (["generate", "hi", "--adapter", "{run}", "--policy", "{files}/latin1.json"], "is not UTF-8 text"),
    (["generate", "hi", "--adapter", "{files}/cut-policy"], "is not valid JSON"),
    (["report", "{files}/cut-policy", "--out", "{tmp}/r"], "is not valid JSON"),
    (["generate", "hi", "--adapter", "{files}/string-tau"], "tau of block"),
    (["calibrate", "--adapter", "{files}/bad-config"], "is not valid YAML at line"),
    (["report", "{files}/cut-summary", "--out", "{tmp}/r"], "is not valid JSON"),
    (["report", "{files}/bad-log", "--out", "{tmp}/r"], "train_log.jsonl:2 is not valid JSON"),
    (["report", "{files}/empty-record", "--out", "{tmp}/r"], "record 2 has kind 'None'"),
    (["report", "{files}/bad-pipeline"], "holds no stage's files"),
    (["train", "--skip-max-blocks", "50", "--out", "{tmp}/t"], "exceeds the"),
    (["run-parity", "--boundaries", "8,100", "--out", "{tmp}/p"], "inside 1..29"),
    (["run", "--data", "{files}/empty.jsonl", "--out", "{tmp}/r"], "the data set is empty"),
    (["train", "--resume", "{files}/empty-record"], "record 2 has kind 'None'"),
    (["run", "--resume", "{files}/bad-pipeline"], "missing field 'finished'"),
    (["report", "{files}/latin1-log", "--out", "{tmp}/r"], "is not UTF-8 text"),
    (["train", "--resume", "{files}/bad-config"], "is not valid YAML at line"),
    (["train", "--rank", "100000", "--seq-len", "16", "--block-size", "2", "--model", "{model}", "--out", "{tmp}/t"], "exceeds the model's hidden size"),
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
    # a device this machine lacks (cuda:99 on any machine) or no device at all: refused before weights load
    (["train", "--device", "tpu", "--out", "{tmp}/t"], "device must be"),
    (["train", "--device", "cuda:99", "--model", "{model}", "--seq-len", "16", "--block-size", "2", "--out", "{tmp}/t"],
     "CUDA"),
    (["run", "--device", "gpu", "--out", "{tmp}/r"], "--device"),
    (["run", "--device", "cuda:99", "--out", "{tmp}/r"], "CUDA"),
    (["run-parity", "--device", "cuda:99", "--out", "{tmp}/p"], "CUDA"),
    (["calibrate", "--adapter", "{run}", "--device", "cuda:99"], "CUDA"),
    (["eval", "--adapter", "{run}", "--device", "cuda:99", "--methods", "backbone", "--benchmarks", "none"], "CUDA"),
    (["diagnose", "{run}", "--device", "cuda:99"], "CUDA"),
    (["generate", "hi", "--adapter", "{run}", "--device", "cuda:99"], "CUDA"),
    (["lab", "{run}", "--device", "cuda:99"], "CUDA"),
    (["experiment", "variants", "--device", "cuda"+"x", "--out", "{tmp}/e"], "--device"),
    (["run", "--preset", "huge", "--out", "{tmp}/r"], "invalid choice"),
    (["run", "--delta", "-1", "--out", "{tmp}/r"], "--delta"),
    (["run", "--lr", "nan", "--out", "{tmp}/r"], "lr must be a finite number"),
    (["run", "--steps", "0", "--out", "{tmp}/r"], "steps"),
    (["run", "--boundaries", "a", "--out", "{tmp}/r"], "--boundaries"),
    (["run", "--block-size", "1000", "--model", "{model}", "--out", "{tmp}/r"], "at least two blocks"),
    (["run", "--model", MISSING, "--out", "{tmp}/r"], "cannot find model"),
    (["run", "--resume", MISSING], "not a pipeline run folder"),
    (["export", MISSING, "--out", "{tmp}/x"], "not a finished baseline run"),
    (["export", "{run}", "--out", "{tmp}/x"], "not a finished baseline run"),
    (["compress", "--model", "{model}", "--drop", "99", "--out", "{tmp}/c"], "middle blocks"),
    (["compress", "--drop", "1", "--keep-flops", "0.8", "--out", "{tmp}/c"], "give one"),
    (["compress", "--keep-flops", "2", "--out", "{tmp}/c"], "--keep-flops"),
    (["compress", "--out", "{tmp}/c", "--data", MISSING], "cannot load dataset"),
    (["compress", "--out", "{tmp}/c", "--model", MISSING], "cannot find model"),
    (["compress"], "--out"),
    (["eval"], "name the run"),
    (["eval", "{run}", "--methods", "--out", "{tmp}/e"], "names no method"),
    (["eval", "{run}", "--adapter", MISSING], "name two runs"),
    (["eval", "{run}", "--methods", "healed:" + MISSING, "--out", "{tmp}/e"], "not a finished baseline run"),
    (["eval", "{run}", "--methods", "export:" + MISSING, "--out", "{tmp}/e"], "reskip.json"),
    (["eval", "{run}", "--methods", "pruned:x", "--out", "{tmp}/e"], "block count K"),
    (["experiment", "baselines", "--model", "{model}", "--heal", "mse", "--out", "{tmp}/e"], "no objective 'mse'"),
    (["experiment", "baselines", "--model", "{model}", "--lrs", "0", "--out", "{tmp}/e"], "--lrs"),
    (["experiment", "baselines", "--model", "{model}", "--arms", "dora", "--out", "{tmp}/e"], "no method 'dora'"),
    (["generate", "hi", "--adapter", MISSING, "--policy", "reskip:budget=1:hold"], ":held"),
    (["calibrate", "--adapter", "{run}", "--budgets", "1e400"], "--budgets"),
    (["train", "--out", "{files}/latin1.json/sub"], "is a file, not a folder"),
    (["train", "--config", "{files}/aliases.yaml", "--out", "{tmp}/t"], "aliases"),
    (["train", "--lr", "0x10", "--out", "{tmp}/t"], "lr must be a finite number"),
    (["train", "--steps", "0o10", "--out", "{tmp}/t"], "steps must be an integer"),
    # a flag given empty or null is that value, refused where the field takes none (never the default quietly)
    (["train", "--device", "", "--out", "{tmp}/t"], "device must be"),
    (["train", "--steps", "null", "--out", "{tmp}/t"], "steps must be an integer"),
    (["train", "--device", "cuda:00", "--out", "{tmp}/t"], "device must be"),
    (["train", "--data-weights", "{default: 0}", "--out", "{tmp}/t"], "at least one must be > 0"),
    (["run", "--device", "cuda:01", "--out", "{tmp}/r"], "--device"),
    (["experiment", "nested", "--model", "{model}", "--lrs", "0.001", "0.002", "--out", "{tmp}/e"], "one learning rate"),
    (["experiment", "nested", "--model", "{model}", "--depths", "0", "--out", "{tmp}/e"], "--depths"),
    (["experiment", "stacked", "--model", "{model}", "--out", "{tmp}/e"], "run `reskip experiment nested`"),
    (["experiment", "frontier", "--model", "{model}", "--out", "{tmp}/e"], "run `reskip experiment nested`"),
    (["experiment", "depth-request", "--model", "{model}", "--out", "{tmp}/e"], "run `reskip experiment nested`"),
    (["export", "{run}", "--out", "{tmp}/x", "--depth", "-1"], "--depth"),
    (["generate", "hi", "--adapter", "{run}", "--depth", "1"], "is not a healing run"),
    (["calibrate", "--adapter", "{run}", "--budget-objective", "nll"], "invalid choice"),
    (["eval", "{run}", "--methods", "backbone", "--reference", MISSING, "--out", "{tmp}/e"], "cannot find model"),
    (["eval", "{run}", "--methods", "nested:1", "--out", "{tmp}/e"], "a depth and a folder"),
    (["eval", "{run}", "--methods", "nested:x:" + MISSING, "--out", "{tmp}/e"], "depth K"),
    # a config.json someone wrote: the sizes the count needs, checked before any arithmetic
    (["params", "--backbone", "{files}/heads0.json"], "num_attention_heads must be a whole number"),
    (["params", "--backbone", "{files}/hidden-text.json"], "hidden_size must be a whole number"),
    (["params", "--backbone", "{files}/hidden-inf.json"], "hidden_size must be a whole number"),
    (["params", "--backbone", "{files}/vocab-negative.json"], "vocab_size must be a whole number"),
    (["params", "--backbone", "{files}/type-list.json"], "model_type must be a name"),
    (["params", "--backbone", "{files}/layers-1e9.json"], "num_hidden_layers must be a whole number"),
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


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A tiny trained run (outside tmp_path: the refused commands must leave tmp_path empty)."""
    from helpers import tiny_trained_run

    return tiny_trained_run(tmp_path_factory.mktemp("trained"))


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, trained_run):
    """Files a user or a stopped process leaves: Latin-1 text where UTF-8 is read, a policy file cut short, a
    threshold written as a string, a run's config.yaml that is not YAML."""
    import json
    import shutil

    d = tmp_path_factory.mktemp("bad")
    (d / "latin1.yaml").write_bytes("lr: 1e-3\nname: caf\u00e9\n".encode("latin-1"))
    (d / "latin1.jsonl").write_bytes('{"text": "caf\u00e9 w5 w6"}\n'.encode("latin-1"))
    (d / "latin1.json").write_bytes('{"a": "caf\u00e9"}'.encode("latin-1"))
    (d / "aliases.yaml").write_text("a: &a [1, 1, 1, 1]\nb: &b [*a, *a, *a, *a]\nc: [*b, *b, *b, *b]\n")
    assert main(["calibrate", "--adapter", str(trained_run), "--sequences", "4", "--delta", "100", "--budgets", "none",
                 "--out", str(d / "policy.json")]) == 0
    policy = (d / "policy.json").read_text()
    for name in ("cut-policy", "string-tau", "bad-config", "cut-summary", "bad-log", "latin1-log", "empty-record"):
        shutil.copytree(trained_run, d / name)
        (d / name / "policy.json").write_text(policy)
    (d / "cut-policy" / "policy.json").write_text(policy[:120])
    data = json.loads(policy)
    data["blocks"][2]["tau"] = "high"
    (d / "string-tau" / "policy.json").write_text(json.dumps(data))
    (d / "bad-config" / "config.yaml").write_text("lr: [1,\n")
    summary = (d / "cut-summary" / "summary.json").read_text()
    (d / "cut-summary" / "summary.json").write_text(summary[: len(summary) // 2])
    lines = (d / "bad-log" / "train_log.jsonl").read_text().splitlines()
    (d / "bad-log" / "train_log.jsonl").write_text("\n".join([lines[0], lines[1][:20], *lines[2:]]) + "\n")
    (d / "empty-record" / "train_log.jsonl").write_text("\n".join([lines[0], "{}", *lines[2:]]) + "\n")
    (d / "empty.jsonl").write_text("")
    (d / "bad-pipeline").mkdir()
    (d / "bad-pipeline" / "pipeline.json").write_text('{"stages": 5}')
    (d / "latin1-log" / "train_log.jsonl").write_bytes((d / "latin1-log" / "train_log.jsonl").read_bytes() + b"\xe9\n")
    from importlib import resources

    smol = json.loads((resources.files("reskip.backbones") / "archs" / "SmolLM2-135M.json").read_text())
    for name, change in (("heads0", {"num_attention_heads": 0}), ("hidden-text", {"hidden_size": "576"}),
                         ("vocab-negative", {"vocab_size": -5}), ("type-list", {"model_type": ["llama"]}),
                         ("layers-1e9", {"num_hidden_layers": 10**9})):
        (d / f"{name}.json").write_text(json.dumps({**smol, **change}))
    (d / "hidden-inf.json").write_text(json.dumps(smol).replace('"hidden_size": 576', '"hidden_size": 1e400'))
    return d


@pytest.mark.parametrize("argv,word", BAD, ids=[" ".join(a) or "(nothing)" for a, _ in BAD])
def test_bad_invocation_is_one_line_and_exit_2(argv, word, tmp_path, capsys, tiny_model_dir, trained_run, bad_files,
                                               no_weights):
    where = {"{tmp}": tmp_path, "{model}": tiny_model_dir, "{run}": trained_run, "{files}": bad_files}
    for key, value in where.items():
        argv = [a.replace(key, str(value)) for a in argv]
    capsys.readouterr()  # the fixtures' own output
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
    from reskip.cli.evaluate import EVAL_CONVERTERS
    from reskip.cli.options import options_from_args
    from reskip.evaluate.options import EvalOptions

    def eval_options(args):
        return options_from_args(EvalOptions, args, EVAL_CONVERTERS)

    parser = build_parser()
    for tail in (["--benchmarks", "none"], ["--benchmarks"]):
        assert eval_options(parser.parse_args(["eval", "--adapter", "x", *tail])).benchmarks == []
    assert eval_options(parser.parse_args(["eval", "--adapter", "x"])).benchmarks == ["mmlu"]


def test_an_options_file_gives_values_by_name_and_flags_override_it(tmp_path):
    """`--config` of a stage: values by field name, converted as flags are, a flag given on the line winning;
    an unknown name or a value of the wrong type is one error naming the file and the field."""
    from reskip.cli.options import options_from_args
    from reskip.cli.skip import CALIBRATE_CONVERTERS
    from reskip.research.calibrate.options import CalibrateOptions

    parser = build_parser()
    good = tmp_path / "calib.yaml"
    good.write_text("sequences: 64\ndelta: 1.0\nbudgets: [0.5, 1]\n")
    args = parser.parse_args(["calibrate", "--adapter", "x", "--config", str(good), "--delta", "0.5"])
    o = options_from_args(CalibrateOptions, args, CALIBRATE_CONVERTERS)
    assert (o.sequences, o.delta, o.budgets, o.quantile) == (64, 0.5, (0.5, 1.0), CalibrateOptions().quantile)
    for text, words in (("sequence: 64\n", "unknown option 'sequence'"), ("sequences: many\n", "sequences takes int"),
                        ("quantile: 2\n", "--quantile must be"), ("- 1\n", "a YAML mapping"),
                        ("sequences: null\n", "sequences cannot be null"), ("budgets: [[1]]\n", "plain values")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(ReskipError, match=words):
            options_from_args(CalibrateOptions, parser.parse_args(["calibrate", "--adapter", "x", "--config", str(bad)]),
                              CALIBRATE_CONVERTERS)


def _one_line_exit_2(argv, capsys, word):
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and word in err[0] and "Traceback" not in err[0], err
    return err[0]


def _snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.integration
def test_a_run_folder_has_an_identity(tmp_path, capsys):
    """Training over another run is refused unless --overwrite; a resume that contradicts the run is refused;
    a retrained run is calibrated again (its old policy replaced)."""
    from helpers import tiny_trained_run

    run = tiny_trained_run(tmp_path, calibrate=[])
    capsys.readouterr()  # the set-up's own output
    model, corpus = tmp_path / "model", tmp_path / "corpus"
    before = _snapshot(run)
    args = ["train", "--model", model, "--data", corpus, "--seq-len", "16", "--steps", "2", "--batch-size", "2",
            "--eval-every", "2", "--save-every", "2", "--eval-sequences", "2", "--block-size", "2", "--rank", "8",
            "--quiet"]
    _one_line_exit_2([*args, "--out", run], capsys, "already holds a training run")
    _one_line_exit_2(["train", "--resume", run, "--seed", "7", "--steps", "3"], capsys, "keeps the run's own settings")
    assert _snapshot(run) == before  # nothing touched
    assert main([str(a) for a in [*args, "--seed", "7", "--out", run, "--overwrite"]]) == 0
    weights = Path("adapter/adapter_model.safetensors")
    assert _snapshot(run)[weights] != before[weights]
    capsys.readouterr()
    assert main(["calibrate", "--adapter", str(run), "--sequences", "4", "--delta", "100", "--budgets", "none"]) == 0
    assert "replacing" in capsys.readouterr().out
    assert main(["generate", "--adapter", str(run), "w5 w6", "--max-new-tokens", "2"]) == 0


@pytest.mark.parametrize("error,word,code", [(OSError(28, "No space left on device", "/runs/x/adapter"),
                                               "No space left on device (/runs/x/adapter)", 2),
                                              (KeyboardInterrupt(), "interrupted", 130)])
def test_os_errors_and_ctrl_c_are_one_line(error, word, code, monkeypatch, capsys):
    """What the OS or the user throws mid-command: one line, no traceback; Ctrl-C exits 130."""
    import reskip.cli.backbone as backbone

    def fail(args):
        raise error

    monkeypatch.setattr(backbone, "cmd_params", fail)
    assert main(["params", "--backbone", "Qwen3-4B", "--rank", "8"]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and word in err[0] and "Traceback" not in err[0]


def test_written_files_follow_the_umask(tmp_path):
    """Atomic writes (a temp file, then a rename) leave files 0644 and folders 0755 under umask 022, not the
    0600 / 0700 of their temporaries, so a run can be read by whom the user's umask allows."""
    import os

    import torch
    from safetensors.torch import save_file

    from reskip.io_atomic import atomic_folder, atomic_write_json

    def library_writes(tmp):  # safetensors writes 0600 whatever the umask; a library may make a 0700 folder
        (tmp / "w").write_text("w")
        save_file({"x": torch.zeros(2)}, str(tmp / "weights.safetensors"))
        (tmp / "sub").mkdir(mode=0o700)
        (tmp / "sub" / "s").write_text("s")
        os.chmod(tmp / "sub" / "s", 0o600)

    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "a.json", {"x": 1})
        atomic_folder(tmp_path / "f", library_writes)
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o755
    for name in ("w", "weights.safetensors", "sub/s"):
        assert (tmp_path / "f" / name).stat().st_mode & 0o777 == 0o644, name
    assert (tmp_path / "f" / "sub").stat().st_mode & 0o777 == 0o755


def test_config_numbers_are_read_as_yaml_1_2():
    """Decimal digits are integers (010 is ten, as in JSON and YAML 1.2); YAML 1.1's hex, octal and sexagesimal forms
    stay strings, which validation refuses by name (`--lr 0x10` is not 16)."""
    from reskip.train_config import load_yaml

    assert load_yaml("a: 010\nb: -3\nc: 1e-3\nd: 0x10\ne: 0o10\nf: 1:30") == {
        "a": 10, "b": -3, "c": 0.001, "d": "0x10", "e": "0o10", "f": "1:30"}


def test_an_error_quoting_a_huge_value_prints_a_bounded_line(tmp_path, capsys):
    config = tmp_path / "big.yaml"
    config.write_text("lr: [" + ", ".join(["1"] * 50_000) + "]\n")
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert len(err) < 1200 and "more characters" in err and err.count("\n") == 1


@pytest.mark.parametrize("kind", ["json", "jsonl", "yaml", "json-shallow-wide"])
def test_readers_refuse_files_nested_beyond_any_reskip_file(tmp_path, kind):
    """A policy.json, a log line or a config nested 100,000 deep is one clear error, not a RecursionError; a deep
    but legal nesting the decoder survives (70 levels) is refused by the same bound."""
    from reskip.reading import MAX_DEPTH, read_json, read_jsonl, read_yaml
    from reskip.train_config import load_yaml

    deep = "[" * 100_000 + "]" * 100_000
    path = tmp_path / f"f.{kind}"
    if kind == "json":
        path.write_text(deep)
        reader = read_json
    elif kind == "jsonl":
        path.write_text('{"kind": "train"}\n' + deep + "\n" + '{"kind": "train"}\n')
        reader = read_jsonl
    elif kind == "yaml":
        path.write_text("a: " + "[" * 5_000 + "]" * 5_000 + "\n")
        reader = lambda p: read_yaml(p, load_yaml)  # noqa: E731
    else:
        path.write_text("[" * (MAX_DEPTH + 6) + "]" * (MAX_DEPTH + 6))
        reader = read_json
    with pytest.raises(ReskipError, match=f"nests more than {MAX_DEPTH} levels"):
        reader(path)


def test_the_run_lock_never_writes_through_a_link(tmp_path):
    """A `.lock` that is a symlink to a file elsewhere is refused in one line; the file it points to is untouched."""
    from reskip.run_folder.lock import writing

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").symlink_to(victim)
    with pytest.raises(ReskipError, match="is a link"):
        with writing(run):
            pass
    assert victim.read_text() == "precious"


def test_a_config_file_reads_as_the_flags_do(tmp_path):
    """Values from `--config` go through the flags' own conversion: a method list holding a list is refused, and an
    experiment's `overrides:` from the file stays under the training flags given on the line (merged key by key)."""
    from reskip.cli.evaluate import EVAL_CONVERTERS
    from reskip.cli.experiment import experiment_options
    from reskip.cli.options import options_from_args
    from reskip.evaluate.options import EvalOptions

    parser = build_parser()
    bad = tmp_path / "eval.yaml"
    bad.write_text("methods: [[static:1]]\n")
    with pytest.raises(ReskipError, match="methods takes a list of plain values"):
        options_from_args(EvalOptions, parser.parse_args(["eval", "x", "--config", str(bad)]), EVAL_CONVERTERS)
    conf = tmp_path / "exp.yaml"
    conf.write_text("overrides: {lr: 0.004, eval_every: 5}\n")
    o = experiment_options(parser.parse_args(["experiment", "nested", "--config", str(conf), "--steps", "7"]))
    assert o.overrides == {"lr": 0.004, "eval_every": 5, "steps": 7}


def test_a_lora_larger_than_its_projections_can_hold_is_refused(capsys):
    """`--inner-lora 10^12` on Qwen3-4B: ranks above the projections' full rank; counted on the meta device (no
    weights), refused in one line with the most this model can hold."""
    _one_line_exit_2(["params", "--backbone", "Qwen3-4B", "--inner-lora", "1000000000000"], capsys,
                     "above the full rank")


def test_a_refusal_inside_a_folder_of_the_user_leaves_no_lock(tmp_path, capsys, tiny_model_dir):
    """The run lock is taken before the checks that need the folder; a refusal there leaves the user's folder as it
    was (no `.lock`), and the working folder too."""
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    _one_line_exit_2(["train", "--model", tiny_model_dir, "--data", MISSING, "--out", mine], capsys, "dataset")
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("value,word", [("abc", "is not a process count"), ("0", "is not a process count"),
                                        ("2", "no launcher started this process")])
def test_a_world_size_without_a_launcher_is_one_line(value, word, monkeypatch, capsys, tmp_path):
    for key in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WORLD_SIZE", value)
    _one_line_exit_2(["train", "--steps", "1", "--out", tmp_path / "t"], capsys, word)
    assert not (tmp_path / "t").exists()


def test_an_adapter_whose_outputs_overflow_stops_every_stage_in_one_line(tmp_path, capsys):
    """Finite weights that overflow in the forward pass (logits inf or nan): generate and calibrate refuse in one
    line naming the adapter, before any work and without writing a policy; a JSON file never holds NaN."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from helpers import tiny_trained_run
    from reskip.io_atomic import atomic_write_json

    run = tiny_trained_run(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(run, broken)
    for f in (broken / "adapter").glob("*.safetensors"):
        save_file({k: v * 1e30 for k, v in load_file(f).items()}, f)  # finite, but their products overflow
    capsys.readouterr()
    for argv in (["generate", "--adapter", broken, "w5 w6", "--policy", "none"],
                 ["calibrate", "--adapter", broken, "--sequences", "2"]):
        assert main([str(a) for a in argv]) == 2
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]  # after the loader's own progress lines: only a forward pass can tell
        assert "logits non-finite" in last and str(broken / "adapter") in last and "Traceback" not in err
    assert not (broken / "policy.json").exists()
    atomic_write_json(tmp_path / "x.json", {"a": float("nan"), "b": [float("inf"), 1.5]})
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": None, "b": [None, 1.5]}
