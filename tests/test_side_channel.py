"""The side-channel's math, gradients, switches, and the frozen backbone."""

import math

import pytest
import torch

from helpers import batch, tiny_model
from reskip import RetrofitConfig, alpha_entropy, retrofit
from reskip.ar_retrofit.side_channel import (
    MixStates,
    SideChannel,
    count_side_channel_params,
    mix,
    score_root,
    source_scores,
)


def test_param_count_matches_closed_form():
    for d, n, r in [(32, 3, 8), (576, 8, 64), (2560, 9, 256)]:
        side = SideChannel(d, n, RetrofitConfig(rank=r))
        assert sum(p.numel() for p in side.parameters()) == count_side_channel_params(d, n, r)


def test_router_matches_spec_formula():
    """alpha = softmax_i(w . (RMSNorm(h_i) + b_i) / sqrt(d)); r = sum alpha h; delta = c g A(r - h_{n-1})."""
    torch.manual_seed(0)
    d, n = 16, 3
    side = SideChannel(d, 4, RetrofitConfig(rank=4, up_init_std=0.3))
    block = side.block(n)
    with torch.no_grad():
        block.gate.fill_(0.7)
    h = [torch.randn(2, 5, d) * (i + 1) for i in range(n)]
    sources = torch.stack(h, dim=-2)
    x, alpha = block(sources, h[-1], 0.5)

    w, b = block.router.query, block.router.source_bias
    logits = []
    for i in range(n):
        k = h[i] / torch.sqrt(h[i].pow(2).mean(-1, keepdim=True) + 1e-6) + b[i]
        logits.append(k @ w / math.sqrt(d))
    ref_alpha = torch.stack(logits, -1).softmax(-1)
    r = sum(ref_alpha[..., i : i + 1] * h[i] for i in range(n))
    a = block.correction
    ref_delta = 0.5 * 0.7 * a.up(torch.nn.functional.silu(a.down(r - h[-1])))
    torch.testing.assert_close(alpha, ref_alpha)
    torch.testing.assert_close(x, h[-1] + ref_delta)


def test_inference_caches_follow_parameter_updates():
    """Without autograd the router's bias term and the gated up-projection are cached, per block and
    for the whole pass; every way of changing the parameters (in-place step, a new Parameter,
    load_state_dict, a dtype round trip) and the curriculum must be seen."""
    torch.manual_seed(0)
    side = SideChannel(16, 4, RetrofitConfig(rank=4, up_init_std=0.3))
    block = side.block(3)
    sources = torch.randn(2, 5, 3, 16)

    def check(c=1.0):
        side.curriculum = c
        got, got_pass = block(sources, sources[..., -1, :], c), side.pass_tensors()
        with torch.enable_grad():  # with autograd on, nothing is cached
            want, want_pass = block(sources, sources[..., -1, :], c), side.pass_tensors()
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w.detach(), rtol=0, atol=0)
        for g, w in zip(got_pass.blocks[2:], want_pass.blocks[2:]):  # every block's tensors for a pass
            for a, b in zip(g[:5], w[:5]):
                torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)
        torch.testing.assert_close(got_pass.queries, want_pass.queries.detach(), rtol=0, atol=0)

    with torch.no_grad():
        check()
        for p in side.parameters():  # new data, same version number (0): only the pointer tells
            p.data = p.data + 0.25
        check()
        block.router.source_bias.add_(0.5)  # an optimizer step
        check()
        for p in side.parameters():  # each parameter alone, in every block
            p.add_(0.01)
            check()
        block.gate.mul_(0.5)
        check()
        block.correction.up.weight.add_(0.1)
        check()
        check(0.3)  # another c(t)
        block.gate = torch.nn.Parameter(torch.full((), 0.25))  # a new Parameter object
        check(0.3)
        side.block(4).router.query = torch.nn.Parameter(torch.randn(16))
        check(0.3)
        state = {k: v + 1.0 for k, v in side.state_dict().items()}
        side.load_state_dict(state)
        check()
        side.double().float()
        check()


def test_parameter_tensors_are_exactly_the_block_parameters():
    """The inference caches key on `parameter_tensors()`; a parameter it missed would go stale."""
    side = SideChannel(16, 4, RetrofitConfig(rank=4))
    for n in range(2, 5):
        block = side.block(n)
        assert sorted(map(id, block.parameter_tensors())) == sorted(map(id, block.parameters()))


def test_initial_alpha_prefers_previous_state_but_is_not_collapsed():
    model = tiny_model("llama")
    ids, mask = batch()
    rm = retrofit(model, RetrofitConfig(block_size=2, rank=8))
    with torch.no_grad():
        alphas = rm(input_ids=ids, attention_mask=mask, output_alphas=True).alphas
    for n, alpha in alphas.items():
        torch.testing.assert_close(alpha.sum(-1), torch.ones(alpha.shape[:-1]))
        mean = alpha.mean(dim=(0, 1))
        assert mean.argmax().item() == n - 1
        assert 0.4 < mean[-1].item() < 0.95
    ent = alpha_entropy(alphas, mask)
    assert 0 < ent.item() < math.log(3)


def test_gradients_at_c0_reach_router_only_through_entropy():
    model = tiny_model("llama")
    ids, mask = batch()
    rm = retrofit(model, RetrofitConfig(block_size=2, rank=8))
    rm.set_curriculum(0.0)
    out = rm(input_ids=ids, attention_mask=mask, labels=ids, output_alphas=True)
    out.loss.backward(retain_graph=True)
    assert all(p.grad is None or torch.all(p.grad == 0) for p in rm.trainable_parameters())
    (-alpha_entropy(out.alphas, mask)).backward()
    block = rm.side_channel.block(2)
    assert block.router.query.grad.abs().sum() > 0
    assert torch.all(block.correction.up.weight.grad == 0)


def test_gradients_reach_every_side_channel_parameter_at_c1():
    model = tiny_model("qwen3")
    ids, mask = batch()
    rm = retrofit(model, RetrofitConfig(block_size=2, rank=8))
    rm.set_curriculum(1.0)
    rm(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
    for name, p in rm.side_channel.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert all(p.grad is None for p in rm.base_model.parameters())


def test_training_step_leaves_backbone_bytes_unchanged(family):
    model = tiny_model(family)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rm = retrofit(model, RetrofitConfig(block_size=2, rank=8))
    rm.set_curriculum(1.0)
    trainable = rm.trainable_parameters()
    # Every trainable tensor is one the retrofit added, and every added tensor trains.
    assert {id(p) for p in trainable} == {id(p) for p in rm.side_channel.parameters()}
    assert not any(p.requires_grad for p in rm.base_model.parameters())
    opt = torch.optim.AdamW(trainable, lr=1e-2, weight_decay=0.1)
    side_before = [p.detach().clone() for p in trainable]
    ids, mask = batch()
    rm.train()
    for _ in range(2):
        loss = rm(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert any(not torch.equal(a, p) for a, p in zip(side_before, trainable))
    after = rm.unretrofit().state_dict()
    assert before.keys() == after.keys()
    for k in before:
        assert before[k].dtype == after[k].dtype
        assert before[k].numpy().tobytes() == after[k].numpy().tobytes(), k


def test_skipped_block_is_identity():
    model = tiny_model("llama")
    ids, mask = batch()
    rm = retrofit(model, RetrofitConfig(block_size=2, rank=8))
    captured = {}
    hook = rm.depth_pass.leave_block

    def spy(n, h):
        captured[n] = h
        return hook(n, h)

    rm.depth_pass.leave_block = spy
    enter = rm.depth_pass.enter_block

    def spy_enter(n, h):
        x = enter(n, h)
        captured[f"x{n}"] = x
        return x

    rm.depth_pass.enter_block = spy_enter
    with torch.no_grad(), rm.blocks_skipped(2):
        skipped = rm(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(captured[2], captured["x2"])  # h_2 = x_2: the block's input passed through
    with torch.no_grad():
        full = rm(input_ids=ids, attention_mask=mask).logits
    assert not torch.equal(captured[2], captured["x2"])
    assert not torch.equal(skipped, full)
    with pytest.raises(ValueError, match="out of range"):
        with rm.blocks_skipped(4):
            pass


def test_curriculum_range_is_checked():
    rm = retrofit(tiny_model("llama"))
    with pytest.raises(ValueError):
        rm.set_curriculum(1.5)


def test_retrofitting_twice_is_refused():
    model = tiny_model("llama")
    retrofit(model)
    with pytest.raises(ValueError, match="already retrofitted"):
        retrofit(model)


def test_kl_matches_reference_value_and_gradient():
    from reskip.losses import kl_sum

    torch.manual_seed(0)
    t = torch.randn(2, 5, 11) * 3
    s = (torch.randn(2, 5, 11) * 3).requires_grad_(True)
    s_ref = s.detach().clone().requires_grad_(True)
    ref = torch.nn.functional.kl_div(s_ref.log_softmax(-1), t.log_softmax(-1), log_target=True, reduction="sum")
    ref.backward()
    out = kl_sum(t.clone(), s)
    (2 * out).backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(s.grad, 2 * s_ref.grad)
    assert kl_sum(t.clone(), t.clone()).abs() < 1e-5


def test_ce_sum_is_shifted_next_token_loss():
    from reskip.losses import ce_sum

    torch.manual_seed(0)
    logits, labels = torch.randn(2, 6, 9), torch.randint(0, 9, (2, 6))
    labels[0, 3] = -100
    ref = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, 9), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum"
    )
    torch.testing.assert_close(ce_sum(logits, labels), ref)


def test_router_logits_are_rmsnorm_dot_products_and_train_after_inference_mode():
    """w . (h / RMS(h) + b) / sqrt(d) in float64 against the scores-plus-bias form the router uses."""
    torch.manual_seed(0)
    d, n = 16, 3
    h = torch.randn(3, 4, n, d) * torch.tensor([0.01, 1.0, 30.0])[:, None]  # tiny norms: the eps matters
    w, b = torch.randn(d), torch.randn(n, d)
    k = h.double() / torch.sqrt(h.double().pow(2).mean(-1, keepdim=True) + 1e-6) + b.double()
    ref = (k @ w.double()) / math.sqrt(d)
    root = score_root(d, h.device)
    got = source_scores(w.unsqueeze(0), ((b @ w) / math.sqrt(d)).unsqueeze(-1), h, root)
    assert got.shape == (3, 4, n, 1)
    torch.testing.assert_close(got.squeeze(-1), ref.float())  # float32 tolerances
    queries, bias = torch.randn(5, d), torch.randn(5)  # one state's scores against several routers at once
    for q in range(5):
        one = source_scores(queries[q:q + 1], bias[q:q + 1], h[..., 1, :], root)[..., 0]
        torch.testing.assert_close(source_scores(queries, bias, h[..., 1, :], root)[..., q], one)
    side = SideChannel(16, 3, RetrofitConfig(rank=4))
    sources = torch.randn(2, 5, 3, 16)
    with torch.inference_mode():  # a pass in inference mode first; nothing it leaves behind may block training
        side.block(3)(sources, sources[..., -1, :], 1.0)
    x, alpha = side.block(3)(sources, sources[..., -1, :], 1.0)
    (x.sum() + alpha.pow(2).sum()).backward()
    assert side.block(3).router.query.grad is not None


def test_block_input_with_a_bfloat16_backbone_adds_the_float32_correction():
    """The side-channel works in float32; a bfloat16 stream gets the correction added in its own dtype."""
    torch.manual_seed(1)
    d, n = 16, 3
    block = SideChannel(d, 4, RetrofitConfig(rank=4, up_init_std=0.3)).block(n)
    hidden = (torch.randn(2, 5, d) * 3).bfloat16()
    sources = torch.stack([torch.randn(2, 5, d), torch.randn(2, 5, d), hidden.float()], dim=-2)
    x, alpha = block(sources, hidden, 0.5)
    alpha_ref = block.router(sources)
    r = (alpha_ref.unsqueeze(-1) * sources).sum(-2)
    a = block.correction
    correction = 0.5 * block.gate * a.up(torch.nn.functional.silu(a.down(r - hidden.float())))
    assert x.dtype == torch.bfloat16 and correction.abs().max() > 0.1  # something to see
    torch.testing.assert_close(alpha, alpha_ref)
    # Two bfloat16 roundings (the correction, then the sum), each within half an ulp (2^-8 relative).
    error = (x.float() - (hidden.float() + correction)).abs()
    assert (error <= 2**-7 * (hidden.float().abs() + correction.abs()) + 1e-6).all()
    assert not torch.equal(x, hidden)


def test_rejected_designs_are_configurations_of_the_same_block():
    """The variants of `reskip experiment variants` against their formulas, on one block's inputs:
    observer leaves x_n = h_{n-1} (alpha still computed), interpolate is (1 - gamma) h_{n-1} + gamma r_n,
    gamma_free is A_n(r_n - h_{n-1}) with neither gate nor curriculum; same draws as the recipe."""
    torch.manual_seed(0)
    d, n = 16, 3
    h = [torch.randn(2, 5, d) * (i + 1) for i in range(n)]
    sources = torch.stack(h, dim=-2)
    blocks = {v: SideChannel(d, 4, RetrofitConfig(rank=4, up_init_std=0.3, variant=v)).block(n)
              for v in ("recipe", "observer", "interpolate", "gamma_free")}
    for b in blocks.values():
        with torch.no_grad():
            b.gate.fill_(0.7)
    x_rec, alpha = blocks["recipe"](sources, h[-1], 0.5)
    r = (alpha[..., None] * sources).sum(-2)
    x_obs, a_obs = blocks["observer"](sources, h[-1], 0.5)
    assert torch.equal(x_obs, h[-1]) and torch.equal(a_obs, alpha)
    x_int, _ = blocks["interpolate"](sources, h[-1], 0.5)
    torch.testing.assert_close(x_int, (1 - 0.35) * h[-1] + 0.35 * r)
    assert torch.equal(blocks["interpolate"](sources, h[-1], 0.0)[0], h[-1])  # gamma = 0: the backbone's input
    x_free, _ = blocks["gamma_free"](sources, h[-1], 0.0)  # c = 0 changes nothing: no curriculum
    a = blocks["gamma_free"].correction
    torch.testing.assert_close(x_free, h[-1] + a.up(torch.nn.functional.silu(a.down(r - h[-1]))))
    torch.testing.assert_close(x_rec, h[-1] + 0.35 * (x_free - h[-1]))  # the recipe is gamma times that
    with pytest.raises(Exception, match="variant must be one of"):
        RetrofitConfig(variant="direct")


def test_observer_routing_trains_the_router_and_leaves_the_backbone():
    """observer: the logits are the backbone's at c = 1 whatever the side-channel holds; the entropy term
    still reaches the router, and the adapter gets no gradient (it is never used)."""
    model = tiny_model()
    ids, mask = batch()
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
    rm = retrofit(model, RetrofitConfig(block_size=2, rank=8, up_init_std=0.5, variant="observer"))
    rm.set_curriculum(1.0)
    out = rm(input_ids=ids, attention_mask=mask, output_alphas=True)
    assert torch.equal(out.logits, ref)
    (-alpha_entropy(out.alphas, mask)).backward()
    blk = rm.side_channel.block(2)
    assert blk.router.query.grad is not None and blk.router.query.grad.abs().sum() > 0
    assert blk.correction.up.weight.grad is None and blk.gate.grad is None


def test_the_mix_of_separate_states_matches_the_stacked_product_in_value_and_gradient():
    """`MixStates` (training: no (B, T, n, d) stack) against the batched product over a stack (inference), forward
    and backward in float64, with one state that needs no gradient among them."""
    torch.manual_seed(0)
    coeff = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    states = [torch.randn(2, 5, 7, dtype=torch.float64, requires_grad=i > 0) for i in range(3)]
    torch.autograd.gradcheck(lambda c, *s: MixStates.apply(c, *s), (coeff, *states))
    got = mix(coeff, states)
    want = mix(coeff, torch.stack(states, dim=-2))
    torch.testing.assert_close(got, want)
    g = torch.randn_like(got)
    grads = torch.autograd.grad(got, [coeff, *states[1:]], g)
    want_grads = torch.autograd.grad(want, [coeff, *states[1:]], g)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b)


def test_a_pass_with_autograd_on_matches_the_same_pass_in_inference():
    """The two ways a pass keeps its sources (separate tensors and the stackless mix with autograd on; one buffer and
    a batched mix in inference) give the same logits and alphas on a retrofitted tiny model."""
    torch.manual_seed(0)
    rm = retrofit(tiny_model(), RetrofitConfig(rank=4, up_init_std=0.3))
    rm.set_curriculum(1.0)
    ids, mask = batch()
    with torch.no_grad():
        for blk in rm.side_channel.per_block.values():
            blk.gate.fill_(3.0)  # a correction large enough to move the logits
        want = rm(input_ids=ids, attention_mask=mask, output_alphas=True)
        with rm.side_channel_disabled():
            backbone = rm(input_ids=ids, attention_mask=mask).logits
    assert (want.logits - backbone).abs().max() > 1e-2  # the side-channel acts
    got = rm(input_ids=ids, attention_mask=mask, output_alphas=True)
    assert got.logits.requires_grad
    torch.testing.assert_close(got.logits.detach(), want.logits)
    assert got.alphas.keys() == want.alphas.keys() and len(want.alphas) == rm.n_blocks - 1
    for n, a in want.alphas.items():
        torch.testing.assert_close(got.alphas[n].detach(), a)
