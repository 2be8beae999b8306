"""Budgeted calibration (calibrate/budget.py), the reskip:budget=B and fractional static specs, matched
compute and the held-out evaluation."""

import json
import math

import pytest
import torch
from transformers import LlamaForCausalLM

from helpers import tiny_model, tiny_trained_run, write_corpus
from reskip import RetrofitConfig, retrofit
from reskip.cli import main
from reskip.data.packing import Packed
from reskip.evaluate.methods import Method, evaluate_methods, matched_methods, parse_methods
from reskip.research.calibrate.budget import (
    allocation_at,
    calibrate_budgets,
    chunk_ends,
    greedy_path,
    static_at,
    step_positions,
    threshold,
)
from reskip.research.calibrate.calibration import calibrate
from reskip.research.calibrate.run import format_policy
from reskip.skip.policies import RandomSkip, ReSkip, StaticSkip, plan
from reskip.skip.policy_file import PolicyError
from reskip.skip.scoring import score
from reskip.skip.spec import METHOD_KINDS, Spec, SpecError, parse_spec


def test_chunk_ends_and_step_positions():
    assert chunk_ends(10, 4).tolist() == [3, 7, 9]
    assert chunk_ends(8, 1).tolist() == list(range(8))
    steps = torch.tensor([[True, False, True]])
    assert step_positions(steps, 10, 4).tolist() == [[True] * 4 + [False] * 4 + [True] * 2]


def test_threshold_selects_the_share():
    values = torch.arange(100, dtype=torch.float32) / 100
    tau = threshold(values, 0.25)
    assert int((values > tau).sum()) == 25
    assert threshold(values, 1.0) is None  # every step: no threshold


def test_greedy_path_takes_the_cheapest_skips_first():
    # block 2: skipping its top half is nearly free, the rest is dear; block 3: linear and moderate.
    points = {2: [(0.0, 0.0), (0.5, 0.01), (1.0, 0.50)], 3: [(0.0, 0.0), (0.5, 0.10), (1.0, 0.20)]}
    path = greedy_path(points)
    budgets = [sum(a.values()) for a, _ in path]
    assert budgets == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert path[1][0] == {2: 0.5, 3: 0.0}  # slope 0.02 first
    assert path[2][0] == {2: 0.5, 3: 0.5} or path[2][0] == {2: 0.5, 3: 1.0}
    shares, cost = allocation_at(path, 0.25)  # half of the first move
    assert shares == {2: 0.25, 3: 0.0} and cost == pytest.approx(0.005)
    assert allocation_at(path, 2.5) is None  # more than every block
    assert allocation_at(path, 2.0)[0] == {2: 1.0, 3: 1.0}
    # static: whole blocks of lowest whole-block cost, then the next at the remaining share
    assert static_at(points, 1.0) == {3: 1.0, 2: 0.0}
    assert static_at(points, 1.5) == {3: 1.0, 2: 0.5}
    assert static_at(points, 2.5) is None


def test_greedy_path_jumps_over_a_dear_level():
    # block 2's first level is dear but its whole removal is cheap per skipped block: one move to 1.0
    points = {2: [(0.0, 0.0), (0.5, 0.4), (1.0, 0.1)], 3: [(0.0, 0.0), (0.5, 0.3), (1.0, 0.6)]}
    path = greedy_path(points)
    assert path[1][0] == {2: 1.0, 3: 0.0}


def test_budget_and_fractional_specs():
    s = parse_spec("reskip:budget=1.5")
    assert s.kind == "reskip" and s.budget == 1.5 and s.quantile is None
    assert parse_spec("static:1.5").k == 1.5 and parse_spec("static:2").k == 2
    assert isinstance(parse_spec("static:2").k, int)
    assert parse_spec("budgets", METHOD_KINDS).kind == "budgets"
    for bad, message in (("reskip:budget=x", "cannot read budget"), ("reskip:budget=-1", "must be >= 0"),
                         ("reskip:budget=1:2", "no further arguments"), ("static:-1", "must be >= 0")):
        with pytest.raises(SpecError, match=message):
            parse_spec(bad)
    with pytest.raises(SpecError, match="unknown policy"):
        parse_spec("budgets")  # a method of `reskip eval`, not a policy


def test_fractional_static_mixes_k_and_k_plus_one_blocks():
    policy = StaticSkip({4}, partial=2, fraction=0.25)
    steps = [[n for n in (2, 3, 4) if policy.skip(n, 0.0, 0, s)] for s in range(8)]
    assert [len(x) for x in steps].count(2) == 2 and [len(x) for x in steps].count(1) == 6
    assert all(4 in x for x in steps)
    assert sum(len(x) for x in steps) / 8 == 1.25
    # The mix runs on across sequences: four sequences of 3 steps skip block 2 at 3 of 12 steps
    # (restarting at each sequence, floor(3 x 0.25) = 0 per sequence, it would never skip it).
    policy = StaticSkip(set(), partial=2, fraction=0.25)
    per_sequence = [sum(policy.skip(2, 0.0, 0, s) for s in range(3)) for _ in range(4)]
    assert sum(per_sequence) == 3 and per_sequence != [0, 0, 0, 0]


@pytest.fixture(scope="module")
def budgeted():
    """A tiny 4-block retrofit with a live side-channel, its policy file and budget frontier."""
    cfg = tiny_model("llama").config
    cfg.num_hidden_layers = 8
    torch.manual_seed(0)
    base = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in base.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    rm = retrofit(base.eval(), RetrofitConfig(block_size=2, rank=8, up_init_std=0.3))
    rm.set_curriculum(1.0)
    ids = torch.randint(3, 90, (6, 24), generator=torch.Generator().manual_seed(0))
    data = Packed(ids, ids.clone(), ["x"] * 6)
    pf = calibrate(rm, data, delta=100.0, window=4, max_skips=2, batch_size=4)
    pf.data["budgets"] = calibrate_budgets(rm, data, (0.5, 1, 1.5, 2, 5), window=4, chunk_size=8)
    pf.validate(rm.n_blocks)
    return rm, pf, data


def test_frontier_is_what_eval_measures(budgeted):
    """Each stored point's measured loss and skips are what `reskip eval` gets with reskip:budget=B on
    the same data, and it is never worse than the static allocation it was compared with."""
    rm, pf, data = budgeted
    b = pf.data["budgets"]
    assert [p["budget"] for p in b["frontier"]] == [0.5, 1.0, 1.5, 2.0] and b["unreachable"] == [5.0]
    assert b["curves_wall_s"] > 0 and all(p["wall_s"] > 0 for p in b["frontier"])  # where calibration's time goes
    assert pf.data["calibration"]["wall_s"] > 0 and "calibration wall time: blocks" in format_policy(pf)
    # f = 1 is the whole block removed: its cost is log A(n) from the ordinary calibration
    for n, pts in b["curves"].items():
        assert pts[-1]["share"] == 1.0
        assert pts[-1]["cost"] == pytest.approx(math.log(pf.blocks[int(n)]["A"]), abs=1e-5)
    specs = [parse_spec(f"reskip:budget={p['budget']:g}") for p in b["frontier"]]
    methods = [Method("retrofit", parse_methods([parse_spec("none")], pf)[0].policy, parse_spec("none"))]
    methods += parse_methods(specs, pf)
    res = evaluate_methods(rm, data, methods, window=4, chunk_size=8)
    for p in b["frontier"]:
        r = res[f"reskip:budget={p['budget']:g}"]
        assert r["mean_skipped"] == pytest.approx(p["measured"]["mean_skipped"])
        assert r["ppl"] / res["retrofit"]["ppl"] == pytest.approx(p["measured"]["ppl_ratio"], rel=1e-4)
        assert abs(p["measured"]["mean_skipped"] - p["budget"]) < 0.25  # the refit thresholds meet it
        st = p["candidates"].get("static")
        if st is not None:
            assert p["measured"]["ce"] <= st["measured"]["ce"] + 1e-12
    whole = {p["budget"]: p for p in b["frontier"]}[2.0]["candidates"]["static"]["blocks"]
    assert all(blk["tau"] is None and blk["fraction"] == 1.0 for blk in whole.values())  # static:2 is whole blocks


def test_planned_decisions_are_the_runtime_s(budgeted):
    """`plan` asks a signal-free policy what the runtime would, in its order: the planned steps are the
    trace of scoring with the policy itself, sequence after sequence (a fractional mix's counter and a
    random draw run on), and a policy that reads a signal has no plan."""
    rm, pf, data = budgeted
    make = [lambda: StaticSkip({3}, partial=2, fraction=0.4), lambda: RandomSkip(0.5, {2, 3}, seed=1),
            lambda: ReSkip({}, {2, 3}, 1, always=frozenset({2, 3}))]
    for new in make:
        planned, scored = new(), new()
        for i in range(3):
            steps = plan(planned, rm.n_blocks, 3).steps
            _, trace = score(rm, data.input_ids[i : i + 1], scored, window=4, chunk_size=8)
            assert steps == [frozenset(t.skipped) for t in trace]
    assert plan(ReSkip({2: 0.5}, {2}, 1), rm.n_blocks, 3) is None


def test_identical_decisions_are_scored_once_with_the_same_figures(budgeted):
    """static:{3} and a budget that always drops block 3 take the same decisions: evaluated together the
    second is not scored again (its wall time is a lookup), and every figure equals that of each method
    evaluated on its own, bit for bit; a fractional mix and random run on as if scored."""
    rm, pf, data = budgeted

    def methods():
        return [Method("backbone", None, Spec("backbone", "backbone")),
                Method("static", StaticSkip({3}), Spec("static", "static", k=1)),
                Method("always", ReSkip({}, {3}, 1, always=frozenset({3})), Spec("reskip", "always")),
                Method("mix", StaticSkip(set(), partial=3, fraction=0.5), Spec("static", "mix", k=0.5)),
                Method("random", RandomSkip(0.3, {2, 3}), Spec("random", "random", p=0.3))]

    together = evaluate_methods(rm, data, methods(), window=4, chunk_size=8)
    for m in methods()[1:]:
        alone = evaluate_methods(rm, data, [methods()[0], m], window=4, chunk_size=8)[m.name]
        assert {k: v for k, v in alone.items() if k != "wall_s"} == \
            {k: v for k, v in together[m.name].items() if k != "wall_s"}, m.name
    assert together["always"]["wall_s"] < together["static"]["wall_s"] / 10
    assert together["mix"]["mean_skipped"] == 0.5


def test_budget_spec_errors_name_the_stored_budgets(budgeted):
    _, pf, _ = budgeted
    with pytest.raises(PolicyError, match=r"it has 0.5, 1, 1.5, 2"):
        pf.budget(0.75)
    bare = type(pf)({k: v for k, v in pf.data.items() if k != "budgets"})
    with pytest.raises(PolicyError, match="--budgets"):
        bare.budget(1.0)


def test_matched_methods_use_fractional_static(budgeted):
    _, pf, _ = budgeted
    names = [m.name for m in matched_methods(pf, 1.37)]
    assert names[:2] == ["static:1.37", "influence:1.37"] and names[2].startswith("random:")
    st = matched_methods(pf, 1.37)[0].policy
    assert len(st.blocks) == 1 and st.partial is not None and st.fraction == pytest.approx(0.37)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("budgetrun")
    held = write_corpus(tmp / "held", n_docs=200, seed=7)
    return tiny_trained_run(tmp), held


def test_cli_budgets_eval_heldout_and_generate(tiny_run, capsys):
    run, held = tiny_run
    card = (run / "adapter" / "README.md").read_text()  # the model card training wrote: no frontier yet
    assert "library_name: reskip" in card and "## Measured (validation split)" in card and "Calibrated" not in card
    assert main(["calibrate", "--adapter", str(run), "--sequences", "4", "--delta", "100", "--budgets", "0.5,1",
                 "--chunk-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "budget frontier" in out
    policy = json.loads((run / "policy.json").read_text())
    assert [p["budget"] for p in policy["budgets"]["frontier"]] == [0.5, 1.0]
    card = (run / "adapter" / "README.md").read_text()  # calibration added its frontier to the card
    assert "## Calibrated skip policy" in card and "| 0.5 |" in card and "## Measured" in card
    assert main(["eval", "--adapter", str(run), "--sequences", "3", "--chunk-size", "4", "--quiet", "--benchmarks",
                 "--methods", "backbone", "retrofit", "budgets", "matched", "--heldout", str(held)]) == 0
    res = json.loads((run / "eval" / "results.json").read_text())
    assert {"reskip:budget=0.5", "reskip:budget=1"} <= set(res["methods"])
    assert any(r.get("matched") for r in res["methods"].values())
    held_res = res["heldout"]
    assert set(res["methods"]) <= set(held_res["methods"]) and held_res["data"] == [str(held)]
    for name, r in held_res["methods"].items():
        if name in res["methods"]:
            assert r.get("matched", False) == res["methods"][name].get("matched", False)
        else:  # static, influence and random matched anew at the skips each ReSkip point spends on this source
            assert r["matched"]
            if name.startswith("static:"):
                assert any(float(name.split(":")[1]) == round(m["mean_skipped"], 2)
                           for n, m in held_res["methods"].items() if n.startswith("reskip"))
    assert "Held-out source" in (run / "eval" / "results.md").read_text()
    assert main(["generate", "hello", "--adapter", str(run), "--policy", "reskip:budget=1", "--max-new-tokens", "4"]) == 0
    assert main(["generate", "hello", "--adapter", str(run), "--policy", "reskip:budget=3"]) == 2
    assert "no budget 3" in capsys.readouterr().err


def test_cli_refuses_bad_budgets_before_loading(tiny_run, capsys):
    run, held = tiny_run
    for bad in ("x", "0", "1,-2"):
        assert main(["calibrate", "--adapter", str(run), "--budgets", bad]) == 2
        assert "--budgets" in capsys.readouterr().err
    assert main(["eval", "--adapter", str(run), "--heldout", str(run / "nothing-here")]) == 2


def test_a_frontier_calibrated_for_fidelity_is_what_eval_measures_as_kl(budgeted):
    """`budget_objective: kl`: each point's thresholds minimise KL to the backbone; its stored KL and skips are what
    `reskip eval` measures with reskip:budget=B, and the chosen candidate is the one closer to the backbone."""
    rm, pf, data = budgeted
    b = calibrate_budgets(rm, data, (0.5, 1, 1.5), window=4, chunk_size=8, objective="kl")
    assert b["objective"] == "kl"
    pf.data["budgets"] = b
    specs = [parse_spec(f"reskip:budget={p['budget']:g}") for p in b["frontier"]]
    backbone = Method("backbone", None, Spec("backbone", "backbone"))
    res = evaluate_methods(rm, data, [backbone, *parse_methods(specs, pf)], window=4, chunk_size=8)
    for p in b["frontier"]:
        r = res[f"reskip:budget={p['budget']:g}"]
        assert r["kl_to_backbone"] == pytest.approx(p["measured"]["kl_to_backbone"], rel=1e-4)
        assert r["mean_skipped"] == pytest.approx(p["measured"]["mean_skipped"])
        assert p["measured"]["cost"] == min(c["measured"]["cost"] for c in p["candidates"].values())
    for pts in b["curves"].values():
        assert pts[-1]["cost"] > 0  # removing a block moves the model away from the backbone
    with pytest.raises(ValueError, match="one of ppl, kl"):
        calibrate_budgets(rm, data, (1,), window=4, chunk_size=8, objective="nll")
