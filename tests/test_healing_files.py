"""A healing run's files as someone may hand them over: weights of random bytes or cut short, an adapter config that
is not JSON, of another rank or another kind, a record naming layers the backbone lacks or of the wrong type, an
adapter copied from a healing run of another pruning. `reskip export` (and every command that opens a healing run)
refuses each in one line, exit 2, with nothing written."""

import json
import shutil

import pytest

from helpers import save_tiny, tiny_train_config, write_corpus
from reskip.cli import main
from reskip.compress.healing_files import TRAINED_ON
from reskip.compress.healing_run import HealingConfig
from reskip.compress.train import train_lora


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("healingfiles")
    model, corpus = save_tiny(tmp / "model", "llama"), write_corpus(tmp / "corpus", n_docs=200)
    cfg = tiny_train_config(model, corpus)
    train_lora(cfg, HealingConfig(params=2_000, drop_layers=[2, 3], drop_blocks=[3, 4], objective="kd"), tmp / "healed",
               show_progress=False)
    train_lora(cfg, HealingConfig(params=2_000), tmp / "lora", show_progress=False)
    return tmp


def _spoil(run, case: str, tmp):
    adapter = run / "adapter"
    weights = adapter / "adapter_model.safetensors"
    config = adapter / "adapter_config.json"
    if case == "random weights":
        weights.write_bytes(b"\x17" * 300)
    elif case == "weights cut short":
        weights.write_bytes(weights.read_bytes()[:200])
    elif case == "config not JSON":
        config.write_text("{\"r\": 8,")
    elif case in ("another rank", "unknown peft_type"):
        c = json.loads(config.read_text())
        c.update({"r": 64} if case == "another rank" else {"peft_type": "FROBNICATE"})
        config.write_text(json.dumps(c))
    elif case in ("layer 99", "layers as a string", "unknown field"):
        text = (run / "config.yaml").read_text()
        new = {"layer 99": "- 99", "layers as a string": "drop_layers: x", "unknown field": "rank: 4\n  drop_layers:"}[case]
        old = {"layer 99": "- 2", "layers as a string": "drop_layers:", "unknown field": "drop_layers:"}[case]
        if case == "layers as a string":
            text = text.replace("drop_layers:\n  - 2\n  - 3\n", "drop_layers: x\n")
        else:
            text = text.replace(old, new, 1)
        (run / "config.yaml").write_text(text)
    elif case in ("adapter of another pruning", "another pruning, no record"):
        shutil.rmtree(adapter)
        shutil.copytree(tmp / "healed" / "adapter", adapter)
        if case == "another pruning, no record":
            (adapter / TRAINED_ON).unlink()


CASES = [("random weights", "healed", "cannot be read"), ("weights cut short", "healed", "cannot be read"),
         ("config not JSON", "healed", "is not valid JSON"), ("another rank", "healed", "of different adapters"),
         ("unknown peft_type", "healed", "not a LoRA adapter's config"), ("layer 99", "healed", "names layer(s) [99]"),
         ("layers as a string", "healed", "lora.drop_layers must be"), ("unknown field", "healed", "unknown lora field"),
         ("adapter of another pruning", "lora", "belongs to another healing run"),
         ("another pruning, no record", "lora", "trained on another pruning")]


@pytest.mark.parametrize("case,which,word", CASES, ids=[c for c, _, _ in CASES])
def test_export_refuses_spoiled_healing_files_in_one_line(runs, case, which, word, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(runs / which, run)
    _spoil(run, case, runs)
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    if case == "another pruning, no record":  # only the loaded model can tell: the loader's progress lines first
        lines = lines[-1:]
    assert len(lines) == 1 and word in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("*.tmp*"))


def test_a_healing_run_records_the_layers_its_adapter_trained_without(runs):
    assert json.loads((runs / "healed" / "adapter" / TRAINED_ON).read_text()) == {"drop_layers": [2, 3],
                                                                                   "nested_layers": []}


def test_sigterm_or_ctrl_c_during_export_leave_no_temporary_and_say_what_to_do(runs, tmp_path, monkeypatch, capsys):
    """A SIGTERM while the model is written runs the same clean-up as Ctrl-C: the temporary folder goes, nothing
    is left at --out, the run lock is let go, and the message fits the command (no advice to resume a training)."""
    import os
    import signal

    from transformers import PreTrainedModel

    for stop, code, word in ((lambda: os.kill(os.getpid(), signal.SIGTERM), 143, "terminated"),
                             (lambda: (_ for _ in ()).throw(KeyboardInterrupt()), 130, "interrupted")):
        def save(self, *a, stop=stop, **k):
            stop()

        monkeypatch.setattr(PreTrainedModel, "save_pretrained", save)
        capsys.readouterr()
        assert main(["export", str(runs / "healed"), "--out", str(tmp_path / "out")]) == code
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith(f"reskip: {word};") and "resume" not in err and "run the command again" in err
        assert not list(tmp_path.iterdir()), list(tmp_path.iterdir())
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is the command's only
