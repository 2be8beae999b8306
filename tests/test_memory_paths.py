"""The training step's memory-saving paths give the step it saves memory for: losses from final hidden
states in chunks of positions (`losses.head_losses`, the objective's `loss_chunk`) and activation
checkpointing of the frozen layers (`recompute`): the same loss terms and gradients."""

import pytest
import torch

from helpers import batch, tiny_model
from reskip.ar_retrofit.config import RetrofitConfig
from reskip.ar_retrofit.model import retrofit
from reskip.compat import output_head
from reskip.train.objective import RetrofitObjective


def _model(family: str, softcap: float | None = None):
    base = tiny_model(family, init_std=0.3)
    if softcap is not None:
        base.config.final_logit_softcapping = softcap
    rm = retrofit(base, RetrofitConfig(block_size=2, rank=8, up_init_std=0.3))
    rm.set_curriculum(1.0)
    return rm


def _terms_and_grads(rm, ids, labels, chunk, mask=None, lambda_signal=0.0, recompute=False):
    rm.side_channel.zero_grad(set_to_none=True)
    objective = RetrofitObjective(rm, 1.0, 0.01, lambda_signal=lambda_signal, loss_chunk=chunk, recompute=recompute)
    terms = objective(ids, labels, 2, 1.0 / ids.numel(), 1.0 / ids.numel(), mask)
    terms["loss"].backward()
    return terms, [p.grad.clone() for p in rm.trainable_parameters()]


def _close(grads_a, grads_b, rel=0.0):
    """Every gradient entry within 1e-6, plus `rel` of its tensor's largest entry."""
    for a, b in zip(grads_a, grads_b):
        assert (a - b).abs().max() <= 1e-6 + rel * a.abs().max()


@pytest.mark.parametrize("family,softcap", [("llama", None), ("qwen3", None), ("gemma3", 3.0)])
def test_chunked_losses_equal_whole_logits(family, softcap):
    rm = _model(family, softcap)
    ids, _ = batch(pad=False, bsz=3, seq=12)
    labels = ids.clone()
    labels[0, :5] = -100  # unlabelled positions (a chat's user turn)
    whole, g_whole = _terms_and_grads(rm, ids, labels, None)
    for chunk in (5, 12, 64):  # a ragged last chunk, one chunk, a chunk longer than the sequence
        part, g_part = _terms_and_grads(rm, ids, labels, chunk)
        for k in ("loss", "ce", "kl", "ent"):  # float32 sums in another order: 1.2e-6 measured on an AMD EPYC host
            assert part[k].item() == pytest.approx(whole[k].item(), rel=3e-6), k
        _close(g_whole, g_part)


def test_chunked_losses_give_the_signal_terms_costs():
    """The per-position costs of the skip branch (the signal term's input) come out of the same chunks.
    The correlation of a small spread magnifies rounding, so its router's gradient is compared to 1e-4."""
    rm = _model("llama")
    ids, _ = batch(pad=False, bsz=3, seq=12)
    whole, g_whole = _terms_and_grads(rm, ids, ids.clone(), None, lambda_signal=1.0)
    part, g_part = _terms_and_grads(rm, ids, ids.clone(), 5, lambda_signal=1.0)
    assert whole["sig"].item() != 0 and part["sig"].item() == pytest.approx(whole["sig"].item(), rel=1e-5)
    _close(g_whole, g_part, 1e-4)


def test_chunked_losses_when_the_skip_branch_drops_the_last_block():
    """Blocks of 4 on 6 layers: block 2 is the last; its layers never run in the skip branch."""
    base = tiny_model("llama", init_std=0.3)
    rm = retrofit(base, RetrofitConfig(block_size=4, rank=8, up_init_std=0.3))
    rm.set_curriculum(1.0)
    ids, _ = batch(pad=False, bsz=2, seq=10)
    whole, g_whole = _terms_and_grads(rm, ids, ids.clone(), None)
    part, g_part = _terms_and_grads(rm, ids, ids.clone(), 3)
    assert part["loss"].item() == pytest.approx(whole["loss"].item(), rel=1e-6)
    _close(g_whole, g_part)


def test_chunked_losses_with_a_token_level_skip_branch():
    rm = _model("llama")
    ids, _ = batch(pad=False, bsz=2, seq=10)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, ::3] = True
    whole, g_whole = _terms_and_grads(rm, ids, ids.clone(), None, mask)
    part, g_part = _terms_and_grads(rm, ids, ids.clone(), 4, mask)
    assert part["loss"].item() == pytest.approx(whole["loss"].item(), rel=1e-6)
    _close(g_whole, g_part)


def test_hidden_only_forward_gives_the_heads_input(family):
    """The family-specific part: the decoder body's last hidden state is what the head reads."""
    rm = _model(family)
    ids, mask = batch()
    with torch.no_grad():
        logits = rm(input_ids=ids, attention_mask=mask, use_cache=False).logits
        out = rm(input_ids=ids, attention_mask=mask, use_cache=False, hidden_only=True)
    assert out.logits is None  # no logits computed
    weight, bias, softcap = output_head(rm.base_model)
    z = torch.nn.functional.linear(out.last_hidden_state, weight, bias)
    if softcap is not None:
        z = torch.tanh(z / softcap) * softcap
    torch.testing.assert_close(z, logits, rtol=0, atol=0)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_recomputed_layers_give_the_same_step(family, monkeypatch):
    """Activation checkpointing of the frozen layers, with and without chunked losses, with the
    shortcut and a token-level skip branch: the same terms and gradients; no layer is checkpointed
    outside the objective (the flag is restored)."""
    base = tiny_model(family, init_std=0.3)
    rm = retrofit(base, RetrofitConfig(block_size=2, rank=8, up_init_std=0.3, skip_path="shortcut"))
    rm.set_curriculum(1.0)
    ids, _ = batch(pad=False, bsz=2, seq=10)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, 1::2] = True
    import reskip.ar_retrofit.depth_pass as depth_pass

    calls = []

    def counting(fn, *args, **kwargs):
        calls.append(fn)
        return torch.utils.checkpoint.checkpoint(fn, *args, **kwargs)

    monkeypatch.setattr(depth_pass, "checkpoint", counting)
    for skip_mask in (None, mask):
        whole, g_whole = _terms_and_grads(rm, ids, ids.clone(), None, skip_mask, lambda_signal=1.0)
        assert not calls
        for chunk in (None, 4):
            again, g_again = _terms_and_grads(rm, ids, ids.clone(), chunk, skip_mask, lambda_signal=1.0, recompute=True)
            assert again["loss"].item() == pytest.approx(whole["loss"].item(), rel=1e-6)
            _close(g_whole, g_again, 1e-4 if chunk else 0.0)
            assert len(calls) > 0  # the layers the gradient flows through were checkpointed
            calls.clear()
    assert rm.depth_pass.recompute is False


def test_local_regression_with_no_middle_block():
    """Two blocks: the shortcut path has no shortcut to regress (blocks 2..N-1 is empty); the default
    recipe's local term is then 0, not an error."""
    rm = retrofit(tiny_model("llama", init_std=0.3), RetrofitConfig(block_size=4, rank=8, skip_path="shortcut"))
    rm.set_curriculum(1.0)
    ids, _ = batch(pad=False, bsz=2, seq=10)
    terms = RetrofitObjective(rm, 1.0, 0.01, lambda_local=1.0)(ids, ids.clone(), 2, 1.0 / ids.numel(), 1.0 / ids.numel())
    assert len(rm.side_channel.shortcuts) == 0 and terms["local"].item() == 0.0
    # the loss is CE + KL - 0.01 H (no signal term asked, the local term 0), every term finite
    expected = terms["ce"] + terms["kl"] - 0.01 * terms["ent"]
    assert torch.isfinite(expected) and terms["loss"].item() == pytest.approx(expected.item(), rel=1e-6)


def test_validation_one_sequence_at_a_time_gives_the_batchs_figures():
    """With chunked losses the training loop validates one sequence at a time (no (B, T, V) logits held):
    every logged figure is the batched one's, to float32 rounding."""
    from reskip.data.packing import Packed
    from reskip.train.validation import validation_metrics

    rm = _model("llama")
    ids, _ = batch(pad=False, bsz=4, seq=12)
    labels = ids.clone()
    labels[1, :4] = -100
    data = Packed(ids, labels, ["x"] * 4)
    whole, one = validation_metrics(rm, data, batch_size=4), validation_metrics(rm, data, batch_size=1)

    def flat(d, prefix=""):
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
        return out

    a, b = flat(whole), flat(one)
    assert a.keys() == b.keys()
    for k in a:
        assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-6), k


@pytest.mark.parametrize("chunk", [None, 5])
def test_the_full_path_as_the_skip_branchs_teacher(chunk):
    """skip_teacher full: the KL term is KL(full path || skip branch) with the full path held fixed, whole or
    chunked; the backbone teacher's KL differs (the full path has moved from the backbone)."""
    from reskip.losses import kl_sum, teacher_targets

    rm = _model("llama")
    ids, _ = batch(pad=False, bsz=2, seq=12)
    terms = RetrofitObjective(rm, 1.0, 0.01, loss_chunk=chunk, skip_teacher="full")(ids, ids.clone(), 2, 1.0, 1.0)
    with torch.no_grad():
        full = rm(input_ids=ids).logits
        with rm.blocks_skipped(2):
            skip = rm(input_ids=ids).logits
    assert terms["kl"].item() == pytest.approx(kl_sum(teacher_targets(full), skip).item(), rel=1e-5)
    backbone = RetrofitObjective(rm, 1.0, 0.01, loss_chunk=chunk)(ids, ids.clone(), 2, 1.0, 1.0)
    assert abs(backbone["kl"].item() - terms["kl"].item()) > 1e-3
