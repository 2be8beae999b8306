"""Signal health and the signal test (does w_recent tell when to skip?) on tiny models."""

import numpy as np
import pytest
import torch

from helpers import tiny_model
from reskip import RetrofitConfig, retrofit
from reskip.data.packing import Packed
from reskip.losses import ce_sum, ce_tokens
from reskip.research.analysis.cost_probe import block_costs, chosen_cost, fit_probe, fit_probes, probe_features
from reskip.research.analysis.signal_health import INPUT_INDEPENDENT_RANGE, signal_health
from reskip.research.analysis.signal_test import CHOOSERS, choose_positions, signal_test
from reskip.statistics import bootstrap_difference, verdict


def test_signal_health_flags_an_input_independent_router():
    rng = np.random.default_rng(0)
    flat = 0.8 + 0.001 * rng.standard_normal(1000)
    moving = rng.uniform(0.2, 0.9, 1000)
    assert signal_health(flat, flat)["status"].startswith("INPUT-INDEPENDENT")
    ok = signal_health(moving, moving)
    assert ok["status"] == "ok" and ok["w_recent"]["range"] > INPUT_INDEPENDENT_RANGE
    assert ok["w_recent"]["p05"] < ok["w_recent"]["p95"]


def test_ce_tokens_sums_to_ce_sum():
    logits = torch.randn(2, 7, 11)
    labels = torch.randint(0, 11, (2, 7))
    labels[0, :3] = -100
    per = ce_tokens(logits, labels)
    assert per.shape == (2, 7) and torch.allclose(per.sum(), ce_sum(logits, labels))
    assert (per[:, -1] == 0).all() and (per[0, :2] == 0).all()


def test_choose_positions_takes_the_k_highest_per_row():
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.3], [4.0, 3.0, 2.0, 1.0]])
    assert choose_positions(scores, 2).tolist() == [[False, True, True, False], [True, True, False, False]]
    assert not choose_positions(scores, 0).any()


def test_bootstrap_and_verdict():
    rng = np.random.default_rng(0)
    full = rng.uniform(90, 110, 40)
    targets = np.full(40, 50.0)
    cheap, dear = full + 2 + rng.normal(0, 0.5, 40), full + 10 + rng.normal(0, 0.5, 40)
    d = bootstrap_difference(full, cheap, dear, targets)
    assert d["lo"] <= d["mean"] <= d["hi"] < 0 and verdict(d) == "signal beats random"
    assert verdict(bootstrap_difference(full, dear, cheap, targets)) == "signal worse than random"
    same = bootstrap_difference(full, cheap, cheap + rng.normal(0, 3, 40), targets)
    assert same["lo"] < 0 < same["hi"] and verdict(same) == "no difference"


@pytest.fixture(scope="module")
def tiny():
    rm = retrofit(tiny_model("llama", init_std=0.3), RetrofitConfig(block_size=2, rank=8, up_init_std=0.3))
    rm.set_curriculum(1.0)
    ids = torch.randint(3, 90, (6, 16), generator=torch.Generator().manual_seed(0))
    return rm, Packed(ids, ids.clone(), ["x"] * 6)


def test_shared_prefix_position_skip_equals_the_plain_reference(tiny):
    """The test starts block n from the full pass's h_{n-1}; that must equal recomputing blocks 1..n-1."""
    rm, data = tiny
    ids = data.input_ids[:3]
    mask = torch.zeros(ids.shape, dtype=torch.bool)
    mask[:, ::3] = True
    with torch.no_grad():
        with rm.skipping_positions({3: mask}):
            plain = rm(input_ids=ids, use_cache=False).logits
        with rm.capturing() as captured:
            rm(input_ids=ids, use_cache=False)
            cap = captured()
        with rm.continuing(cap, 2), rm.skipping_positions({3: mask}):
            shared = rm(input_ids=ids, use_cache=False).logits
    assert torch.allclose(plain, shared, atol=1e-5)


def test_signal_test_measures_every_chooser(tiny):
    rm, data = tiny
    out = signal_test(rm, data, blocks=[2, 3], window=4, rates=(0.25, 0.5), batch_size=4, n_boot=200)
    assert out["sequences"] == 6 and len(out["blocks"]) == 4
    for row in out["blocks"]:
        assert set(row["ppl_ratio"]) == set(CHOOSERS)
        # The oracle picks the positions whose own skip is cheapest: on this model it is never worse than random.
        assert row["ppl_ratio"]["oracle"] <= row["ppl_ratio"]["random"] + 1e-6
        d = row["signal_minus_random"]
        assert d["lo"] <= d["mean"] <= d["hi"]
        assert d["mean"] == pytest.approx(row["ppl_ratio"]["signal"] - row["ppl_ratio"]["random"])
    assert "p = 0.5" in out["sentence"]


def test_the_position_chooser_skips_the_latest_positions(tiny):
    """Content-blind: at rate p it is block n as identity at the last p of every sequence's positions."""
    rm, data = tiny
    out = signal_test(rm, data, blocks=[3], window=4, rates=(0.5,), n_boot=10)
    with torch.no_grad():
        mask = torch.zeros(data.input_ids.shape, dtype=torch.bool)
        mask[:, 8:] = True
        with rm.skipping_positions({3: mask}):
            logits = rm(input_ids=data.input_ids, use_cache=False).logits
        full = rm(input_ids=data.input_ids, use_cache=False).logits
    expect = torch.exp((ce_sum(logits, data.labels) - ce_sum(full, data.labels)) / (data.labels[:, 1:] != -100).sum())
    assert out["blocks"][0]["ppl_ratio"]["position"] == pytest.approx(float(expect), rel=1e-5)


def test_a_probe_learns_a_cost_that_its_features_hold():
    """The cost is a noisy linear function of one state coordinate: the chosen probe finds the cheap half
    nearly as well as the hindsight oracle, and far better than chance."""
    g = torch.Generator().manual_seed(0)
    S, T, d = 40, 32, 12
    feats = torch.randn(S, T, d + 2, generator=g)
    cost = 0.5 * feats[..., 3] + 0.05 * torch.randn(S, T, generator=g)
    labelled = torch.ones(S, T, dtype=torch.bool)
    probe = fit_probe(feats, cost, labelled)
    assert set(probe.held_out_cost) == {"ridge:0.1", "ridge:10", "ridge:1000", "ridge:100000", "mlp",
                                        "ridge:w_recent+position"}
    assert probe.held_out_cost[probe.kind] == min(probe.held_out_cost.values())
    test = torch.randn(8, T, d + 2, generator=g)
    truth = 0.5 * test[..., 3]
    got = chosen_cost(probe.predict(test), truth)
    oracle, chance = chosen_cost(truth, truth), float(truth.mean())
    assert got < chance - 0.9 * (chance - oracle)


def test_probe_features_are_what_exists_before_the_block(tiny):
    rm, data = tiny
    ids, labels = data.input_ids[:2], data.labels[:2]
    full, cap, base, costs = block_costs(rm, ids, labels, [3])
    w = full.alphas[3][..., -1].float()
    f = probe_features(cap, w, 3)
    assert f.shape == (2, 16, rm.side_channel.hidden_size + 2)
    assert torch.equal(f[..., :-2], cap.states[2].float()) and torch.equal(f[..., -2], w)
    assert f[0, :, -1].tolist() == [t / 16 for t in range(16)]
    # the cost is the oracle's: block 3 as identity everywhere, minus the full model's per-token NLL
    with torch.no_grad(), rm.blocks_skipped(3):
        skipped = ce_tokens(rm(input_ids=ids, use_cache=False).logits, labels)
    assert torch.allclose(costs[3], skipped - base, atol=1e-5)


def test_the_signal_test_takes_fitted_probes_as_one_more_chooser(tiny):
    rm, data = tiny
    probes = fit_probes(rm, data, [2, 3], window=4)
    out = signal_test(rm, data, blocks=[2, 3], window=4, rates=(0.5,), n_boot=50, probes=probes)
    assert out["choosers"] == [*CHOOSERS, "probe"] and set(out["probes"]) == {"2", "3"}
    for row in out["blocks"]:
        assert set(row["ppl_ratio"]) == {*CHOOSERS, "probe"} and set(row["captured"]) == {"signal", "probe", "position"}
        d = row["probe_minus_signal"]
        assert d["mean"] == pytest.approx(row["ppl_ratio"]["probe"] - row["ppl_ratio"]["signal"])
        headroom = row["ppl_ratio"]["random"] - row["ppl_ratio"]["oracle"]
        if headroom > 0:
            assert row["captured"]["probe"] == pytest.approx((row["ppl_ratio"]["random"] - row["ppl_ratio"]["probe"]) / headroom)


def test_signal_test_at_rate_zero_is_the_full_model(tiny):
    rm, data = tiny
    out = signal_test(rm, data, blocks=[3], window=4, rates=(0.0,), n_boot=10)
    assert all(v == pytest.approx(1.0) for v in out["blocks"][0]["ppl_ratio"].values())
