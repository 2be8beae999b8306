"""Nested depths: one LoRA trained at several depths of one backbone, each distilled from the whole backbone. The
student's depth is put back exactly after every pass; the schedule gives each depth its share; a trained nested arm
scores at every depth through the one evaluator (depth 0 is the backbone, bit for bit), exports the plain model of
one depth, and refuses a depth it does not serve."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import FAMILIES, save_tiny, tiny_model, tiny_train_config, write_corpus
from reskip import compat
from reskip.cli import main
from reskip.compress.healing_run import HealingConfig, load_healed_model
from reskip.compress.train import train_lora
from reskip.evaluate.against_backbone import Reference
from reskip.skip.spec import METHOD_KINDS, parse_specs
from reskip.train.schedules import nested_depth


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_student_at_a_depth_is_the_pruned_model_and_leaves_the_whole_model_as_it_was(family):
    model = tiny_model(family, init_std=0.2)
    ids = torch.randint(3, 90, (2, 12), generator=torch.Generator().manual_seed(0))
    types = list(getattr(model.config, "layer_types", None) or [])
    with torch.no_grad():
        whole = model(input_ids=ids, use_cache=False).logits
        with compat.layers_removed(model, {1, 3}):
            inside = model(input_ids=ids, use_cache=False).logits
            assert model.config.num_hidden_layers == 4 and len(compat.decoder_layers(model)) == 4
        after = model(input_ids=ids, use_cache=False).logits
        a = model.generate(ids[:1], max_new_tokens=4, do_sample=False, use_cache=True)
        b = model.generate(ids[:1], max_new_tokens=4, do_sample=False, use_cache=False)
    assert torch.equal(after, whole) and not torch.allclose(inside, whole)
    assert model.config.num_hidden_layers == 6 and list(getattr(model.config, "layer_types", None) or []) == types
    assert [layer.self_attn.layer_idx for layer in compat.decoder_layers(model)] == list(range(6))
    assert torch.equal(a, b)
    pruned = tiny_model(family, init_std=0.2)
    compat.remove_layers(pruned, {1, 3})
    with torch.no_grad():
        assert torch.equal(pruned(input_ids=ids, use_cache=False).logits, inside)


def test_every_depth_once_in_each_cycle_and_the_same_on_resume():
    for depths in (1, 2, 3):
        drawn = [nested_depth(step, 0, depths) for step in range(30)]
        for c in range(10):
            assert sorted(drawn[c * depths:(c + 1) * depths]) == list(range(1, depths + 1))
        assert drawn == [nested_depth(step, 0, depths) for step in range(30)]
    assert [nested_depth(s, 0, 3) for s in range(30)] != [nested_depth(s, 1, 3) for s in range(30)]


@pytest.fixture(scope="module")
def nested_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nested")
    model, corpus = save_tiny(tmp / "model", "llama"), write_corpus(tmp / "corpus", n_docs=200)
    cfg = tiny_train_config(model, corpus, steps=6, eval_every=3, save_every=3, lr=2e-2)
    arm = HealingConfig(params=3_000, objective="kd", nested_blocks=[3, 5], nested_layers=[[2], [4]])
    summary = train_lora(cfg, arm, tmp / "nested", show_progress=False)
    return tmp, cfg, arm, summary


def test_a_nested_arm_trains_at_each_depth_and_validates_every_depth(nested_run):
    tmp, _, _, summary = nested_run
    log = [json.loads(line) for line in (tmp / "nested" / "train_log.jsonl").read_text().splitlines()]
    depths = [r["depth"] for r in log if r["kind"] == "train"]
    assert sorted(depths) == [1, 1, 1, 2, 2, 2]
    assert set(summary["kl_depth"]) == {"1", "2"} and summary["nested_blocks"] == [3, 5]
    assert summary["kl_full"]["end"] == pytest.approx(sum(summary["kl_depth"].values()) / 2)
    assert summary["kl_depth"]["1"] < summary["kl_depth"]["2"]  # one layer fewer is closer to the backbone


def test_a_nested_arm_opens_at_a_depth_as_the_student_trained_there(nested_run):
    """The LoRA of every kept layer stays on that layer: the model opened at depth k gives the logits the trainer's
    student gave at depth k (the whole model with the LoRA, those layers left out for the pass)."""
    from reskip.compress.objectives import HealingObjective

    tmp, _, arm, _ = nested_run
    ids = torch.randint(3, 90, (2, 12), generator=torch.Generator().manual_seed(3))
    at_depth = {}
    for k in (1, 2):
        model, _ = load_healed_model(tmp / "nested", "float32", depth=k)
        with torch.no_grad():
            at_depth[k] = model(input_ids=ids, use_cache=False).logits
    from peft import PeftModel

    from reskip.backbones.loading import load_backbone

    base, _ = load_backbone(str(tmp / "model"), "float32", device="cpu")
    peft = PeftModel.from_pretrained(base, tmp / "nested" / "adapter")
    student = HealingObjective(peft, "kd")
    for k in (1, 2):
        with torch.no_grad(), student.student(arm.layers_at(k)):
            assert torch.equal(peft(input_ids=ids, use_cache=False).logits, at_depth[k])


def test_a_nested_arm_scores_at_every_depth_and_exports_one(nested_run, capsys):
    tmp, cfg, _, _ = nested_run
    run = tmp / "nested"
    ref = Reference.load(cfg.model, "float32", "cpu", False, block_size=1)
    specs = parse_specs([f"nested:{k}:{run}" for k in range(3)], METHOD_KINDS)
    methods = ref.methods({s.text: s for s in specs})
    rows = ref.score(methods, {"test": list(cfg.data)}, 3, 16, show=lambda _: None)["test"]["rows"]
    at = [rows[f"nested:{k}:{run}"] for k in range(3)]
    assert at[0]["kl_to_backbone"] == 0 and at[0]["top1_agreement"] == 1  # depth 0: the backbone itself
    assert [r["mean_skipped"] for r in at] == [0, 1, 2]
    assert 0 < at[1]["kl_to_backbone"] < at[2]["kl_to_backbone"]
    assert at[2]["flops_executed_share"] == pytest.approx(4 / 6)

    out = tmp / "depth-1"
    assert main(["export", str(run), "--out", str(out), "--depth", "1"]) == 0
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    record = json.loads((out / "reskip.json").read_text())
    assert exported.config.num_hidden_layers == 5 and record["drop_layers"] == [2] and record["drop_blocks"] == [3]
    in_project, _ = load_healed_model(run, "float32", depth=1)
    ids = torch.randint(3, 90, (2, 12))
    with torch.no_grad():
        assert (exported(input_ids=ids).logits - in_project(input_ids=ids).logits).abs().max() < 1e-4
    capsys.readouterr()
    for argv, message in ((["--depth", "3"], "serves depths 0 to 2"), ([], "say which depth")):
        assert main(["export", str(run), "--out", str(tmp / "no"), *argv]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp / "no").exists()


def test_a_nested_arm_is_refused_under_another_kind_before_any_weights_load(nested_run, capsys, tmp_path):
    from reskip.evaluate.scorers import check_model_spec

    tmp, *_ = nested_run
    run = tmp / "nested"
    for text, message in ((f"healed:{run}", f"is a nested one: score it as nested:K:{run}"),
                          (f"nested:5:{run}", "serves depths 0 to 2")):
        with pytest.raises(Exception, match=message.replace(":", ".")[:30]):
            check_model_spec(parse_specs([text], METHOD_KINDS)[0])


def test_the_nested_and_stacked_experiments_compare_with_what_a_user_would_do_instead(tmp_path):
    """`experiment nested`: one nested LoRA and a kd-healed model per depth, scored against the backbone at each
    depth with intervals; `experiment stacked`: the retrofit on the exported kd-1 model, ReSkip on top at budgets
    between the static points, compared with the original against the per-sequence mixture of kd-1 and kd-2 at the
    same layer FLOPs."""
    model = save_tiny(tmp_path / "model", "llama")
    corpus = write_corpus(tmp_path / "corpus", n_docs=300)
    out = tmp_path / "out"
    common = ["--model", str(model), "--data", str(corpus), "--out", str(out), "--preset", "standard", "--steps", "3",
              "--batch-size", "2", "--seq-len", "16", "--block-size", "1", "--rank", "8", "--quiet"]
    assert main(["experiment", "nested", *common, "--lrs", "0.02", "--depths", "2", "--arms", "kd-1"]) == 0
    folder = out / "experiments" / "nested"
    assert not (folder / "results.json").exists() and (folder / "arms" / "kd-1@0.02" / "adapter").is_dir()
    assert main(["experiment", "nested", *common, "--lrs", "0.02", "--depths", "2", "--nested-sum"]) == 0
    r = json.loads((folder / "results.json").read_text())
    assert r["variants"] == ["nested", "nested-sum"] and r["training"]["steps_per_arm"]["nested-sum"] == 6
    assert len(r["claims"]) == 4
    order = r["nested_blocks"]
    kl = r["backbone_blocks"]["kl"]
    assert order == sorted((n for n in map(int, kl) if 1 < n < 6), key=lambda n: kl[str(n)])[:2]
    for split in ("test", "kjv"):
        rows = r["rows"][split]
        assert rows["nested:0"]["kl_to_backbone"] == 0 and rows["nested:0"]["top1_agreement"] == 1
        for k in (1, 2):
            assert rows[f"nested:{k}"]["mean_skipped"] == rows[f"kd-{k}"]["mean_skipped"] == k
            d = r["minus_separate"]["nested"][split][str(k)]
            assert d["kl"]["mean"] == pytest.approx(rows[f"nested:{k}"]["kl_to_backbone"]
                                                    - rows[f"kd-{k}"]["kl_to_backbone"], abs=1e-6)
            assert d["kl_ratio"]["lo"] <= d["kl_ratio"]["mean"] <= d["kl_ratio"]["hi"]
    assert "Fidelity to the backbone at each depth (kjv)" in (folder / "results.md").read_text()

    assert main(["experiment", "stacked", *common, "--variants", "backbone-teacher"]) == 0
    s = json.loads((out / "experiments" / "stacked" / "results.json").read_text())
    assert s["variants"] == ["recipe", "backbone-teacher"] and len(s["claims"]) == 6
    kd_config = (out / "experiments" / "stacked" / "run-backbone-teacher" / "config.yaml").read_text()
    assert "full_objective: kd" in kd_config
    ev = json.loads((out / "experiments" / "stacked" / "eval" / "results.json").read_text())
    assert ev["meta"]["reference"] == str(model) and ev["methods"]["reference"]["kl_to_backbone"] == 0
    assert ev["methods"]["backbone"]["kl_to_backbone"] > 0  # the healed model the retrofit stands on, scored too
    assert ev["methods"]["retrofit"]["flops_executed_share"] == pytest.approx(5 / 6)  # 5 layers of the original 6
    assert [p["budget"] for p in s["points"]["recipe"]["test"]] == [0.25, 0.5, 0.75]
    for split in ("test", "kjv"):
        for p in s["points"]["recipe"][split] + s["points"]["backbone-teacher"][split]:
            assert 0 <= p["mixture_share_kd2"] <= 1
            assert p["minus_mixture"]["kl"]["mean"] == pytest.approx(p["kl"] - p["mixture_kl"], abs=1e-6)
    assert s["signal_test"] is None or s["signal_test"]["blocks"]

    assert main(["experiment", "frontier", *common]) == 0
    f = json.loads((out / "experiments" / "frontier" / "results.json").read_text())
    policy = json.loads((out / "experiments" / "frontier" / "recipe-backbone-teacher" / "policy.json").read_text())
    assert policy["budgets"]["objective"] == "kl"
    config = (out / "experiments" / "frontier" / "recipe-backbone-teacher" / "config.yaml").read_text()
    assert "full_objective: kd" in config
    for split in ("test", "kjv"):
        points = f["splits"][split]
        assert points["backbone"]["kind"] == "static" and points["kd-2"]["kind"] == "static"
        assert {"nested:1", "nested:2", "nested-sum:2"} <= set(points) and any(n.startswith("stacked ") for n in points)
        assert any(n.startswith("stacked-backbone-teacher reskip:budget=") for n in points)
        assert any(n.startswith("backbone-teacher reskip:budget=") for n in points)
        assert points["nested:2"]["family"] == "nested" and points["kd-2"]["family"] == "static"
        assert {p["family"] for n, p in points.items() if n.startswith("stacked ")} == {"stacked"}
        for p in points.values():
            if "minus_mixture" in p:
                assert p["minus_mixture"]["kl"]["mean"] == pytest.approx(p["kl_to_backbone"] - p["mixture"]["kl"],
                                                                         abs=1e-6)
    assert (out / "experiments" / "frontier" / "frontier.png").stat().st_size > 1000
    assert "Fidelity against compute (kjv)" in (out / "experiments" / "frontier" / "results.md").read_text()

    assert main(["experiment", "depth-request", *common]) == 0
    d = json.loads((out / "experiments" / "depth-request" / "results.json").read_text())
    assert d["signal"] in ("prompt_nll", "prompt_entropy", "prompt_gap") and d["prompt_tokens"] == 4
    assert d["variant"] == "nested-sum"
    for split in ("test", "kjv"):
        rows = d["splits"][split]
        assert [r["target"] for r in rows] == [0.5, 1.0, 1.5]
        for r in rows:
            assert r["oracle"]["kl"] <= r["mixture"]["kl"] + 1e-9  # hindsight is the ceiling at the same mean
            assert 0 <= r["mean_depth"] <= 2
            m = r["routed_minus_mixture"]["kl"]
            assert m["mean"] == pytest.approx(r["routed"]["kl"] - r["mixture"]["kl"], abs=1e-6)
        whole = next(r for r in rows if r["target"] == 1.0)
        assert whole["routed"]["kl"] == pytest.approx(whole["mixture"]["kl"])  # a whole depth: no choice to make
    g = d["generation"]
    assert g["prompts"] == 16 and all(0 <= r["prefix_share"]["routed"] <= 1 for r in g["targets"])


def test_generate_serves_a_nested_arm_at_a_depth(nested_run, capsys):
    tmp, *_ = nested_run
    run = tmp / "nested"
    assert main(["generate", str(run), "w3 w4 w5", "--depth", "1", "--max-new-tokens", "3", "--raw"]) == 0
    assert "depth 1, 5 of 6 layers run at every step (1 removed)" in capsys.readouterr().out
    for argv, message in ((["--depth", "3"], "serves depths 0 to 2"), ([], "say which depth")):
        assert main(["generate", str(run), "w3", *argv]) == 2
        assert message in capsys.readouterr().err


def test_the_lm_eval_plug_in_serves_an_arm_and_reads_its_arguments_once(nested_run):
    """`--model reskip-healed`: a nested arm at a depth as its merged plain model; bad model_args are one clear error
    each, before any weights load, and the console entry point turns them into one line and exit 2."""
    import subprocess
    import sys

    pytest.importorskip("lm_eval")
    from reskip.errors import ReskipError
    from reskip.evaluate.lm_eval_model import ReskipHealedLM, ReskipLM

    tmp, *_ = nested_run
    run = str(tmp / "nested")
    lm = ReskipHealedLM(run=run, depth="1", dtype="float32", batch_size=1)
    assert lm.model.config.num_hidden_layers == 5
    for kwargs, message in (({"depth": "abc"}, "depth=abc: a whole number"), ({"depth": "7"}, "serves depths 0 to 2"),
                            ({"depth": "1", "dtype": "float16"}, "dtype=float16: one of"),
                            ({"depth": "1", "device": "mps"}, "--device mps"), ({"run": ""}, "needs run=RUN")):
        with pytest.raises(ReskipError, match=message):
            ReskipHealedLM(**{"run": run, **kwargs})
    with pytest.raises(ReskipError, match="needs adapter=RUN"):
        ReskipLM()
    with pytest.raises(ReskipError, match="window=0: a whole number >= 1"):
        ReskipLM(adapter=run, window="0")
    proc = subprocess.run([sys.executable, "-m", "reskip.evaluate.lm_eval_model", "--model", "reskip-healed",
                           "--model_args", f"run={run},depth=abc", "--tasks", "hellaswag"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "error: --model_args depth=abc: a whole number >= 0"


def test_a_stopped_nested_arm_resumes_to_the_same_adapter(nested_run, tmp_path):
    """The depth of each step is a pure function of the step: a run stopped after its step-3 checkpoint resumes to
    the uninterrupted run's adapter, byte for byte."""
    import shutil

    tmp, cfg, arm, _ = nested_run
    stopped = tmp_path / "stopped"
    shutil.copytree(tmp / "nested", stopped)
    for name in ("adapter", "summary.json", "checkpoints/step-000006"):
        p = stopped / name
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    (stopped / "checkpoints" / "latest").write_text("step-000003")
    train_lora(cfg, arm, stopped, show_progress=False)
    name = "adapter/adapter_model.safetensors"
    assert (stopped / name).read_bytes() == (tmp / "nested" / name).read_bytes()
