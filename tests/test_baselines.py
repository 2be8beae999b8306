"""What a user would do instead: the parameter-matched LoRA, static pruning by the backbone's own A(n), the
healed model's training and resume, its export as a plain Hugging Face folder, and `reskip experiment baselines`
end to end on a tiny model."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import FAMILIES, save_tiny, tiny_model, tiny_train_config, write_corpus
from reskip import compat
from reskip.ar_retrofit.config import RetrofitConfig
from reskip.ar_retrofit.model import retrofit
from reskip.cli import main
from reskip.compress.blocks import prune
from reskip.compress.healing_run import HealingConfig, load_healed_model
from reskip.compress.lora import add_lora, trainable_parameters
from reskip.compress.train import train_lora
from reskip.lora_ranks import lora_parameters, matched_lora_config, matched_ranks
from reskip.train_config import TrainConfig

SMOLLM2_RANK_COST = 10_176  # one rank on q, k, v, o, gate, up, down of a SmolLM2 layer: sum of (in + out)


def test_matched_ranks_meet_the_side_channel_count_on_smollm2():
    """97 ranks over 30 layers (23 at 3, 7 at 4, spread over the depth): 987,072 parameters against the
    side-channel's 982,663 at rank 64 (+0.45%, within the 2% the comparison allows)."""
    costs = [SMOLLM2_RANK_COST] * 30
    ranks = matched_ranks(costs, 982_663)
    assert sum(ranks) == 97 and sorted(set(ranks)) == [3, 4] and ranks.count(4) == 7
    assert lora_parameters(costs, ranks) == 987_072
    assert abs(lora_parameters(costs, ranks) / 982_663 - 1) < 0.005
    fours = [i for i, r in enumerate(ranks) if r == 4]
    assert fours[0] < 5 and fours[-1] > 24  # spread over the depth, not stacked at one end


def test_a_fresh_lora_is_the_model_exactly_and_counts_what_it_trains():
    model = tiny_model("llama")
    ids = torch.randint(3, 90, (2, 12))
    with torch.no_grad():
        before = model(input_ids=ids).logits
    config, acc = matched_lora_config(model, 3_000)
    peft_model = add_lora(model, config)
    with torch.no_grad():
        after = peft_model(input_ids=ids).logits
    assert torch.equal(before, after)  # B = 0 at init: an exact identity
    assert sum(p.numel() for p in trainable_parameters(peft_model)) == acc["parameters"]
    assert all(p.dtype == torch.float32 for p in trainable_parameters(peft_model))
    # only the LoRA trains, chosen by PEFT on the decoder layers' projections: the head and embeddings stay frozen
    assert not model.get_output_embeddings().weight.requires_grad


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_removing_layers_equals_skipping_them_with_and_without_the_cache(family):
    """The pruned model computes what the full model computes with those layers as identity (the retrofit's
    identity skip at c = 0), and its KV cache is indexed right: greedy generation with the cache equals it without."""
    model = tiny_model(family, init_std=0.2)
    ids = torch.randint(3, 90, (2, 10))
    wrapped = retrofit(model, RetrofitConfig(block_size=1, skip_path="identity"))
    wrapped.set_curriculum(0.0)
    with torch.no_grad(), wrapped.blocks_skipped(3, 4):  # blocks 3, 4 = layers 2, 3
        skipped = wrapped(input_ids=ids, use_cache=False).logits
    pruned = prune(wrapped.unretrofit(), {2, 3})
    assert len(compat.decoder_layers(pruned)) == 4 and pruned.config.num_hidden_layers == 4
    with torch.no_grad():
        assert torch.equal(pruned(input_ids=ids, use_cache=False).logits, skipped)
        with_cache = pruned.generate(ids[:1], max_new_tokens=6, do_sample=False, use_cache=True)
        without = pruned.generate(ids[:1], max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(with_cache, without)


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("baselines")
    return tmp, save_tiny(tmp / "model", "gemma3"), write_corpus(tmp / "corpus", n_docs=200)


def _config(tiny_data, **kw):
    _, model, corpus = tiny_data
    return tiny_train_config(model, corpus, **{"steps": 4, **kw})


def test_healed_training_resumes_to_the_same_adapter_and_exports_a_plain_model(tiny_data, tmp_path, capsys):
    """A Gemma-3 (sliding and full layers) with two layers removed and healed: a run stopped after its step-2
    checkpoint resumes to the uninterrupted run's adapter byte for byte; the export loads with
    AutoModelForCausalLM alone and gives the in-project model's logits."""
    cfg = _config(tiny_data)
    arm = HealingConfig(params=4_000, drop_layers=[2, 3], drop_blocks=[3, 4])
    whole = tmp_path / "whole"
    summary = train_lora(cfg, arm, whole, show_progress=False)
    assert summary["steps"] == 4 and summary["drop_layers"] == [2, 3]
    assert summary["ppl_full"]["end"] < summary["ppl_full"]["start"]
    stopped = tmp_path / "stopped"
    shutil.copytree(whole, stopped)
    for name in ("adapter", "summary.json", "checkpoints/step-000004"):
        p = stopped / name
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    (stopped / "checkpoints" / "latest").write_text("step-000002")
    train_lora(cfg, arm, stopped, show_progress=False)
    name = "adapter/adapter_model.safetensors"
    assert (stopped / name).read_bytes() == (whole / name).read_bytes()
    # a finished run is read back, not retrained; another config in its folder is refused
    assert train_lora(cfg, arm, whole, show_progress=False) == summary
    with pytest.raises(Exception, match="other settings"):
        train_lora(_config(tiny_data, lr=2e-2), arm, whole, show_progress=False)

    out = tmp_path / "exported"
    assert main(["export", str(whole), "--out", str(out)]) == 0
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert exported.config.num_hidden_layers == 4 and len(exported.config.layer_types) == 4
    in_project, _ = load_healed_model(whole, "float32")
    ids = torch.randint(3, 90, (2, 12))
    with torch.no_grad():
        diff = (exported(input_ids=ids).logits - in_project(input_ids=ids).logits).abs().max().item()
    assert diff < 1e-3
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask  # not safetensors' own 0600

    # an earlier export is replaced; a folder holding the user's files, the arm itself, the working folder: refused
    assert main(["export", str(whole), "--out", str(out)]) == 0
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    mine_marked = tmp_path / "marked"  # a user's folder that happens to hold a reskip.json: still theirs
    mine_marked.mkdir()
    (mine_marked / "reskip.json").write_text("{}")
    (mine_marked / "notes.txt").write_text("keep")
    compression = tmp_path / "compression"  # a compress folder's model/: its report describes what is there
    (compression / "model").mkdir(parents=True)
    (compression / "compress.json").write_text("{}")
    for target, message in ((mine, "holds files export did not write (notes.txt)"),
                            (mine_marked, "holds files export did not write (notes.txt)"),
                            (compression / "model", "inside the compression"), (whole, "the healing run's own folder"),
                            (whole / "sub", "the healing run's own folder"), (Path(""), "--out is empty"),
                            (Path.cwd(), "the working folder")):
        assert main(["export", str(whole), "--out", str(target)]) == 2
        assert message in capsys.readouterr().err
    assert (mine / "notes.txt").read_text() == "keep" and not (whole / "sub").exists()
    assert (mine_marked / "notes.txt").read_text() == "keep" and not any((compression / "model").iterdir())


def test_export_refuses_a_folder_that_is_not_a_baseline_run(tmp_path, capsys):
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "not a finished baseline run" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.integration
def test_baselines_experiment_trains_every_method_at_every_lr_and_reads_them_against_each_other(tmp_path):
    model = save_tiny(tmp_path / "model", "llama")
    corpus = write_corpus(tmp_path / "corpus", n_docs=300)
    out = tmp_path / "out"
    args = ["experiment", "baselines", "--model", str(model), "--data", str(corpus), "--out", str(out), "--preset",
            "standard", "--steps", "2", "--batch-size", "2", "--seq-len", "16", "--block-size", "1", "--rank", "8",
            "--lrs", "0.01", "0.02", "--heal", "ce", "kd", "--quiet"]
    assert main([*args, "--arms", "lora"]) == 0  # one method now: the results wait for the others
    folder = out / "experiments" / "baselines"
    assert not (folder / "results.json").exists() and (folder / "arms" / "lora@0.02" / "adapter").is_dir()
    assert main(args) == 0
    r = json.loads((folder / "results.json").read_text())
    sweep_before = r["sweep"]
    methods = ("recipe", "lora", "healed:1", "healed:2", "healed:1:kd", "healed:2:kd")
    assert set(r["sweep"]) == {f"{m}@{lr}" for m in methods for lr in ("0.01", "0.02")}
    for method, name in r["chosen"].items():  # each method's arm closest on validation to what it trains toward
        by = "val_kl" if method.endswith(":kd") else "val_ppl"
        assert r["chosen_by"][method] == by
        assert r["sweep"][name][by] == min(a[by] for a in r["sweep"].values() if a["method"] == method)
    kd_arm = r["sweep"][r["chosen"]["healed:1:kd"]]
    assert kd_arm["objective"] == "kd" and kd_arm["drop_blocks"] == r["sweep"][r["chosen"]["healed:1"]]["drop_blocks"]
    costs = r["backbone_blocks"]["A"]
    cheapest = sorted((int(n) for n in costs if 1 < int(n) < 6), key=lambda n: costs[str(n)])
    assert r["sweep"][r["chosen"]["healed:1"]]["drop_blocks"] == cheapest[:1]
    assert r["sweep"][r["chosen"]["healed:2"]]["drop_blocks"] == sorted(cheapest[:2])
    rows = r["rows"]
    # the chosen recipe run's own eval
    ev = json.loads((folder / "recipe-eval" / r["chosen"]["recipe"] / "results.json").read_text())
    assert rows["retrofit"]["ppl_ratio"]["test"] == pytest.approx(ev["methods"]["retrofit"]["ppl_ratio"], rel=1e-9)
    assert rows["static:1"]["blocks_skipped"]["test"] == 1.0 and "reskip:budget=1:held" in rows
    # per-sequence selection skips from a sequence's second step: these 16-token sequences are one 32-token step
    assert rows["sequence:1"]["blocks_skipped"] == {"test": 0, "kjv": 0} and "sequence:2" in rows
    assert {x["method"] for x in r["at_spent_compute"]["test"]} >= {"reskip:budget=1"}
    for x in r["at_spent_compute"]["kjv"]:  # kjv's baselines matched at the skips each method measured on kjv
        assert ev["heldout"]["methods"][x["static"]]["mean_skipped"] == pytest.approx(x["skipped"], abs=0.01)
        assert x["static_ppl_ratio"] == ev["heldout"]["methods"][x["static"]]["ppl_ratio"]
    assert rows["healed:2"]["blocks_skipped"] == {"test": 2, "kjv": 2}
    # the trained methods are scored in the recipe's eval, against its references: one evaluator, fidelity for all
    for key, kind in (("lora", "lora"), ("healed:1", "healed"), ("pruned:2", "pruned")):
        name = next(n for n, m in ev["methods"].items() if m["kind"] == kind and (kind != "pruned" or n == key))
        assert rows[key]["ppl_ratio"]["test"] == ev["methods"][name]["ppl_ratio"]
        assert rows[key]["kl_to_backbone"]["kjv"] == ev["heldout"]["methods"][name]["kl_to_backbone"] > 0
        assert 0 < rows[key]["top1_agreement"]["test"] < 1
    assert rows["backbone"]["kl_to_backbone"]["test"] == 0 and rows["backbone"]["top1_agreement"]["test"] == 1
    # the nearest whole number of layer-ranks: within half of one (512 parameters on this tiny llama's layer)
    assert abs(r["sweep"][r["chosen"]["lora"]]["params"] - r["target_params"]) <= 256
    for d in r["intervals"].values():
        assert d["lo"] <= d["mean"] <= d["hi"]
    fid = r["fidelity_intervals"]["kl"]
    assert {"healed:1:kd - healed:1 (kjv)", "healed:2:kd - pruned:2 (test)"} <= set(fid)
    d = fid["healed:1:kd - healed:1 (test)"]
    assert d["lo"] <= d["mean"] <= d["hi"]
    assert d["mean"] == pytest.approx(rows["healed:1:kd"]["kl_to_backbone"]["test"]
                                      - rows["healed:1"]["kl_to_backbone"]["test"], abs=1e-6)
    assert "closest to the backbone" in r["verdict"] and "KL of healing by kd minus by ce" in r["verdict"]
    assert len(r["claims"]) == 14 and "sequence:1" in r["verdict"] and "Nothing skipped, retrofit" in r["verdict"] and "on kjv" in r["verdict"]
    md = (folder / "results.md").read_text()
    assert "healed:1" in md and "The learning-rate sweep" in md
    assert (folder / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["report", str(out)]) == 0
    page = (out / "report" / "report.html").read_text()
    assert "Baselines: quality against compute" in page and "healed:1" in page

    # the recipe's variants at the same total parameters, beside the finished arms (read back, not retrained)
    assert main([*args, "--variants"]) == 0
    r = json.loads((folder / "results.json").read_text())
    assert r["variants"] == ["side+lora", "full-teacher", "backbone-teacher"]
    assert r["sweep"]["lora@0.01"] == sweep_before["lora@0.01"]
    assert TrainConfig.from_file(folder / "arms" / "backbone-teacher@0.01" / "config.yaml").full_objective == "kd"
    side = r["sweep"][r["chosen"]["side+lora"]]
    assert abs(side["params"] - r["target_params"]) <= 256  # the LoRA takes what the halved side-channel frees
    cfg = TrainConfig.from_file(folder / "arms" / "side+lora@0.01" / "config.yaml")
    assert cfg.retrofit["rank"] == 4 and cfg.retrofit["shortcut_rank"] == 4 and cfg.retrofit["inner_lora"] > 0
    assert TrainConfig.from_file(folder / "arms" / "full-teacher@0.01" / "config.yaml").skip_teacher == "full"
    assert {"side+lora / retrofit", "full-teacher / static:1"} <= set(r["rows"])
    assert "side+lora / retrofit - lora (kjv)" in r["intervals"] and len(r["claims"]) == 32  # 6 more per variant
    assert "full-teacher / reskip:budget=1" in r["verdict"]

    # where a run computes is not what it trains: asked on another device, every finished arm is read back
    recipe_cfg = TrainConfig.from_file(folder / "arms" / "recipe@0.01" / "config.yaml")
    other = "cpu" if recipe_cfg.device != "cpu" else "auto"
    assert main([*args, "--variants", "--device", other]) == 0
    assert json.loads((folder / "results.json").read_text())["sweep"] == r["sweep"]


@pytest.mark.real
def test_export_round_trip_on_the_bundled_backbone(tmp_path):
    """SmolLM2 with its block 4 removed and healed one step: the exported folder, loaded by transformers
    alone, gives the in-project model's logits within 1e-3 in float32."""
    cfg = TrainConfig(steps=1, batch_size=2, seq_len=32, eval_every=1, save_every=1, eval_sequences=1,
                      dtype="float32")
    train_lora(cfg, HealingConfig(params=982_663, drop_layers=[12, 13, 14, 15], drop_blocks=[4]), tmp_path / "run",
               show_progress=False)
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf"), "--dtype", "float32"]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    in_project, tok = load_healed_model(tmp_path / "run", "float32")
    ids = tok(["The capital of France is Paris, and the capital of Italy is"], return_tensors="pt").input_ids
    with torch.no_grad():
        diff = (exported(input_ids=ids).logits - in_project(input_ids=ids).logits).abs().max().item()
    assert exported.config.num_hidden_layers == 26 and diff < 1e-3
    # by default as its publisher ships the original: bfloat16, half the bytes, with a card naming the original
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "bf16")]) == 0
    assert json.loads((tmp_path / "bf16" / "reskip.json").read_text())["dtype"] == "bfloat16"
    size = {d: (tmp_path / d / "model.safetensors").stat().st_size for d in ("hf", "bf16")}
    assert 0.45 < size["bf16"] / size["hf"] < 0.55
    card = (tmp_path / "bf16" / "README.md").read_text()
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card and "12, 13, 14, 15" in card


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_chunked_head_ce_is_ce_of_the_logits_with_its_gradient(family):
    """`losses.head_ce` (the LoRA arms' loss, a chunk of positions at a time) equals `ce_sum` of the model's own
    logits (Gemma's soft-cap included), and so does its gradient with respect to the final hidden states."""
    from reskip.losses import ce_sum, head_ce

    model = tiny_model(family, init_std=0.2).requires_grad_(False)  # a frozen backbone, as the LoRA arms train
    model.config.final_logit_softcapping = 5.0 if family == "gemma3" else None
    ids = torch.randint(3, 90, (2, 12))
    labels = ids.clone()
    labels[0, :4] = -100
    h = compat.decoder_body(model)(input_ids=ids).last_hidden_state.detach().requires_grad_(True)
    head = compat.output_head(model)
    a = head_ce(h, head, labels, chunk=5)
    (ga,) = torch.autograd.grad(a, h)
    logits = model.lm_head(h)
    if family == "gemma3":
        logits = torch.tanh(logits / 5.0) * 5.0
    b = ce_sum(logits, labels)
    (gb,) = torch.autograd.grad(b, h)
    assert a.item() == pytest.approx(b.item(), rel=1e-5)
    assert torch.allclose(ga, gb, atol=1e-6)


def test_the_variants_a_run_includes():
    from reskip.errors import ReskipError
    from reskip.research.experiments.baselines import _variants, arm_name

    assert arm_name("lora", 0.002) == "lora@0.002" and arm_name("lora", 0.0020000001) != arm_name("lora", 0.002)
    assert _variants(None) == () and _variants([]) == ("side+lora", "full-teacher", "backbone-teacher")
    assert _variants(["full-teacher"]) == ("full-teacher",)
    with pytest.raises(ReskipError, match="no variant 'x'"):
        _variants(["x"])


@pytest.mark.integration
def test_eval_scores_trained_methods_beside_the_run_against_the_same_references(tmp_path, capsys):
    """`reskip eval` scores a LoRA arm, a healed arm, an unhealed pruning and an exported folder as methods of their
    own (one evaluator): KL to the backbone and top-1 agreement for every row, the healed arm's compute its kept
    layers, and the export the same model as its arm."""
    from helpers import tiny_trained_run

    run = tiny_trained_run(tmp_path)
    cfg = TrainConfig(model=str(tmp_path / "model"), data=[str(tmp_path / "corpus")], seq_len=16, steps=2,
                      batch_size=2, eval_every=2, save_every=2, eval_sequences=2, lr=1e-2, dtype="float32",
                      retrofit={"block_size": 2, "rank": 8})
    train_lora(cfg, HealingConfig(params=2_000), tmp_path / "lora", show_progress=False)
    train_lora(cfg, HealingConfig(params=2_000, drop_layers=[2, 3], drop_blocks=[2], objective="kd"), tmp_path / "healed",
               show_progress=False)
    assert main(["export", str(tmp_path / "healed"), "--out", str(tmp_path / "exported")]) == 0
    out = tmp_path / "ev"
    methods = ["backbone", "retrofit", f"lora:{tmp_path / 'lora'}", f"healed:{tmp_path / 'healed'}", "pruned:1",
               f"export:{tmp_path / 'exported'}"]
    assert main(["eval", "--adapter", str(run), "--methods", *methods, "--benchmarks", "none", "--sequences", "4",
                 "--generation", "6",
                 "--calib-sequences", "4", "--heldout", str(tmp_path / "corpus"), "--data",
                 str(write_corpus(tmp_path / "other", n_docs=300, seed=3)), "--quiet", "--out", str(out)]) == 0
    r = json.loads((out / "results.json").read_text())
    rows = r["methods"]
    assert [rows[m]["kind"] for m in methods] == ["backbone", "retrofit", "lora", "healed", "pruned", "export"]
    for m in methods[2:]:
        assert rows[m]["kl_to_backbone"] > 0 and 0 < rows[m]["top1_agreement"] <= 1
        assert rows[m]["margin_holds_share"] is None  # the margin check is the retrofit's own
        assert len(rows[m]["per_sequence"]["kl"]) == 4 and sum(rows[m]["per_sequence"]["positions"]) == rows[m]["tokens"]
    assert rows[f"healed:{tmp_path / 'healed'}"]["flops_executed_share"] == pytest.approx(4 / 6)
    assert rows[f"healed:{tmp_path / 'healed'}"]["mean_skipped"] == 1
    # the merged export scores as its arm does (float32 merge: the same model up to rounding)
    assert rows[f"export:{tmp_path / 'exported'}"]["kl_to_backbone"] == pytest.approx(
        rows[f"healed:{tmp_path / 'healed'}"]["kl_to_backbone"], rel=1e-3)
    assert set(r["heldout"]["methods"]) == set(rows)
    gen = r["generation"]["methods"]  # every method's greedy text beside the backbone's
    assert set(gen) == set(methods) - {"backbone"} and all(0 <= g["prefix_share"] <= 1 for g in gen.values())
    assert "same first sentence" in (out / "results.md").read_text()
    # a plain LoRA named as healed (and the reverse) is refused before any weights load
    capsys.readouterr()
    assert main(["eval", "--adapter", str(run), "--methods", f"healed:{tmp_path / 'lora'}", "--out",
                 str(tmp_path / "no")]) == 2
    assert "is a lora one: score it as lora:" in capsys.readouterr().err


def test_block_costs_read_the_ablation_as_perplexity_kl_and_influence():
    """One pass per block gives A(n), KL(backbone || block n removed) and cos(in, out); each ranks the middle
    blocks its own way, and a block whose removal costs nothing reads A = 1, KL = 0."""
    from reskip.compress.blocks import BlockCosts, backbone_block_costs
    from reskip.data.packing import Packed

    model = tiny_model("llama", init_std=0.2)
    ids = torch.randint(3, 90, (4, 16), generator=torch.Generator().manual_seed(2))
    costs = backbone_block_costs(model, Packed(ids, ids.clone(), ["x"] * 4), block_size=1)
    assert set(costs.kl) == set(costs.A) and all(v > 0 for v in costs.kl.values())
    middle = costs.middle()
    assert costs.cheapest(1, "kl") == [min(middle, key=costs.kl.get)]
    assert costs.cheapest(1, "influence") == costs.most_similar(1)
    assert BlockCosts.from_dict(costs.to_dict()) == costs
    with torch.no_grad():  # a layer whose output projections are zero is the identity: removing it costs nothing
        layer = compat.decoder_layers(model)[3]
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    costs = backbone_block_costs(model, Packed(ids, ids.clone(), ["x"] * 4), block_size=1)
    assert costs.A[4] == pytest.approx(1.0, abs=1e-6) and costs.kl[4] == pytest.approx(0.0, abs=1e-6)
    assert costs.cheapest(1, "kl") == [4]  # KL is never below 0; A may be below 1 on a random model


def test_angular_distances_find_a_layer_that_does_nothing():
    """Gromov et al.'s angular distance between layer inputs: a layer whose attention and MLP write nothing leaves
    its input's direction as it was (distance 0), so it is the cheapest single layer and the cheapest run of one;
    every distance lies in [0, 1]; the first and the last layers are never chosen."""
    from reskip.compress.blocks import layer_distances
    from reskip.data.packing import Packed

    model = tiny_model("llama", init_std=0.2)
    layer = compat.decoder_layers(model)[3]
    with torch.no_grad():
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    ids = torch.randint(3, 90, (4, 12), generator=torch.Generator().manual_seed(0))
    d = layer_distances(model, Packed(ids, ids.clone(), ["doc"] * 4), batch_size=2)
    assert d.d[3][4] == pytest.approx(0.0, abs=1e-4)
    assert all(0.0 <= d.d[a][b] <= 1.0 for a in range(6) for b in range(a + 1, 6))
    assert d.cheapest_single(1) == [3] and d.cheapest_run(1) == [3]
    assert 0 not in d.cheapest_single(4) and 5 not in d.cheapest_single(4)
    run = d.cheapest_run(3)
    assert run == list(range(run[0], run[0] + 3)) and run[0] >= 1 and run[-1] <= 4


def test_results_and_arm_folders_from_before_a_rename_read_with_todays_names(tmp_path):
    """A healed pruning's rows were `healed-static:K` before they became `healed:K` (`static:K` is the retrofit's
    skip policy): the stored baselines results read back under today's names, in keys and in strings alike, the
    report's section on them draws and tabulates the healed rows, and an experiment folder made before the rename
    keeps its finished arms (read back from their old folders, not trained again)."""
    from reskip.research.experiments.baselines import arm_folder
    from reskip.research.experiments.results_file import read_results
    from reskip.research.report.experiments import experiment_sections

    stored = Path(__file__).parents[1] / "docs" / "results" / "baselines" / "standard" / "results.json"
    assert "healed-static:1" in json.loads(stored.read_text())["rows"]  # the file as it was written
    data = read_results(stored, "rows", "intervals")
    assert {"healed:1", "healed:2", "pruned:1", "static:1"} <= set(data["rows"])
    assert "healed-static" not in json.dumps(data)
    assert any(k.endswith(" - healed:1 (test)") for k in data["intervals"])
    (tmp_path / "baselines").mkdir()
    shutil.copy(stored, tmp_path / "baselines" / "results.json")
    (title, png, _, body), = experiment_sections(tmp_path)
    assert png and "healed:1" in body and "healed-static" not in body

    arms = tmp_path / "exp" / "arms"
    (arms / "healed-static-1@0.004").mkdir(parents=True)
    assert arm_folder(tmp_path / "exp", "healed:1@0.004") == arms / "healed-static-1@0.004"
    assert arm_folder(tmp_path / "exp", "healed:2@0.004") == arms / "healed-2@0.004"  # nothing older: today's
    assert arm_folder(tmp_path / "exp", "lora@0.004") == arms / "lora@0.004"
    (arms / "healed-1@0.004").mkdir()
    assert arm_folder(tmp_path / "exp", "healed:1@0.004") == arms / "healed-1@0.004"  # today's folder wins
