"""The skip runtimes with their state on the device (`skip.device_runtime`) take the host runtimes' decisions
exactly, and read values back to the host only where Python branches (counted on a simulated device)."""

import pytest
import torch
from transformers import DynamicCache

from helpers import VOCAB, batch, tiny_model
from reskip import RetrofitConfig, retrofit
from reskip.compat import cache_kwarg
from reskip.skip.policies import HeldReSkip, NoSkip, RandomSkip, ReSkip, SequenceSkip, StaticSkip
from reskip.skip.scoring import generate, score, score_rows
from simulated_device import SimulatedDevice


@pytest.fixture(scope="module")
def rm():
    model = retrofit(tiny_model("llama", init_std=0.3), RetrofitConfig(block_size=1, rank=8, up_init_std=0.3))
    model.set_curriculum(1.0)
    return model


def _signal(rm, ids) -> dict[int, list[float]]:
    _, trace = score(rm, ids, ReSkip({n: 2.0 for n in range(2, 7)}, set(range(2, 7)), 6), 3, chunk_size=2,
                     on_device=False)
    return {n: sorted(t.w_recent[n] for t in trace) for n in range(2, 7)}


def _policies(rm, ids):
    seen = _signal(rm, ids)
    median = {n: v[len(v) // 2] for n, v in seen.items()}  # ties with an observed value: the strict > is tested
    grids = {n: v for n, v in seen.items()}
    # makers: a policy with state (a held window, a counter, a draw) starts afresh for each runtime
    return [NoSkip, lambda: ReSkip(median, {2, 3, 4, 5}, 2),
            lambda: ReSkip(median, {3, 4, 5, 6}, 1, always=frozenset({6})),
            lambda: HeldReSkip(median, {2, 4, 5}, 2, share={2: 0.5, 4: 0.3, 5: 0.5}, seed_values=grids),
            lambda: SequenceSkip(2, {2, 3, 4, 5}, grids, {n: 1.0 for n in grids}),
            lambda: StaticSkip({3}, partial=5, fraction=0.5), lambda: RandomSkip(0.4, {2, 4, 6}, seed=3)]


def _same_traces(a, b) -> None:
    assert [(t.step, t.start, t.length, t.skipped, list(t.w_recent.items())) for t in a] == \
           [(t.step, t.start, t.length, t.skipped, list(t.w_recent.items())) for t in b]


def test_one_decision_for_the_batch_as_the_host_runtime(rm):
    ids, mask = batch(seed=4, bsz=3, seq=10, pad=True)
    skipped = 0
    for make in _policies(rm, ids):
        for chunk, track_all in ((2, False), (1, True), (None, False)):
            runs = [score(rm, ids, make(), 3, chunk_size=chunk, attention_mask=mask, track_all=track_all,
                          on_device=on) for on in (False, True)]
            (z_host, host), (z_dev, dev) = runs
            _same_traces(host, dev)
            assert torch.equal(z_host, z_dev)
            skipped += sum(len(t.skipped) for t in host)
    assert skipped > 0


def test_each_row_deciding_for_itself_as_the_host_runtime(rm):
    ids = torch.randint(3, VOCAB, (4, 12), generator=torch.Generator().manual_seed(5))
    seen = _signal(rm, ids)
    median = {n: v[len(v) // 2] for n, v in seen.items()}
    for policy in (ReSkip(median, {2, 3, 4, 5}, 2), ReSkip(median, {2, 3}, 1, always=frozenset({3})), NoSkip()):
        for chunk in (3, 12):
            z_host, host = score_rows(rm, ids, policy, 3, chunk, on_device=False)
            z_dev, dev = score_rows(rm, ids, policy, 3, chunk, on_device=True)
            for a, b in zip(host, dev):
                _same_traces(a, b)
            # a block every row skips is left out on the host and run as the identity on the device: equal
            assert torch.equal(z_host, z_dev)


def _decode_reads(rm, policy, on_device: bool) -> tuple[int, int]:
    """(host reads in reskip's runtimes and depth pass per decoded token, tokens) over 6 one-token steps."""
    ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    sim = SimulatedDevice().put(rm)
    with sim, torch.no_grad(), rm.skipping(policy, 3, on_device=on_device):
        cache = DynamicCache()
        for t in range(ids.shape[1]):
            rm(input_ids=ids[:, t : t + 1].to(torch.device("cpu")), use_cache=True, **{cache_kwarg(): cache})
    loop = sum(k for where, k in sim.syncs.items() if where.startswith(("skip/", "ar_retrofit/")))
    return loop, ids.shape[1]


def test_no_host_read_per_block_in_a_decode_step(rm):
    """Six blocks; the host runtime reads every tracked block's alpha at every step. On the device: nothing for a
    policy that reads no signal, nothing once the step's cap is reached, one value where Python must branch."""
    never = ReSkip({n: 2.0 for n in range(2, 7)}, set(range(2, 7)), 5)  # reads blocks 2..6, never skips
    capped = ReSkip({n: -1.0 for n in range(2, 7)}, set(range(2, 7)), 1)  # skips block 2, then the cap holds
    assert _decode_reads(rm, never, on_device=False) == (5 * 6, 6)
    assert _decode_reads(rm, never, on_device=True) == (5 * 6, 6)  # five branch points, one value each
    assert _decode_reads(rm, capped, on_device=False) == (5 * 6, 6)
    assert _decode_reads(rm, capped, on_device=True) == (1 * 6, 6)  # after block 2 nothing is read
    assert _decode_reads(rm, StaticSkip({3}), on_device=True) == (0, 6)
    assert _decode_reads(rm, NoSkip(), on_device=True) == (0, 6)


def test_rows_on_the_device_read_nothing_in_the_block_loop(rm):
    ids = torch.randint(3, VOCAB, (4, 12), generator=torch.Generator().manual_seed(5))
    policy = ReSkip({n: 0.0 for n in range(2, 7)}, set(range(2, 7)), 2)
    sim = SimulatedDevice().put(rm)
    with sim:
        _, traces = score_rows(rm, ids, policy, 3, 1, on_device=True)  # 12 steps of one token
    assert sum(k for where, k in sim.syncs.items() if where.startswith(("skip/", "ar_retrofit/"))) == 1  # the traces
    assert any(t.skipped for tr in traces for t in tr)


def test_generation_on_the_device_runtime(rm):
    ids = torch.randint(3, VOCAB, (1, 5), generator=torch.Generator().manual_seed(2))
    policy = ReSkip({n: 0.3 for n in range(2, 7)}, {2, 3, 4}, 1)
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    host, t_host = generate(rm, ids, policy, 3, on_device=False, **kw)
    dev, t_dev = generate(rm, ids, policy, 3, on_device=True, **kw)
    assert torch.equal(host, dev)
    _same_traces(t_host, t_dev)
