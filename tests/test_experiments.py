"""`reskip experiment`: each experiment end to end on a tiny random model (the real thing, in seconds),
its files, its verdicts' logic, and the report's section."""

import json
import math
import shutil

import pytest

from helpers import save_tiny, write_corpus
from reskip.cli import main

pytestmark = pytest.mark.integration  # whole commands end to end

TINY = ["--steps", "4", "--batch-size", "4", "--seq-len", "16", "--eval-every", "2", "--calib-sequences", "4",
        "--test-sequences", "4", "--block-size", "2", "--rank", "8", "--quiet"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("experiments")
    model = save_tiny(tmp / "model", "llama")
    corpus = write_corpus(tmp / "corpus", n_docs=300)
    return tmp, model, corpus


def _run(tiny, name, *extra):
    tmp, model, corpus = tiny
    out = tmp / "out"
    assert main(["experiment", name, "--model", str(model), "--data", str(corpus), "--out", str(out), *TINY, *extra]) == 0
    folder = out / "experiments" / name
    return json.loads((folder / "results.json").read_text()), folder


def test_variants_trains_every_arm_alike_and_states_each_claim(tiny):
    r, folder = _run(tiny, "variants")
    assert list(r["arms"]) == ["recipe", "observer", "observer_source_loss", "interpolate", "gamma_free"]
    curves = {n: a["curve"] for n, a in r["arms"].items()}
    assert all([e["step"] for e in c] == [0, 2, 4] for c in curves.values())  # the whole curve, not its end
    assert len({a["training"]["tokens"] for a in r["arms"].values()}) == 1
    assert {a["retrofit"]["variant"] for a in r["arms"].values()} == {"recipe", "observer", "interpolate", "gamma_free"}
    # the observer pair differs only in the signal term: the document's loss against reskip's
    assert r["arms"]["observer_source_loss"]["train"] == {"lambda_signal": 0.0} and r["arms"]["observer"]["train"] == {}
    # c = 0 at step 0: the recipe, observers and interpolate are the backbone there; gamma_free is not
    for n in ("recipe", "observer", "observer_source_loss", "interpolate"):
        assert curves[n][0]["ppl"] == pytest.approx(curves[n][0]["ppl_backbone"], rel=1e-6), n
    assert curves["gamma_free"][0]["ppl"] != curves["gamma_free"][0]["ppl_backbone"]
    # observer never changes the forward pass: its retrofit is the backbone at every step
    for n in ("observer", "observer_source_loss"):
        assert all(e["ppl"] == pytest.approx(e["ppl_backbone"], rel=1e-6) for e in curves[n])
    assert len(r["claims"]) == 5 and all(c["verdict"] in ("held", "did not hold", "undecided") for c in r["claims"])
    # the skip-branch KL at the first and last validations only: an arm's A(n) is its calibration's
    log = [json.loads(x) for x in (folder / "arms" / "recipe" / "train_log.jsonl").read_text().splitlines()]
    assert [("skip_kl" in e) for e in log if e["kind"] == "eval"] == [True, False, True]
    md = (folder / "results.md").read_text()
    assert "| claim | what was measured | verdict |" in md and "gamma_free" in md
    # run again: the finished arms are read back, not retrained
    files = sorted((folder / "arms").glob("*/arm.json"))
    assert len(files) == 5
    before = [f.stat().st_mtime_ns for f in files]
    again, _ = _run(tiny, "variants")
    assert [f.stat().st_mtime_ns for f in files] == before
    assert again["claims"] == r["claims"]


def test_arms_run_in_separate_calls_and_the_last_writes_the_results(tiny, capsys):
    """--arms: two calls (as two processes sharing OUT would) train two arms each; the first writes no results,
    the second, finding every arm finished, writes them; arms are named by name or folder slug."""
    tmp, model, corpus = tiny
    out = tmp / "armsout"
    args = ["experiment", "variants", "--model", str(model), "--data", str(corpus), "--out", str(out), *TINY[:-1]]
    folder = out / "experiments" / "variants"
    assert main([*args, "--arms", "observer", "recipe"]) == 0
    said = capsys.readouterr().out
    assert "not finished yet: observer_source_loss, interpolate, gamma_free" in said and "results.json waits" in said
    assert sorted(p.parent.name for p in (folder / "arms").glob("*/arm.json")) == ["observer", "recipe"]
    assert not (folder / "results.json").exists() and not (folder / "arms" / "interpolate").exists()
    first = (folder / "arms" / "recipe" / "arm.json").stat().st_mtime_ns
    assert main([*args, "--arms", "gamma_free", "interpolate", "observer-source-loss"]) == 0
    r = json.loads((folder / "results.json").read_text())
    assert list(r["arms"]) == ["recipe", "observer", "observer_source_loss", "interpolate", "gamma_free"]
    assert len(r["claims"]) == 5
    assert (folder / "arms" / "recipe" / "arm.json").stat().st_mtime_ns == first  # read back, not retrained
    # the same arms as one call trains them: the experiment's figures do not depend on how it was split
    whole, _ = _run(tiny, "variants")
    assert [a["final_ppl"] for a in r["arms"].values()] == [a["final_ppl"] for a in whole["arms"].values()]
    assert r["claims"] == whole["claims"]


def _two_part_corpus(folder):
    """Two sources (files `alpha.txt`, `beta.txt`), each cut into many documents at blank lines; the parts
    draw words from different halves of the vocabulary, so a single-part arm really trains on less."""
    import random

    from helpers import VOCAB

    rng = random.Random(3)
    folder.mkdir(parents=True, exist_ok=True)
    for name, lo, hi in (("alpha", 2, VOCAB // 2), ("beta", VOCAB // 2, VOCAB - 1)):
        paras = [" ".join(f"w{rng.randrange(lo, hi)}" for _ in range(rng.randrange(60, 100))) for _ in range(2500)]
        (folder / f"{name}.txt").write_text("\n\n".join(paras))
    return folder


def test_mix_trains_each_part_alone_and_measures_on_the_whole_mix(tiny):
    tmp, model, _ = tiny
    corpus = _two_part_corpus(tmp / "parts")
    out = tmp / "mixout"
    assert main(["experiment", "mix", "--model", str(model), "--data", str(corpus), "--out", str(out), *TINY]) == 0
    r = json.loads((out / "experiments" / "mix" / "results.json").read_text())
    assert list(r["arms"]) == ["whole mix", "alpha only", "beta only"]
    assert r["arms"]["alpha only"]["train"] == {"data_weights": {"alpha": 1.0}}
    # one validation set for every arm: the backbone's perplexity on it is the same number
    assert len({a["ppl_backbone"] for a in r["arms"].values()}) == 1
    assert len(r["claims"]) == 2 and "Entropy share per block" in (out / "experiments" / "mix" / "results.md").read_text()
    # the narrow arms did train on different sequences: their routing differs from the whole mix's
    assert r["arms"]["alpha only"]["final_ppl"] != r["arms"]["whole mix"]["final_ppl"]
    # `variants` in the same folder: its recipe is the whole mix's configuration, so it is not trained again
    assert main(["experiment", "variants", "--model", str(model), "--data", str(corpus), "--out", str(out), *TINY]) == 0
    v = json.loads((out / "experiments" / "variants" / "results.json").read_text())
    recipe, whole = v["arms"]["recipe"], r["arms"]["whole mix"]
    assert recipe["reused_from"].endswith("whole-mix") and recipe["curve"] == whole["curve"]
    assert recipe["signal_test"] == whole["signal_test"] and recipe["arm"] == "recipe"
    assert not (out / "experiments" / "variants" / "arms" / "recipe" / "train_log.jsonl").exists()
    assert all("reused_from" not in a for n, a in v["arms"].items() if n != "recipe")  # the rejected designs differ


def test_mix_needs_a_mix(tiny, capsys):
    tmp, model, _ = tiny
    one = tmp / "one"
    one.mkdir()
    (one / "only.txt").write_text("\n\n".join("w5 w6 w7 " * 30 for _ in range(200)))
    assert main(["experiment", "mix", "--model", str(model), "--data", str(one), "--out", str(tmp / "o1"), *TINY]) == 2
    assert "needs a mix of sources" in capsys.readouterr().err
    assert not (tmp / "o1").exists()


def test_block_size_measures_each_size_at_the_same_layers_skipped(tiny):
    tmp, model, corpus = tiny
    out = tmp / "bsout"
    assert main(["experiment", "block-size", "--model", str(model), "--data", str(corpus), "--out", str(out), *TINY,
                 "--boundaries", "1,4"]) == 0
    r = json.loads((out / "experiments" / "block-size" / "results.json").read_text())
    # the tiny model has 6 layers: sizes that leave no middle block are left out, with the reason
    assert list(r["arms"]) == ["2 layers", "boundaries 1,4"]
    assert set(r["left_out"]) == {"3 layers", "4 layers", "6 layers"} and "no middle block" in r["left_out"]["3 layers"]
    blocks = {n: a["layers_per_block"] for n, a in r["arms"].items()}
    assert blocks["2 layers"] == [2, 2, 2] and blocks["boundaries 1,4"] == [1, 3, 2]
    # the frontier is calibrated in blocks chosen to skip the same layers: 2 layers is 1 block of 2, 2/3 of 3
    frontier = r["arms"]["2 layers"]["frontier"]
    assert frontier and frontier[0]["budget"] == 1.0
    assert len(r["claims"]) == 1  # no 4-layer arm: only "every size works" can be stated
    # its claims are about perplexity and the frontier: no signal test, and the table says so
    assert all(a["signal_test"] is None for a in r["arms"].values())
    assert "not measured" in (out / "experiments" / "block-size" / "results.md").read_text()


def test_placement_answers_the_incident_with_a_measured_reconstruction(tiny):
    tmp, model, corpus = tiny
    out = tmp / "plout"
    # 16 tokens x d 32 x 2 bytes = 1 KiB a state: a 3 KiB limit keeps 3 of the 7 states
    assert main(["experiment", "placement", "--model", str(model), "--data", str(corpus), "--out", str(out),
                 "--seq-len", "16", "--context", "16", "--memory-bytes", "3072", "--calib-sequences", "40",
                 "--test-sequences", "8", "--quiet"]) == 0
    r = json.loads((out / "experiments" / "placement" / "results.json").read_text())
    assert r["this_model"]["feasible_states"] == 3 and r["source_instance"]["feasible_states"] == 8
    s = r["settings"]["the memory limit at context 16"]
    assert s["placements"]["uniform"]["kept"] == [0, 2, 4]
    assert set(r["settings"]) == {"the memory limit at context 16", "the source instance's share of depth",
                                  "half the source instance's share"}
    probe = s["placements"]["uniform"]["reconstruction"]
    assert len(probe) == 4 and all(-10 < p["r2_fit"] <= 1 for p in probe)
    # the fit from the bracketing states can only help over copying the one below, on the fitting tokens; on
    # test tokens it should too for a smooth residual stream, and this tiny one is
    assert s["placements"]["uniform"]["mean_r2_fit"] > s["placements"]["uniform"]["mean_r2_copy"]
    # the document's own answers for its instance: 8 states every 6 absorb the incident; 4 every 12 leave 6 layers
    assert [c["verdict"] for c in r["claims"][:2]] == ["held", "held"]
    assert r["source_instance"]["placements"]["uniform"]["kept"] == [0, 6, 12, 18, 24, 30, 36, 42]


def test_report_shows_every_experiment_of_the_folder(tiny):
    """`reskip report OUT` on a folder holding only experiments: a section per experiment with its verdicts
    and a figure of the arms' curves (the earlier tests of this module wrote variants and placement)."""
    tmp, model, corpus = tiny
    out = tmp / "out"
    if not (out / "experiments" / "variants" / "results.json").is_file():
        _run(tiny, "variants")
    assert main(["report", str(out)]) == 0
    page = (out / "report" / "report.html").read_text()
    assert "Experiment: variants (preset quick)" in page
    assert "<td>held</td>" in page or "<td>did not hold</td>" in page
    assert "gamma_free" in page and "data:image/png;base64" in page
    assert (out / "report" / "experiment_variants_curves.png").is_file()


def test_every_experiment_is_one_module_behind_one_table():
    import inspect

    from reskip.research.experiments.options import EXPERIMENTS
    from reskip.research.experiments.run import MODULES

    assert tuple(MODULES) == EXPERIMENTS
    for name, module in MODULES.items():
        assert list(inspect.signature(module.run).parameters) == ["options", "folder", "show"], name


def test_arms_get_ten_validations_unless_told():
    from reskip.research.experiments.arm_set import base_config as _base
    from reskip.research.experiments.options import ExperimentOptions

    assert _base(ExperimentOptions(preset="quick"), check=False).eval_every == 3  # 30 steps
    assert _base(ExperimentOptions(preset="standard"), check=False).eval_every == 10  # 100 steps
    assert _base(ExperimentOptions(overrides={"eval_every": 7}), check=False).eval_every == 7


def test_interpolation_is_judged_over_the_ramp_only():
    """The quick preset's interpolation arm rose 16.7 -> 30.9 while c(t) went 0 -> 1 and then recovered at
    c = 1; over the whole curve Spearman(c, ppl) read -0.06. The verdict reads the ramp only."""
    from reskip.research.experiments.variants import _ramp, claims

    c = [0.0, 0.29, 0.64, 1.0, 1.0, 1.0]
    def arm(ppl):
        return {"curve": [{"step": 3 * i, "c": ci, "ppl": p} for i, (ci, p) in enumerate(zip(c, ppl))],
                "worst_ppl": max(ppl), "worst_step": 3 * ppl.index(max(ppl)), "final_ppl": ppl[-1],
                "ppl_backbone": ppl[0], "spearman_I_vs_A": None,
                "signal_test": {"rates": [0.5], "blocks": []}}
    assert [e["step"] for e in _ramp(arm([1] * 6)["curve"])] == [0, 3, 6, 9]
    arms = {"recipe": arm([16.7, 15.9, 15.7, 15.2, 15.1, 14.4]), "observer": arm([16.7] * 6),
            "observer_source_loss": arm([16.7] * 6),
            "interpolate": arm([16.7, 18.0, 23.5, 30.9, 25.0, 19.1]), "gamma_free": arm([16.7, 15.6, 15.2, 14.7, 14.6, 14.5])}
    verdicts = [x["verdict"] for x in claims(arms)]
    assert verdicts[0] == "held" and verdicts[1] == "did not hold"


def test_arms_table_median_is_the_mix_verdicts_median():
    """results.md's "median w_recent 5-95% range" is the statistic `mix`'s verdict reads: with an even number of
    middle blocks, the mean of the two middle values (it once printed the upper one: 0.0182 beside 0.0169)."""
    from reskip.research.experiments.mix import routing_summary
    from reskip.research.experiments.record import arms_table

    ranges = [0.0259, 0.0156, 0.0137, 0.0149, 0.0184, 0.0182]  # the standard recipe's blocks 2-7
    blocks = {"1": {"A": 9.0, "w_recent_range": None, "entropy_ratio": None}}
    blocks |= {str(n): {"A": 1.5, "w_recent_range": r, "entropy_ratio": 0.8} for n, r in enumerate(ranges, start=2)}
    blocks["8"] = {"A": 9.0, "w_recent_range": 0.0106, "entropy_ratio": 0.8}
    arm = {"blocks": blocks, "n_blocks": 8, "params": 1, "worst_ppl": 2.0, "worst_step": 0, "final_ppl": 1.5,
           "final_kl": 0.1, "signal_test": None}
    assert routing_summary(arm)["spread"] == pytest.approx((0.0156 + 0.0182) / 2)
    assert "| 0.0169 |" in arms_table({"recipe": arm})[2]


def test_scale_runs_the_main_job_per_preset_and_tables_every_finished_arm(tiny):
    """Each arm is a whole pipeline run at one preset; the results read every finished arm's files: the frontier
    against the matched baselines with a bootstrap interval, the headroom per block, the goals, the verdict."""
    tmp, model, corpus = tiny
    out = tmp / "scale-out"
    args = ["experiment", "scale", "--model", str(model), "--data", str(corpus), "--out", str(out), "--steps", "2",
            "--batch-size", "2", "--seq-len", "16", "--block-size", "2", "--rank", "8", "--quiet"]
    assert main([*args, "--arms", "standard"]) == 0
    folder = out / "experiments" / "scale"
    arm = folder / "arms" / "model-standard"
    state = json.loads((arm / "pipeline.json").read_text())
    assert state["preset"] == "standard" and state["finished"][-1] == "report"
    r = json.loads((folder / "results.json").read_text())
    assert list(r["scale_arms"]) == ["model-standard"]
    a = r["scale_arms"]["model-standard"]
    assert a["tokens"] == 2 * 2 * 16 and a["train_wall_s"] > 0 and a["kjv_ppl_ratio"] > 0
    ev = json.loads((arm / "eval" / "results.json").read_text())
    for split, methods in (("test", ev["methods"]), ("kjv", ev["heldout"]["methods"])):
        rows = a["frontier"][split]
        assert [row["budget"] for row in rows] == [1.0, 1.5, 2.0, 3.0][: len(rows)] and rows
        for row in rows:
            assert row["reskip"] == methods[f"reskip:budget={row['budget']:g}"]["ppl_ratio"]
            d = row["reskip_minus_static"]
            assert d["lo"] <= d["mean"] <= d["hi"]
            assert d["mean"] == pytest.approx(row["reskip"] - row["static"], abs=1e-9)
    # the per-sequence NLLs the interval is drawn from add up to each method's perplexity
    for m in ev["methods"].values():
        seq = m["per_sequence"]
        assert len(seq["nll"]) == len(seq["targets"]) == 16
    back = ev["methods"]["backbone"]["per_sequence"]
    assert ev["methods"]["backbone"]["ppl"] == pytest.approx(math.exp(sum(back["nll"]) / sum(back["targets"])))
    policy = json.loads((arm / "policy.json").read_text())
    middle = [b["A"] for b in policy["blocks"] if 1 < b["block"] < len(policy["blocks"])]
    assert a["best_middle_block"]["A"] == min(middle)
    assert len(r["claims"]) == 4 and all(c["verdict"] in ("held", "did not hold", "undecided") for c in r["claims"])
    assert "0.0M tokens" in r["verdict"]
    md = (folder / "results.md").read_text()
    assert "ReSkip - static [95% CI]" in md and "captured by alpha" in md
    # a finished arm is read back, not rerun; another arm's folder (another preset or backbone) joins the table
    before = (arm / "pipeline.json").stat().st_mtime_ns
    assert main([*args, "--arms", "standard"]) == 0
    assert (arm / "pipeline.json").stat().st_mtime_ns == before
    other = folder / "arms" / "model-long"
    shutil.copytree(arm, other)
    state["preset"] = "long"
    (other / "pipeline.json").write_text(json.dumps(state))
    assert main([*args, "--arms", "standard"]) == 0
    r = json.loads((folder / "results.json").read_text())
    assert set(r["scale_arms"]) == {"model-long", "model-standard"}
    assert r["scale_arms"]["model-long"]["preset"] == "long" and "model-long" in (folder / "results.md").read_text()
    assert main(["report", str(out)]) == 0
    page = (out / "report" / "report.html").read_text()
    assert "Experiment scale" in page and "captured by alpha" in page


def test_a_results_file_edited_or_cut_is_one_error_naming_it(tmp_path):
    """An experiment's results.json, an arm's arm.json or an evaluation's results.json edited to [] or {} is refused
    by name and with what is missing, never a KeyError or AttributeError further on."""
    from reskip.errors import ReskipError
    from reskip.research.experiments.results_file import read_results

    path = tmp_path / "results.json"
    for text, missing in (("[]", "methods, heldout missing"), ("{}", "methods, heldout missing"),
                          ('{"methods": {}}', "(heldout missing)")):
        path.write_text(text)
        with pytest.raises(ReskipError, match=missing.replace("(", r"\(").replace(")", r"\)")):
            read_results(path, "methods", "heldout")
    path.write_text('{"methods": {}, "heldout": {}}')
    assert read_results(path, "methods", "heldout") == {"methods": {}, "heldout": {}}
