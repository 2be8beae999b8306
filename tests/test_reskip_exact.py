"""ReSkip execution: exact KV cache for skipped blocks, against a cache-free reference."""

import pytest
import torch
from transformers import DynamicCache

from helpers import VOCAB, batch, tiny_model
from reskip import RetrofitConfig, retrofit
from reskip.ar_retrofit.kv_cache import append_kv, reference_logits
from reskip.compat import cache_kwarg
from reskip.skip.policies import NoSkip, PlannedSkip, RandomSkip, ReSkip, SkipPolicy, StaticSkip
from reskip.skip.scoring import generate, score, score_planned, score_planned_whole, score_rows

EXACT_FAMILIES = ["llama", "qwen3", "gemma3", "qwen2", "mistral"]


@pytest.mark.parametrize("family", EXACT_FAMILIES)
def test_append_kv_caches_what_the_familys_attention_caches(family):
    model = tiny_model(family)
    ids, _ = batch(pad=False)
    seen = {}
    j = 4  # a sliding-window layer for gemma3 (layer types s, s, f, s, s, f)

    def grab(module, args, kwargs):
        seen["hidden"], seen["kwargs"] = args[0] if args else kwargs["hidden_states"], dict(kwargs)

    handle = model.model.layers[j].register_forward_pre_hook(grab, with_kwargs=True)
    real = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, use_cache=True, **{cache_kwarg(): real})
    handle.remove()
    mine = DynamicCache(config=model.config)
    kwargs = {**seen["kwargs"], cache_kwarg(): mine}
    with torch.no_grad():
        for i in range(j + 1):  # fill lower layers so layer j's slot exists in the same layout
            if i < j:
                mine.update(real.layers[i].keys, real.layers[i].values, i)
        append_kv(model.model.layers[j], seen["hidden"], kwargs)
    assert torch.equal(mine.layers[j].keys, real.layers[j].keys)
    assert torch.equal(mine.layers[j].values, real.layers[j].values)


def _rm(family):
    rm = retrofit(tiny_model(family, init_std=0.3), RetrofitConfig(block_size=2, rank=8, up_init_std=0.3))
    rm.set_curriculum(1.0)
    return rm


def _step_logits_match_reference(rm, ids, mask, policy, max_new=8, sample=False):
    kw = dict(max_new_tokens=max_new, do_sample=sample, output_logits=True, return_dict_in_generate=True,
              pad_token_id=0, top_k=0)
    if sample:
        torch.manual_seed(7)
    out, trace = generate(rm, ids, policy, window=3, attention_mask=mask, **kw)
    seq = out.sequences
    full_mask = torch.cat([mask, torch.ones(seq.shape[0], seq.shape[1] - mask.shape[1], dtype=mask.dtype)], 1)
    ref = reference_logits(rm, seq, trace, attention_mask=full_mask)
    prompt = ids.shape[1]
    for i, step_logits in enumerate(out.logits):  # step i predicts token prompt + i from position prompt + i - 1
        torch.testing.assert_close(step_logits, ref[:, prompt + i - 1], rtol=1e-4, atol=1e-4)
    return seq, trace


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("bsz,pad", [(1, False), (3, True)])
def test_cached_generation_equals_reference(family, bsz, pad):
    rm = _rm(family)
    ids, mask = batch(bsz=bsz, seq=10, pad=pad)
    policy = RandomSkip(p=0.5, eligible={2, 3}, seed=1)
    seq, trace = _step_logits_match_reference(rm, ids, mask, policy)
    assert any(t.skipped for t in trace) and not all(t.skipped for t in trace)
    # Skipping really changed the computation: the dense logits differ.
    with torch.no_grad():
        dense = rm(input_ids=seq, attention_mask=torch.ones_like(seq) if not pad else None).logits
    ref = reference_logits(rm, seq, trace)
    assert not torch.allclose(dense, ref)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_static_skip_of_the_first_and_a_later_block_equals_reference(family):
    rm = _rm(family)
    ids, mask = batch(bsz=2, seq=8, pad=True)
    seq, trace = _step_logits_match_reference(rm, ids, mask, StaticSkip({1, 3}))
    assert all(t.skipped == [1, 3] for t in trace)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_sampling_equals_reference(family):
    rm = _rm(family)
    ids, mask = batch(bsz=2, seq=8, pad=True)
    _step_logits_match_reference(rm, ids, mask, StaticSkip({2}), sample=True)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_never_skipping_reproduces_dense_generation(family):
    rm = _rm(family)
    ids, mask = batch(bsz=2, seq=9, pad=True)
    kw = dict(attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        dense = rm.generate(ids, **kw)
    for policy in (NoSkip(), ReSkip(tau={2: 2.0, 3: 2.0}, eligible={2, 3}, max_skips=2)):
        out, trace = generate(rm, ids, policy, window=4, **kw)
        assert torch.equal(out, dense)
        assert all(not t.skipped for t in trace) and len(trace) == 10


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_chunked_scoring_equals_reference(family):
    rm = _rm(family)
    ids = torch.randint(3, VOCAB, (2, 14), generator=torch.Generator().manual_seed(3))
    logits, trace = score(rm, ids, RandomSkip(p=0.5, eligible={2, 3}, seed=4), window=5, chunk_size=4)
    assert [t.length for t in trace] == [4, 4, 4, 2] and [t.start for t in trace] == [0, 4, 8, 12]
    torch.testing.assert_close(logits, reference_logits(rm, ids, trace), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("shortcut", [False, True])
def test_batched_planned_scoring_equals_each_row_alone(family, shortcut):
    """Rows with their own plans in one batch: at some steps a block every row skips (not run), at others
    one only some rows skip (run, identity on those rows), and an uneven last chunk. Each row's logits are
    those of scoring it alone under its plan (the exact cache), to float rounding, and so is the trace."""
    cfg = RetrofitConfig(block_size=2, rank=8, up_init_std=0.3, skip_path="shortcut" if shortcut else "identity")
    rm = retrofit(tiny_model(family, init_std=0.3), cfg)
    rm.set_curriculum(1.0)
    if shortcut:  # a shortcut that is not the identity, so rows that skip differ from rows that run
        with torch.no_grad():
            for s in rm.side_channel.shortcuts.values():
                for p in s.parameters():
                    p.normal_(0, 0.3)
    ids = torch.randint(3, VOCAB, (3, 14), generator=torch.Generator().manual_seed(5))
    f = frozenset
    plans = [PlannedSkip([f({2}), f({2, 3}), f(), f({3})]), PlannedSkip([f({2}), f({3}), f({2}), f()]),
             PlannedSkip([f({2}), f(), f({2, 3}), f({3})])]
    logits, traces = score_planned(rm, ids, plans, chunk_size=4)
    assert logits.shape == (3, 14, VOCAB)
    for b, p in enumerate(plans):
        alone, trace = score(rm, ids[b : b + 1], p, window=3, chunk_size=4)
        assert [(t.start, t.length, t.skipped) for t in traces[b]] == [(t.start, t.length, t.skipped) for t in trace]
        torch.testing.assert_close(logits[b : b + 1], alone, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(logits[0], logits[1], atol=1e-3)  # the plans made a difference
    whole, whole_traces = score_planned_whole(rm, ids, plans, chunk_size=4)  # one cache-free pass, same logits
    assert [[(t.start, t.length, t.skipped) for t in tr] for tr in whole_traces] == \
        [[(t.start, t.length, t.skipped) for t in tr] for tr in traces]
    torch.testing.assert_close(whole, logits, rtol=1e-5, atol=1e-5)
    everywhere = [PlannedSkip([f({2}), f({2, 3}), f({2}), f({2})])] * 3  # block 2 never runs, block 3 at one step
    torch.testing.assert_close(score_planned_whole(rm, ids, everywhere, chunk_size=4)[0],
                               score_planned(rm, ids, everywhere, chunk_size=4)[0], rtol=1e-5, atol=1e-5)
    one_step, _ = score_planned(rm, ids, [PlannedSkip([f({3})])] * 3, chunk_size=14)  # one step: no cache
    torch.testing.assert_close(one_step, score(rm, ids, StaticSkip({3}), window=3)[0], rtol=1e-5, atol=1e-5)
    for scorer in (score_planned, score_planned_whole):
        with pytest.raises(ValueError, match="2 plans for 3 sequences"):
            scorer(rm, ids, plans[:2], chunk_size=4)


@pytest.mark.parametrize("family,shortcut", [("llama", False), ("llama", True), ("qwen3", False), ("gemma3", True)])
def test_rows_scoring_decides_each_row_as_it_would_alone(family, shortcut):
    """A signal-reading ReSkip policy over a batch of independent sequences: each row keeps its own
    window, w_recent and max_skips count, so its decisions, w_recent and logits are those of scoring it
    alone (`score`, batch 1); at some steps a block is skipped by every row (not run), by some (run,
    the identity on those rows) or by none."""
    cfg = RetrofitConfig(block_size=2, rank=8, up_init_std=0.3, skip_path="shortcut" if shortcut else "identity")
    rm = retrofit(tiny_model(family, init_std=0.3), cfg)
    rm.set_curriculum(1.0)
    if shortcut:
        with torch.no_grad():
            for s in rm.side_channel.shortcuts.values():
                for p in s.parameters():
                    p.normal_(0, 0.3)
    ids = torch.randint(3, VOCAB, (4, 15), generator=torch.Generator().manual_seed(7))
    seen = {2: [], 3: []}
    for b in range(4):
        for t in score(rm, ids[b : b + 1], NEVER, window=3, chunk_size=3)[1]:
            for n, w in t.w_recent.items():
                seen[n].append(w)
    paths, most = set(), {}
    for q, max_skips in ((0.5, 1), (0.5, 2), (0.1, 2), (0.9, 2)):  # thresholds at the q-quantile of the signal
        # midway between two observed values, so float32 rounding of the batched pass cannot flip a decision
        tau = {n: sum(sorted(v)[max(0, int(q * len(v)) - 1): int(q * len(v)) + 1]) / 2 for n, v in seen.items()}
        policy = ReSkip(tau=tau, eligible={2, 3}, max_skips=max_skips)
        logits, traces = score_rows(rm, ids, policy, window=3, chunk_size=3)
        assert logits.shape == (4, 15, VOCAB)
        for b in range(4):
            alone, trace = score(rm, ids[b : b + 1], policy, window=3, chunk_size=3)
            assert [(t.start, t.length, t.skipped) for t in traces[b]] == [(t.start, t.length, t.skipped) for t in trace]
            for mine, ref in zip(traces[b], trace):
                assert mine.w_recent == pytest.approx(ref.w_recent, abs=1e-6)
            # a batched row and the row alone: float32 products of other shapes (1.1e-5 measured on one of 1,440
            # logits on an AMD EPYC host); a wrong decision would move whole blocks' worth
            torch.testing.assert_close(logits[b : b + 1], alone, rtol=1e-5, atol=3e-5)
        for j in range(5):  # how each block ran at each step: on no row, on every row, on some
            for n in (2, 3):
                rows = sum(n in traces[b][j].skipped for b in range(4))
                paths.add("none" if rows == 0 else "every" if rows == 4 else "some")
        most[q, max_skips] = max(len(t.skipped) for tr in traces for t in tr)
    assert paths == {"none", "every", "some"}, paths
    assert most[0.5, 1] == 1 and most[0.5, 2] == 2  # each row's own cap held where rows wanted more
    one_step, tr = score_rows(rm, ids, policy, window=3, chunk_size=15)  # one step: no cache
    for b in range(4):
        alone, trace = score(rm, ids[b : b + 1], policy, window=3)
        assert tr[b][0].skipped == trace[0].skipped
        torch.testing.assert_close(one_step[b : b + 1], alone, rtol=1e-5, atol=1e-5)


def test_rows_scoring_refuses_a_policy_with_state():
    """A random draw advances with each decision, so rows asked in turn would not draw what each alone
    draws: such a policy is refused (evaluation scores it one sequence at a time)."""
    rm = _rm("llama")
    ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="keeps state"):
        score_rows(rm, ids, RandomSkip(0.5, {2, 3}), window=3, chunk_size=2)
    assert not RandomSkip(0.5, {2}).pure and not StaticSkip({2}).pure and NEVER.pure and NoSkip().pure


# Reads the signal of blocks 2 and 3 and never skips (alpha <= 1 < tau).
NEVER = ReSkip(tau={2: 2.0, 3: 2.0}, eligible={2, 3}, max_skips=2)


def test_the_runtime_tracks_only_the_blocks_the_policy_reads():
    rm = _rm("llama")
    ids = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))
    only_3 = ReSkip(tau={3: 2.0}, eligible={3}, max_skips=1)

    class Custom(SkipPolicy):  # says nothing about its signal: it gets every block's
        def skip(self, n, w_recent, skipped_so_far, step):
            assert n == 1 or w_recent == w_recent  # block 1 has no router; every other block a number
            return False

    cases = ((NoSkip(), set()), (StaticSkip({2}), set()), (RandomSkip(0.0, {2, 3}), set()), (only_3, {3}),
             (NEVER, {2, 3}), (Custom(), {2, 3}))
    for policy, tracked in cases:
        _, trace = score(rm, ids, policy, window=3, chunk_size=2)
        assert [set(t.w_recent) for t in trace] == [tracked] * 3, policy
    with rm.skipping(NoSkip(), 3, track_all=True) as runtime, torch.no_grad():
        rm(input_ids=ids)
    assert set(runtime.trace[0].w_recent) == {2, 3}


def test_reskip_rule_window_and_cap():
    rm = _rm("llama")
    ids = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))
    # tau below any weight: every eligible block wants to skip; the cap allows one per step.
    policy = ReSkip(tau={2: -1.0, 3: -1.0}, eligible={2, 3}, max_skips=1)
    _, trace = score(rm, ids, policy, window=2, chunk_size=2)
    assert all(t.skipped == [2] for t in trace)
    # w_recent is the mean of alpha_{n-1 -> n} over the last W tokens, reaching into earlier steps.
    with torch.no_grad():
        alphas = rm(input_ids=ids, output_alphas=True).alphas
    a3 = alphas[3][0, :, -1]
    _, trace = score(rm, ids, NEVER, window=3, chunk_size=2)
    assert trace[1].w_recent[3] == pytest.approx(float(a3[1:4].mean()), abs=1e-5)
    assert trace[0].w_recent[3] == pytest.approx(float(a3[0:2].mean()), abs=1e-5)


def test_w_recent_with_left_padding_is_the_mean_of_each_rows_last_real_values():
    """Padding never enters the window; each row contributes the mean of its last W real values,
    and the batch decision reads the mean over rows (a row with no real token yet is left out)."""
    rm = _rm("llama")
    ids, mask = batch(bsz=3, seq=8, pad=True)  # rows 1 and 2 start with 2 and 4 pad tokens
    window, chunk = 3, 2
    with torch.no_grad():
        alphas = rm(input_ids=ids, attention_mask=mask, output_alphas=True).alphas
    _, trace = score(rm, ids, NEVER, window=window, chunk_size=chunk, attention_mask=mask)
    for step in trace:
        end = step.start + step.length
        for n in (2, 3):
            rows = []
            for b in range(ids.shape[0]):
                real = [float(alphas[n][b, t, -1]) for t in range(end) if mask[b, t]]
                if real:
                    rows.append(sum(real[-window:]) / len(real[-window:]))
            assert step.w_recent[n] == pytest.approx(sum(rows) / len(rows), abs=1e-5), (step.step, n)
    # The first step of rows 1 and 2 is all padding: only row 0 counts there.
    assert trace[0].w_recent[2] == pytest.approx(float(alphas[2][0, :2, -1].mean()), abs=1e-5)


@pytest.mark.real
def test_bundled_model_cached_generation_equals_reference(smollm2):
    model, tok = smollm2
    rm = retrofit(model, RetrofitConfig())
    try:
        rm.set_curriculum(1.0)
        enc = tok(["The history of the Roman empire", "def fibonacci(n):"], return_tensors="pt", padding=True)
        kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
        with torch.no_grad():
            dense = rm.generate(enc.input_ids, attention_mask=enc.attention_mask, **kw)
        out, trace = generate(rm, enc.input_ids, NoSkip(), window=8, attention_mask=enc.attention_mask, **kw)
        assert torch.equal(out, dense)
        policy = RandomSkip(p=0.5, eligible={3, 4, 5}, seed=2)
        out, trace = generate(rm, enc.input_ids, policy, window=8, attention_mask=enc.attention_mask,
                              output_logits=True, return_dict_in_generate=True, **kw)
        assert any(t.skipped for t in trace)
        seq = out.sequences
        mask = torch.cat([enc.attention_mask, torch.ones(2, seq.shape[1] - enc.input_ids.shape[1], dtype=torch.long)], 1)
        ref = reference_logits(rm, seq, trace, attention_mask=mask)
        p = enc.input_ids.shape[1]
        for i, step_logits in enumerate(out.logits):
            torch.testing.assert_close(step_logits, ref[:, p + i - 1], rtol=1e-4, atol=2e-4)
    finally:
        rm.unretrofit()
