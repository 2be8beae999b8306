"""`reskip compress` end to end on a tiny model: the cheapest block removed, healed by distillation, exported as a
plain folder that transformers loads alone, measured beside the original, resumed after a kill; and its refusals
before any weights load."""

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import save_tiny, write_corpus
from reskip.cli import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compress")
    return (tmp, save_tiny(tmp / "model", "llama"), write_corpus(tmp / "corpus", n_docs=600),
            write_corpus(tmp / "other", n_docs=300, seed=5))


def _args(tiny, out, *more):
    tmp, model, corpus, other = tiny
    return ["compress", "--model", str(model), "--data", str(corpus), "--heldout", str(other), "--preset", "quick",
            "--block-size", "1", "--mc-limit", "4", "--sequences", "2", "--quiet", "--out", str(out), *more]


@pytest.mark.integration
def test_compress_removes_heals_exports_and_measures_then_resumes(tiny, capsys):
    tmp = tiny[0]
    out = tmp / "small"
    assert main(_args(tiny, out)) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["blocks"]["layers"] == 6 and len(report["blocks"]["layers_removed"]) == 1
    removed = report["blocks"]["removed"][0]
    a = report["blocks"]["A"]
    assert removed == min((n for n in a if 1 < int(n) < 6), key=lambda n: a[n]) or str(removed) == min(
        (n for n in a if 1 < int(n) < 6), key=lambda n: a[n])  # the cheapest middle block by the model's own A(n)
    assert report["blocks"]["chosen_by"] == "ppl" and set(report["blocks"]["kl"]) == set(a)
    assert report["healing"]["objective"] == "kd" and report["healing"]["val_kl"]["end"] < report["healing"]["val_kl"]["start"]
    for name in ("test", str(tiny[3])):
        s = report["measured"]["splits"][name]
        assert s["backbone"]["kl_to_backbone"] == 0 and s["backbone"]["top1_agreement"] == 1
        assert s["compressed"]["kl_to_backbone"] > 0 and s["compressed"]["flops_executed_share"] == pytest.approx(5 / 6)
    assert report["measured"]["mmlu"]["original"]["n"] == 4
    assert "no chat template" in report["measured"]["chat_skipped"] and "chat" not in report["measured"]
    sp = report["speed"]
    assert sp["flop_ideal_speedup"] > 1 and set(sp["cases"]) == {"decode batch 1", "decode batch 8", "prefill 512"}
    md = (out / "report.md").read_text()
    assert "6 -> 5 layers" in md and "KL to the original" in md and "reskip compress" in md

    _opened_in_chromium(out / "report.html", tmp)

    # the folder loads with transformers alone, and is what the report measured
    model = AutoModelForCausalLM.from_pretrained(out / "model", dtype=torch.float32)
    assert model.config.num_hidden_layers == 5
    record = json.loads((out / "model" / "reskip.json").read_text())
    assert record["drop_layers"] == report["blocks"]["layers_removed"] and record["healing"]["objective"] == "kd"

    # killed after healing: the same command resumes (the arm is read back, not retrained) and measures again
    weights = (out / "heal" / "adapter" / "adapter_model.safetensors").read_bytes()
    shutil.rmtree(out / "model")
    (out / "report.json").unlink()
    assert main(_args(tiny, out, "--no-speed")) == 0
    assert (out / "heal" / "adapter" / "adapter_model.safetensors").read_bytes() == weights
    assert "speed" not in json.loads((out / "report.json").read_text())

    # the same folder with other settings is refused, nothing touched
    capsys.readouterr()
    assert main(_args(tiny, out, "--objective", "ce")) == 2
    assert "holds a compression of other settings (objective differ)" in capsys.readouterr().err

    # blocks ranked by the ablation's KL instead: the block of least KL goes
    kl = report["blocks"]["kl"]
    assert main(_args(tiny, tmp / "by-kl", "--choose", "kl", "--no-speed", "--mc-limit", "0")) == 0
    by_kl = json.loads((tmp / "by-kl" / "report.json").read_text())["blocks"]
    assert by_kl["removed"] == [int(min((n for n in kl if 1 < int(n) < 6), key=kl.get))]

    # healed with the layer after the cut trained in full beside the LoRA: counted in the report, in the folder
    assert main(_args(tiny, tmp / "full", "--full-layers", "1", "--no-speed", "--mc-limit", "0")) == 0
    full = json.loads((tmp / "full" / "report.json").read_text())
    assert len(full["healing"]["full_layers"]) == 1
    assert full["healing"]["parameters"] > report["healing"]["parameters"] + 4 * 32 * 32  # a whole layer more
    assert "full_layers" in full["settings"] and "full_layers" not in report["settings"]


@pytest.mark.integration
def test_compress_heals_on_the_models_own_conversations_and_reads_its_chat_replies(tmp_path, capsys):
    model = save_tiny(tmp_path / "model", "llama", chat=True)
    corpus = write_corpus(tmp_path / "corpus", n_docs=600)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"w{5 + i} w{6 + i} w{7 + i}" for i in range(12)) + "\n")
    out = tmp_path / "chat"
    args = ["compress", "--model", str(model), "--data", "self:12", str(corpus), "--prompts", str(prompts),
            "--preset", "quick", "--block-size", "1", "--mc-limit", "0", "--sequences", "2", "--heldout", "none",
            "--chat-prompts", "6", "--on-policy", "0.5", "--on-policy-tokens", "8", "--no-speed", "--quiet",
            "--out", str(out)]
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    h = report["healing"]
    assert h["written"]["self"]["conversations"] == 12 and h["written"]["prompts"]["conversations"] == 12
    assert h["data_weights"]["self"] == h["data_weights"]["prompts"] == 0.25
    assert sum(v for k, v in h["data_weights"].items() if k not in ("self", "prompts")) == pytest.approx(0.5)
    log = [json.loads(line) for line in (out / "heal" / "train_log.jsonl").read_text().splitlines()]
    on = [r for r in log if r.get("kind") == "train" and r.get("on_policy")]
    assert len(on) == 15 and all(r["sampled_tokens"] > 0 for r in on)  # every other step of 30
    chat = report["measured"]["chat"]
    assert chat["prompts"] == 6 and chat["methods"]["backbone"]["kl"]["mean"] == 0
    assert chat["methods"]["compressed"]["kl"]["mean"] > 0 and len(chat["methods"]["compressed"]["replies"]) == 6
    assert "Does it answer as the original does?" in (out / "report.md").read_text()
    card = (out / "model" / "README.md").read_text()  # the model card users receive with the folder
    assert card.startswith("---\nbase_model: ") and "held-out chat prompts" in card and "reskip compress" in card
    assert json.loads((out / "model" / "reskip.json").read_text())["dtype"] == "float32"  # the tiny original's
    # healed on its own conversations alone: measured on its chat replies (and held-out text when asked)
    alone = tmp_path / "alone"
    assert main(["compress", "--model", str(model), "--data", "self:200", "--preset", "quick", "--steps", "4",
                 "--block-size", "1", "--mc-limit", "0", "--heldout", "none", "--chat-prompts", "3", "--no-speed",
                 "--quiet", "--out", str(alone)]) == 0
    measured = json.loads((alone / "report.json").read_text())["measured"]
    assert measured["splits"] == {} and measured["chat"]["prompts"] == 3
    # resumed: the conversations are read back, not written again
    batches = (out / "self-data" / "batches.jsonl").read_bytes()
    (out / "report.json").unlink()
    assert main(args) == 0
    assert (out / "self-data" / "batches.jsonl").read_bytes() == batches


@pytest.mark.parametrize("extra, message", [
    (["--drop", "5"], "has 4 middle blocks"),
    (["--drop", "1", "--keep-flops", "0.8"], "give one"),
    (["--objective", "mse"], "healing objective 'mse': one of kd, rkl, jsd"),
    (["--objective", "jsd:2"], "strictly between 0 and 1"),
    (["--data", "self:0"], "self:N with N from 1"),
    (["--data", "self:20"], "20 conversations alone"),
    (["--data", "self", "self:3"], "names the model's own conversations twice"),
    (["--prompts", "MISSING"], "no such file"),
    (["--on-policy", "0.5"], "the data holds none"),
    (["--on-policy", "0.5", "--objective", "ce"], "needs a teacher"),
    (["--blocks", "1"], "name distinct middle blocks, 2 to 5"),
    (["--blocks", "3", "--drop", "1"], "give one"),
    (["--keep-flops", "0.06"], "removing every middle block of 1 layers keeps 0.333"),
    (["--params", "1000000000000"], "more than the model's own"),
    (["--block-size", "4"], "0 middle blocks"),
    (["--heldout", "CORPUS"], "part of --data"),
    (["--full-layers", "6"], "keeps at most 5 layers"),
])
def test_compress_refuses_bad_input_before_any_weights_load(tiny, tmp_path, capsys, extra, message):
    extra = [str(tiny[2]) if e == "CORPUS" else str(tmp_path / "missing.txt") if e == "MISSING" else e for e in extra]
    with pytest.raises(SystemExit) if message == "invalid choice" else _nothing():
        code = main(_args(tiny, tmp_path / "x", *extra))
        assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_compress_refuses_a_folder_it_did_not_write(tiny, tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert main(_args(tiny, tmp_path / "mine")) == 2
    assert "holds files compress did not write (notes.txt)" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _opened_in_chromium(page, tmp):
    """The HTML report as a person opens it: headless Chromium renders it, its tables hold the measured rows, and no
    console error is printed."""
    import re
    import subprocess

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("chromium is missing: the README's test command installs Debian's chromium package")
    base = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp / 'profile'}", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run(base + ["--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "data-status=\"rendered\"" in re.search(r"<body[^>]*>", dom.stdout).group(0)
    assert dom.stdout.count("<table>") >= 3 and "KL to the original" in dom.stdout and "6 -&gt; 5 layers" in dom.stdout
    assert not [line for line in dom.stderr.splitlines() if "Uncaught" in line]


def test_a_timing_taken_on_a_loaded_machine_is_marked_unreadable():
    from reskip.machine_load import load_report, spread

    assert spread([3.0, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0, "rounds": 3}
    import os

    cores = os.cpu_count() or 1
    quiet = load_report(0.1, min(cores, 2) + 0.1, threads=2)
    assert quiet["readable"] and quiet["note"] == ""
    busy = load_report(0.2, cores * 2.0 + 2, threads=1)
    assert not busy["readable"] and "rerun alone" in busy["note"]
    assert load_report(None, None, 2)["readable"]  # a system without a load average: nothing to say


@pytest.mark.parametrize("edit, message", [
    ({"num_hidden_layers": "30"}, "num_hidden_layers must be a whole number"),
    ({"hidden_size": -5}, "hidden_size must be a whole number"),
    ({"num_hidden_layers": 10**9}, "num_hidden_layers must be a whole number from 1 to 4,096"),
    ({"model_type": "nosuchfamily"}, "model_type 'nosuchfamily' is not supported"),
    ("cut weights", "cut short or corrupt"),
    ("not json", "is not valid JSON"),
])
def test_compress_refuses_a_broken_model_folder_before_any_work(tiny, tmp_path, capsys, edit, message):
    """A model folder whose config.json was edited by hand or whose weights were cut short: one line, exit 2,
    nothing written (never transformers' traceback, nor minutes of work first)."""
    model = tmp_path / "model"
    shutil.copytree(tiny[1], model)
    if edit == "cut weights":
        data = (model / "model.safetensors").read_bytes()
        (model / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif edit == "not json":
        (model / "config.json").write_text('{"model_type": "llama", ')
    else:
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, **edit}))
    args = _args(tiny, tmp_path / "out")
    args[args.index("--model") + 1] = str(model)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
def test_a_damaged_compression_says_what_is_wrong_and_keeps_the_healing(tiny, tmp_path, capsys):
    out = tmp_path / "c"
    args = _args(tiny, out, "--no-speed", "--mc-limit", "0")
    assert main(args) == 0
    weights = (out / "heal" / "adapter" / "adapter_model.safetensors").read_bytes()
    # the exported weights deleted: exported again from the kept healing, not failing the same way on every rerun
    (out / "model" / "model.safetensors").unlink()
    assert main(args) == 0 and (out / "model" / "model.safetensors").is_file()
    blocks = json.loads((out / "blocks.json").read_text())
    settings = (out / "compress.json").read_text()
    removed = json.loads((out / "report.json").read_text())["blocks"]["removed"][0]
    other = str(next(k for k in range(2, 6) if k != removed))  # blocks.json edited to choose another block
    cases = [("blocks.json", "[]", "blocks must be a list of the blocks' layers"),
             ("blocks.json", json.dumps({**blocks, "A": {k: (0.5 if k == other else 9.0) for k in blocks["A"]}}),
              "blocks.json was changed after the healing"),
             ("compress.json", "[]", "holds no compression's settings"),
             ("compress.json", None, "without its compress.json")]
    for name, text, message in cases:
        before = (out / name).read_text()
        if text is None:
            (out / name).unlink()
        else:
            (out / name).write_text(text)
        capsys.readouterr()
        assert main(args) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and "remove heal" not in err, err
        (out / name).write_text(before if name == "blocks.json" else settings)
    assert (out / "heal" / "adapter" / "adapter_model.safetensors").read_bytes() == weights
    assert main(args) == 0
