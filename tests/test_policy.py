"""Calibration, policy files and the CLI for calibrate / generate (tiny run folders)."""

import json

import pytest
import torch

from helpers import tiny_model, tiny_trained_run
from reskip import RetrofitConfig, retrofit
from reskip.cli import main
from reskip.research.calibrate.calibration import calibrate
from reskip.skip.policies import NoSkip, RandomSkip, ReSkip, StaticSkip
from reskip.skip.policy_file import PolicyError, PolicyFile, make_policy
from reskip.skip.spec import SpecError, parse_spec
from reskip.skip.window import sliding_mean


def test_sliding_mean_is_the_causal_window_mean():
    a = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])
    assert sliding_mean(a, 2).tolist() == [[1.0, 1.5, 2.5, 3.5, 4.5]]
    assert sliding_mean(a, 10).tolist() == [[1.0, 1.5, 2.0, 2.5, 3.0]]


@pytest.fixture(scope="module")
def tiny_policy():
    rm = retrofit(tiny_model("llama", init_std=0.3), RetrofitConfig(block_size=2, rank=8, up_init_std=0.3))
    rm.set_curriculum(1.0)
    ids = torch.randint(3, 90, (6, 16), generator=torch.Generator().manual_seed(0))
    from reskip.data.packing import Packed

    data = Packed(ids, ids.clone(), ["x"] * 6)
    return rm, calibrate(rm, data, delta=10.0, quantile=0.5, window=4, max_skips=1, batch_size=4), data


def test_calibration_measures_every_block(tiny_policy):
    rm, pf, data = tiny_policy
    d = pf.data
    assert [b["block"] for b in d["blocks"]] == [1, 2, 3]
    b1, b2, b3 = d["blocks"]
    assert b1["tau"] is None and not b1["eligible"] and b1["I"] is not None
    assert b3["I"] is None  # no later router reads h_3
    for b in (b2, b3):
        assert 0 <= b["tau"] <= 1 and len(b["w_recent_quantiles"]) == 101 and b["eligible"]
        assert b["w_recent_quantiles"][50] == pytest.approx(b["tau"])
    # A(n) is the ablation perplexity ratio: recompute block 2's directly, without the shared prefix.
    import math

    from reskip.losses import ce_sum

    with torch.no_grad():
        full = ce_sum(rm(input_ids=data.input_ids).logits, data.labels)
        with rm.blocks_skipped(2):
            skipped = ce_sum(rm(input_ids=data.input_ids).logits, data.labels)
    n = int((data.labels[:, 1:] != -100).sum())
    assert b2["A"] == pytest.approx(math.exp(skipped / n) / math.exp(full / n), rel=1e-4)
    assert d["ppl_full"] == pytest.approx(math.exp(full / n), rel=1e-4)
    assert d["calibration"]["tokens"] == 6 * 16
    pf.check_model(rm)


def test_every_kind_is_in_one_table_and_builds_from_it():
    """The grammar, its help and the parsing come from `spec.KINDS`; every policy kind has its builder."""
    from reskip.skip.policy_file import BUILDERS
    from reskip.skip.spec import GRAMMAR, KINDS, METHOD_GRAMMAR, METHOD_KINDS, POLICY_KINDS, grammar_help

    assert set(BUILDERS) == set(POLICY_KINDS) | {"retrofit"}
    assert set(METHOD_KINDS) == set(KINDS) and set(POLICY_KINDS) < set(METHOD_KINDS)
    assert all(KINDS[k].syntax in GRAMMAR for k in POLICY_KINDS) and all(KINDS[k].syntax in METHOD_GRAMMAR for k in KINDS)
    assert all(KINDS[k].help in grammar_help(METHOD_KINDS) for k in KINDS)
    assert GRAMMAR == "none, reskip[:Q[:M]], reskip:budget=B[:held], static:K, influence:K, sequence:K, random:P"


def test_policies_from_specs(tiny_policy):
    rm, pf, _ = tiny_policy
    assert isinstance(make_policy(parse_spec("none"), None), NoSkip)
    assert isinstance(pf.make(parse_spec("reskip")), ReSkip) and pf.make(parse_spec("reskip")).max_skips == 1
    lo, hi = pf.make(parse_spec("reskip:0.1")), pf.make(parse_spec("reskip:0.9"))
    assert all(lo.tau[n] <= hi.tau[n] for n in lo.tau)
    static = pf.make(parse_spec("static:1"))
    assert isinstance(static, StaticSkip) and static.blocks == {min((b for b in pf.data["blocks"] if b["eligible"]), key=lambda b: b["A"])["block"]}
    assert pf.make(parse_spec("influence:1")).blocks == {max(pf.data["blocks"], key=lambda b: b["cos_in_out"])["block"]}
    assert isinstance(pf.make(parse_spec("random:0.3")), RandomSkip)
    for bad in ("sometimes", "static:x", "random:2", "static:9", "influence:9"):
        with pytest.raises(PolicyError):
            pf.make(parse_spec(bad))
    with pytest.raises(PolicyError, match="needs a calibrated"):
        make_policy(parse_spec("static:1"), None)


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda d: d.pop("window"), "missing field 'window'"),
        (lambda d: d.update(window=0), "window"),
        (lambda d: d["blocks"][1].update(tau=1.5), "tau of block 2"),
        (lambda d: d["blocks"].append({**d["blocks"][1], "block": 9}), "beyond"),
        (lambda d: d["blocks"][1].pop("A"), "missing 'A'"),
        (lambda d: d.update(quantile=-0.1), "quantile"),
        (lambda d: d["blocks"][1].update(w_recent_quantiles=["a", "b"]), "w_recent_quantiles of block 2"),
        (lambda d: d["blocks"][1].update(w_recent_quantiles=[float("nan")] * 3), "w_recent_quantiles of block 2"),
        (lambda d: d["blocks"][1].update(w_recent_quantiles=[0.9, 0.1]), "ascending"),
        (lambda d: d.update(backbone=[]), "backbone must be an object"),
    ],
)
def test_bad_policy_files_get_clear_errors(tiny_policy, tmp_path, mutate, message):
    rm, pf, _ = tiny_policy
    data = json.loads(json.dumps(pf.data))
    mutate(data)
    (tmp_path / "p.json").write_text(json.dumps(data))
    with pytest.raises(PolicyError, match=message):
        PolicyFile.load(tmp_path / "p.json").check_model(rm)


def test_a_policy_file_of_the_old_tensor_names_still_serves_its_adapter(tiny_policy, tmp_path):
    """A policy file of format 2 took its side-channel digest over the tensor names before the correction's
    rename: upgraded on load, it is checked against that digest, and a file that is not of that adapter is not."""
    from reskip.skip.policy_file import PolicyFile, side_channel_digest

    rm, pf, _ = tiny_policy
    data = json.loads(json.dumps(pf.data))
    data["format_version"] = 2
    del data["adapter"]["legacy_tensor_names"]
    data["adapter"]["side_channel_digest"] = side_channel_digest(rm, legacy_names=True)
    (tmp_path / "policy.json").write_text(json.dumps(data))
    old = PolicyFile.load(tmp_path / "policy.json")
    assert old.data["adapter"]["legacy_tensor_names"] is True
    old.check_model(rm)
    data["adapter"]["side_channel_digest"] = side_channel_digest(rm)  # today's names: not what format 2 hashed
    (tmp_path / "policy.json").write_text(json.dumps(data))
    with pytest.raises(PolicyError, match="another adapter"):
        PolicyFile.load(tmp_path / "policy.json").check_model(rm)


def test_policy_refuses_another_adapter_or_backbone(tiny_policy):
    rm, pf, _ = tiny_policy
    other = retrofit(tiny_model("llama", init_std=0.3), RetrofitConfig(block_size=2, rank=8), seed=5)
    with pytest.raises(PolicyError, match="another adapter"):
        pf.check_model(other)
    qwen = retrofit(tiny_model("qwen3"), RetrofitConfig(block_size=2, rank=8))
    with pytest.raises(PolicyError, match="another backbone"):
        pf.check_model(qwen)
    # the same weights under another forward (an edited adapter_config.json): refused by name
    rm.config.variant = "observer"
    try:
        with pytest.raises(PolicyError, match="other settings .*variant"):
            pf.check_model(rm)
    finally:
        rm.config.variant = "recipe"
    pf.check_model(rm)


@pytest.fixture(scope="module")
def tiny_run_folder(tmp_path_factory):
    return tiny_trained_run(tmp_path_factory.mktemp("run"))


def test_generate_without_policy_runs_dense_and_says_so(tiny_run_folder, capsys):
    assert main(["generate", "--adapter", str(tiny_run_folder), "w5 w6 w7", "--max-new-tokens", "4"]) == 0
    captured = capsys.readouterr()
    assert "no policy.json: running dense" in captured.err
    assert "blocks skipped per step" in captured.out


def test_calibrate_then_generate_cli(tiny_run_folder, capsys):
    assert main(["calibrate", "--adapter", str(tiny_run_folder), "--sequences", "4", "--delta", "100",
                 "--quantile", "0.0", "--max-skips", "1"]) == 0
    pf = json.loads((tiny_run_folder / "policy.json").read_text())
    assert pf["max_skips"] == 1 and pf["calibration"]["data"]["split"] == "calib"
    capsys.readouterr()
    assert main(["generate", "--adapter", str(tiny_run_folder), "w5 w6 w7", "--max-new-tokens", "5"]) == 0
    out = capsys.readouterr().out
    counts = out.strip().splitlines()[-2].split()
    assert len(counts) == 5 and all(c in ("0", "1") for c in counts) and "1" in counts  # quantile 0: skips
    assert main(["generate", "--adapter", str(tiny_run_folder), "w5", "--policy", "bogus:3"]) == 2
    assert "unknown policy" in capsys.readouterr().err


def test_calibrate_refuses_bad_flags_before_loading(tiny_run_folder, capsys):
    assert main(["calibrate", "--adapter", str(tiny_run_folder), "--window", "0"]) == 2
    assert "--window" in capsys.readouterr().err
    assert main(["calibrate", "--adapter", str(tiny_run_folder), "--quantile", "1.5"]) == 2


def test_a_held_budget_keeps_its_rate_where_fixed_thresholds_drift():
    """Calibrated on w_recent ~ U(0, 1) to skip block 4 at a quarter of the steps: on a source whose w_recent
    runs higher (U(0.3, 1.3)) the fixed threshold skips about half the steps, the held one a quarter once its
    window has turned over; on the calibration's own distribution both skip a quarter."""
    import random

    from reskip.skip.policies import HeldReSkip, ReSkip

    grid = [i / 100 for i in range(101)]
    rng = random.Random(0)

    def rate(policy, shift, n=4000):
        return sum(policy.skip(4, rng.random() + shift, 0, j) for j in range(n)) / n

    fixed = ReSkip(tau={4: 0.75}, eligible={4}, max_skips=1)
    assert rate(fixed, 0.0) == pytest.approx(0.25, abs=0.03)
    assert rate(fixed, 0.3) == pytest.approx(0.55, abs=0.03)
    held = HeldReSkip(tau={4: 0.75}, eligible={4}, max_skips=1, share={4: 0.25}, seed_values={4: grid})
    assert rate(held, 0.0) == pytest.approx(0.25, abs=0.03)
    assert rate(held, 0.3) == pytest.approx(0.25, abs=0.03)
    assert not held.pure and held.reads_signal(4) and not held.skip(4, 9.0, 1, 0)  # the per-step cap still holds


def test_held_budget_specs_parse_and_build_from_the_frontier(tiny_policy):
    from reskip.skip.policies import HeldReSkip

    spec = parse_spec("reskip:budget=1:held")
    assert spec.budget == 1.0 and spec.held and not parse_spec("reskip:budget=1").held
    for bad in ("reskip:budget=1:hold", "reskip:budget=1:held:2"):
        with pytest.raises(SpecError):
            parse_spec(bad)
    _, pf, _ = tiny_policy
    pf = PolicyFile(json.loads(json.dumps(pf.data)))
    pf.data["budgets"] = {"frontier": [{"budget": 1.0, "blocks": {"2": {"fraction": 0.5, "tau": 0.3},
                                                                  "3": {"fraction": 1.0, "tau": None}}}]}
    held = make_policy(spec, pf)
    assert isinstance(held, HeldReSkip) and held.name == "reskip:budget=1:held"
    fixed = pf.budget(1.0)
    assert held.tau == fixed.tau == {2: 0.3} and held.always == fixed.always == {3} and held.share == {2: 0.5}
    grid = pf.blocks[2]["w_recent_quantiles"]  # the window starts as calibration's distribution, thinned evenly
    assert len(held.recent[2]) == held.span and held.recent[2][0] == grid[0] and held.recent[2][-1] == grid[-1]
    assert sorted(held.recent[2]) == list(held.recent[2])


def test_per_sequence_selection_decides_once_from_the_first_step():
    """sequence:K: nothing skipped at the first step; then the K blocks whose first-step w_recent lies highest in
    their own calibration distribution, at every later step; chosen anew for the next sequence."""
    from reskip.skip.policies import SequenceSkip

    grids = {2: [i / 100 for i in range(101)], 3: [0.5 + i / 200 for i in range(101)], 4: [0.0] * 50 + [1.0] * 51}
    pol = SequenceSkip(1, {2, 3, 4}, grids, {2: 1.2, 3: 1.1, 4: 1.3}, name="sequence:1")
    # w = 0.6 is block 2's 60th percentile but block 3's 20th; block 4's grid puts it at 50%
    assert [pol.skip(n, 0.6, 0, 0) for n in (2, 3, 4)] == [False] * 3
    assert [[pol.skip(n, 0.0, 0, j) for n in (2, 3, 4)] for j in (1, 2, 3)] == [[True, False, False]] * 3
    pol.new_sequence()
    for n, w in ((2, 0.1), (3, 0.99), (4, 0.2)):
        pol.skip(n, w, 0, 0)
    assert [pol.skip(n, 0.0, 0, 1) for n in (2, 3, 4)] == [False, True, False]
    assert not pol.pure and pol.reads_signal(3) and not pol.reads_signal(1)


def test_per_sequence_selection_on_a_model(tiny_policy):
    """On a tiny retrofit, scored by the runtime: the first chunk skips nothing, every later chunk exactly K
    blocks, the same ones within a sequence; each sequence's choice is the top-K percentile of its first chunk."""
    from reskip.skip.scoring import score

    rm, pf, data = tiny_policy
    spec = parse_spec("sequence:1")
    assert spec.k == 1 and parse_spec("sequence:0").k == 0
    for bad in ("sequence:1.5", "sequence:", "sequence:-1"):
        with pytest.raises(SpecError):
            parse_spec(bad)
    with pytest.raises(PolicyError, match="eligible"):
        pf.make(parse_spec("sequence:9"))
    pol = pf.make(spec)
    for i in range(3):
        _, trace = score(rm, data.input_ids[i : i + 1], pol, 4, 4)
        assert trace[0].skipped == [] and all(len(t.skipped) == 1 for t in trace[1:])
        assert len({tuple(t.skipped) for t in trace[1:]}) == 1
        pct = {n: sum(g < trace[0].w_recent[n] for g in pf.blocks[n]["w_recent_quantiles"]) for n in pol.eligible}
        assert pct[trace[1].skipped[0]] == max(pct.values())
