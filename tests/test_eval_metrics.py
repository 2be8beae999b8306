"""The eval stage's per-sequence metrics: computed a slice of positions at a time, equal to the whole-logits
formulas; references rebuilt from kept final hidden states, equal to the model's own logits."""

import contextlib

import pytest
import torch

from helpers import VOCAB, batch, tiny_model
from reskip import RetrofitConfig, retrofit
from reskip.compat import output_head
from reskip.data.packing import Packed
from reskip.evaluate.methods import EvalContext, Method, References, Tally, _tally_of, evaluate_methods
from reskip.losses import ce_sum, head_logits, kl_sum, teacher_targets
from reskip.skip.policies import StaticSkip
from reskip.skip.spec import Spec


def _refs(T=11, V=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, V, (1, T), generator=g)
    labels[0, 3] = labels[0, 7] = -100  # unlabelled positions (padding) drop out of CE only
    zb, zf = torch.randn(1, T, V, generator=g) * 3, torch.randn(1, T, V, generator=g) * 3
    top2 = zf.topk(2, dim=-1).values
    ref = References(labels, zb, teacher_targets(zb), zb.argmax(-1), zf, zf.argmax(-1), top2[..., 0] - top2[..., 1])
    return ref, zf + 0.4 * torch.randn(1, T, V, generator=g)  # a method's logits near the retrofit's


def _whole(z, ref) -> Tally:
    """The metrics as the eval stage computed them before slicing: one operation over (1, T, V)."""
    t = Tally(ce=ce_sum(z, ref.labels).item(), kl=kl_sum(ref.teacher, z).item())
    top1 = z.argmax(-1)
    t.agree = int((top1 == ref.back_top1).sum())
    holds = 2 * (z - ref.z_full).abs().amax(-1) < ref.margin
    changed = top1 != ref.full_top1
    t.margin_holds, t.changed_where_holds, t.changed = int(holds.sum()), int((holds & changed).sum()), int(changed.sum())
    return t


@pytest.mark.parametrize("chunk", [1, 3, 4, 11, 64])
def test_metrics_in_slices_equal_the_whole_logits_formulas(chunk):
    ref, z = _refs()
    want = _whole(z, ref)
    got = _tally_of(z, ref, [[1], []], [6, 5], "policy", lambda s, l: (1.0, 2.0), chunk=chunk)
    assert got.margin_holds > 0 and got.changed > 0  # the check is exercised, not vacuous
    assert (got.agree, got.margin_holds, got.changed_where_holds, got.changed) == (
        want.agree, want.margin_holds, want.changed_where_holds, want.changed)
    assert got.ce == pytest.approx(want.ce, rel=1e-6) and got.kl == pytest.approx(want.kl, rel=1e-5, abs=1e-5)
    assert got.targets == 10 - 2 and got.positions == 11 and got.skipped_per_step == [1, 0]
    back = _tally_of(ref.z_back, ref, [[]], [11], "backbone", lambda s, l: (1.0, 1.0), chunk=chunk)
    assert back.ce == pytest.approx(ce_sum(ref.z_back, ref.labels).item(), rel=1e-6)
    assert back.agree == 11 and back.kl == 0.0 and not back.margin_measured


def _rm(family):
    model = tiny_model(family, init_std=0.3)
    if family == "gemma3":
        model.config.final_logit_softcapping = 5.0  # the soft-capped head, as Gemma 2's config sets one
    rm = retrofit(model, RetrofitConfig(block_size=2, rank=8, up_init_std=0.3))
    rm.set_curriculum(1.0)
    return rm.eval()


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_logits_from_hidden_states_are_the_model_s_own(family):
    rm = _rm(family)
    ids, _ = batch(pad=False)
    with torch.no_grad():
        for off in (True, False):  # the backbone, then the retrofit
            with rm.side_channel_disabled() if off else contextlib.nullcontext():
                h = rm(input_ids=ids, use_cache=False, hidden_only=True).last_hidden_state
                z = rm(input_ids=ids, use_cache=False).logits
            assert torch.equal(head_logits(h, output_head(rm.base_model)), z.float())


def test_matched_baselines_reuse_the_references_hidden_states(monkeypatch):
    """The second round (the matched baselines) runs no backbone or retrofit pass of its own for its
    references, and its figures are those of the same methods asked for in the first round."""
    rm = _rm("llama")
    ids = torch.randint(3, VOCAB, (6, 16), generator=torch.Generator().manual_seed(3))
    data = Packed(ids, ids.clone(), ["tiny"] * 6)
    methods = [Method("backbone", None, Spec("backbone", "backbone")),
               Method("static:2", StaticSkip({2}), Spec("static", "static:2", k=2))]
    calls = []
    forward = rm.forward

    def counting(*args, **kwargs):
        calls.append(kwargs.get("hidden_only", False))
        return forward(*args, **kwargs)

    monkeypatch.setattr(rm, "forward", counting)
    context = EvalContext.of(rm, data, window=4, chunk_size=4)
    first = evaluate_methods(rm, data, methods, window=4, chunk_size=4, group=4, _context=context)
    assert sum(calls) == 2 * 2  # two groups (4 + 2 sequences), a backbone and a retrofit pass each
    # the kept hidden states only (every method scored anew)
    again = evaluate_methods(rm, data, methods, window=4, chunk_size=4, group=4,
                             _context=EvalContext.of(rm, data, window=4, chunk_size=4, hidden=context.hidden))
    assert sum(calls) == 2 * 2  # no reference pass the second time
    for name in first:
        assert {k: v for k, v in first[name].items() if k != "wall_s"} == {
            k: v for k, v in again[name].items() if k != "wall_s"}


def test_cross_entropy_matches_float64_on_a_large_vocabulary():
    """logsumexp(z) - z[target] in float32 is within float64's answer to 1e-7 on SmolLM2's vocabulary size, where
    torch's float32 cross_entropy was measured 2-4e-6 low on real logits."""
    g = torch.Generator().manual_seed(0)
    T, V = 16, 49152
    z = torch.randn(1, T, V, generator=g) * 4 + torch.randn(1, 1, V, generator=g) * 3
    labels = torch.randint(0, V, (1, T), generator=g)
    ref = References(labels, z, teacher_targets(z), z.argmax(-1), z, z.argmax(-1), torch.ones(1, T))
    got = _tally_of(z, ref, [[]], [T], "backbone", lambda s, l: (1.0, 1.0), chunk=5)
    z64, t = z[0, :-1].double(), labels[0, 1:]
    want = (z64.logsumexp(-1) - z64.gather(-1, t[:, None])[:, 0]).sum().item()
    assert abs(got.ce - want) / want < 1e-7


def test_generation_agreement_counts_the_prefix_before_the_first_divergence():
    from reskip.evaluate.generation import agreement

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return " ".join("." if i == 0 else f"w{i}" for i in ids)

    ref = [[1, 2, 0, 3], [1, 2, 3, 4], [5, 6]]
    other = [[1, 2, 0, 9], [1, 9, 3, 4], [5, 6]]
    a = agreement(Tok(), ref, other)
    assert a["per_prompt_prefix"] == [0.75, 0.25, 1.0]
    assert a["same_first_sentence"] == 2 / 3  # the first: 'w1 w2 .' both; the second differs at once
