"""The learned skip shortcut (skip_path: shortcut): an exact identity at init, exact under the KV
cache once trained, counted in parameters and FLOPs, trained by the skip branch, saved and loaded."""

import pytest
import torch

from helpers import batch, save_tiny, tiny_model, write_corpus
from reskip import RetrofitConfig, retrofit
from reskip.ar_retrofit.kv_cache import reference_logits
from reskip.ar_retrofit.model import load_adapter
from reskip.ar_retrofit.side_channel import SkipShortcut, count_side_channel_params
from reskip.cli import main
from reskip.errors import RetrofitConfigError
from reskip.evaluate.flops import LayerFlops, executed_share, shortcut_flops
from reskip.skip.policies import RandomSkip, StaticSkip
from reskip.skip.scoring import generate, score

SHORTCUT = dict(block_size=2, rank=8, up_init_std=0.3)


def _pair(family="llama"):
    """The same backbone and seed retrofitted with the identity path and with the shortcut."""
    ident = retrofit(tiny_model(family, init_std=0.3), RetrofitConfig(**SHORTCUT))
    short = retrofit(tiny_model(family, init_std=0.3), RetrofitConfig(**SHORTCUT, skip_path="shortcut", shortcut_rank=4))
    for rm in (ident, short):
        rm.set_curriculum(1.0)
    return ident, short


def _perturb(rm, seed=3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in rm.side_channel.shortcut_modules():
            m.low_rank.up.weight.copy_(torch.randn(m.low_rank.up.weight.shape, generator=g) * 0.5)


def test_the_shortcut_starts_as_the_identity_exactly():
    ident, short = _pair()
    assert [m for m in ident.side_channel.shortcut_modules()] == []
    assert sorted(short.side_channel.shortcuts) == ["2"]  # blocks 2..N-1 of N = 3
    ids, mask = batch()
    with torch.no_grad():
        # the side-channel draws the same numbers: nothing skipped, the two are the same model
        assert torch.equal(ident(input_ids=ids, attention_mask=mask).logits, short(input_ids=ids, attention_mask=mask).logits)
        with ident.blocks_skipped(2), short.blocks_skipped(2):
            assert torch.equal(ident(input_ids=ids, attention_mask=mask).logits,
                               short(input_ids=ids, attention_mask=mask).logits)
        _perturb(short)
        with ident.blocks_skipped(2), short.blocks_skipped(2):
            assert not torch.equal(ident(input_ids=ids, attention_mask=mask).logits,
                                   short(input_ids=ids, attention_mask=mask).logits)
        # the teacher (side-channel off) never uses it: the backbone's own ablation is the identity
        with ident.side_channel_disabled(), short.side_channel_disabled(), ident.blocks_skipped(2), short.blocks_skipped(2):
            assert torch.equal(ident(input_ids=ids).logits, short(input_ids=ids).logits)


def test_a_skipped_block_outputs_x_plus_s_of_x():
    _, short = _pair()
    _perturb(short)
    ids, _ = batch(pad=False)
    with torch.no_grad(), short.capturing() as captured, short.blocks_skipped(2):
        short(input_ids=ids)
        cap = captured()
    sc = short.side_channel.shortcuts["2"]
    torch.testing.assert_close(cap.states[2], cap.inputs[2] + sc.low_rank(cap.inputs[2]), rtol=0, atol=0)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_cached_generation_with_a_trained_shortcut_equals_reference(family):
    _, rm = _pair(family)
    _perturb(rm)
    ids, mask = batch(bsz=2)
    out, trace = generate(rm, ids, RandomSkip(0.5, {2, 3}, seed=1), window=3, attention_mask=mask, max_new_tokens=8,
                          do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    assert any(2 in t.skipped for t in trace) and any(2 not in t.skipped for t in trace)
    seq = out.sequences
    full_mask = torch.cat([mask, torch.ones(seq.shape[0], seq.shape[1] - mask.shape[1], dtype=mask.dtype)], 1)
    ref = reference_logits(rm, seq, trace, attention_mask=full_mask)
    prompt = ids.shape[1]
    for i, step_logits in enumerate(out.logits):
        torch.testing.assert_close(step_logits, ref[:, prompt + i - 1], rtol=1e-4, atol=1e-4)
    ids, _ = batch(pad=False, seq=16)
    logits, trace = score(rm, ids, StaticSkip({2}), window=3, chunk_size=4)
    torch.testing.assert_close(logits, reference_logits(rm, ids, trace), rtol=1e-4, atol=1e-4)


def test_parameters_and_flops_count_the_shortcut():
    d, n, r, rs = 32, 5, 8, 4
    side = retrofit(tiny_model("llama"), RetrofitConfig(block_size=1, rank=r, skip_path="shortcut",
                                                        shortcut_rank=rs)).side_channel
    assert sum(p.numel() for p in side.parameters()) == count_side_channel_params(32, 6, r, rs)
    assert count_side_channel_params(d, n, r, rs) - count_side_channel_params(d, n, r) == 2 * d * rs * (n - 2)
    lf = LayerFlops(full=100, kv_only=10)
    blocks = [range(0, 2), range(2, 4), range(4, 6)]
    executed, dense = executed_share(blocks, [[2]], [3], lf, {2: shortcut_flops(d, rs)})
    assert executed == 3 * (4 * 100 + 2 * 10 + 4 * d * rs) and dense == 3 * 6 * 100
    with pytest.raises(RetrofitConfigError, match="skip_path"):
        RetrofitConfig(skip_path="bridge")


def test_qwen3_4b_with_rank_256_shortcuts_stays_under_half_a_percent(capsys):
    assert main(["params", "--backbone", "Qwen3-4B", "--rank", "256", "--skip-path", "shortcut", "--json"]) == 0
    import json

    r = json.loads(capsys.readouterr().out)
    assert r["shortcut_rank"] == 256 and r["shortcut_params"] == 2 * 2560 * 256 * (r["n_blocks"] - 2)
    assert r["percent"] < 0.5


def test_training_moves_the_shortcut_and_it_is_saved_and_loaded(tmp_path):
    model_dir = save_tiny(tmp_path / "model", "llama")
    data_dir = write_corpus(tmp_path / "corpus", n_docs=200)
    run = tmp_path / "run"
    assert main(["train", "--model", str(model_dir), "--data", str(data_dir), "--seq-len", "16", "--steps", "4",
                 "--batch-size", "2", "--eval-every", "4", "--save-every", "4", "--eval-sequences", "2",
                 "--block-size", "1", "--rank", "8", "--skip-path", "shortcut", "--skip-max-blocks", "3", "--quiet",
                 "--out", str(run)]) == 0
    import json

    records = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    joint = [r["skip_blocks"] for r in records if r["kind"] == "train"]
    assert any(len(j) > 1 for j in joint) and all(r["skip_block"] == j[0] for r, j in zip(
        [r for r in records if r["kind"] == "train"], joint))
    from transformers import AutoModelForCausalLM

    rm = load_adapter(AutoModelForCausalLM.from_pretrained(model_dir), run / "adapter")
    assert rm.config.skip_path == "shortcut"
    mods = rm.side_channel.shortcut_modules()
    assert mods and all(isinstance(m, SkipShortcut) for m in mods)
    # six blocks of one layer: shortcuts on blocks 2..5, the ones the skip branch dropped have left zero
    assert len(mods) == 4
    dropped = {b for j in joint for b in j}
    moved = {n for n, m in rm.side_channel.shortcuts.items() if m.low_rank.up.weight.abs().max() > 0}
    assert moved == {str(b) for b in dropped}


def test_drawn_blocks_keep_the_single_draw_and_add_joint_ones():
    from reskip.train.schedules import drawn_block, drawn_blocks

    assert [drawn_blocks(s, 0, [2, 3, 4]) for s in range(50)] == [[drawn_block(s, 0, [2, 3, 4])] for s in range(50)]
    joint = [drawn_blocks(s, 0, [2, 3, 4], 2) for s in range(200)]
    assert joint == [drawn_blocks(s, 0, [2, 3, 4], 2) for s in range(200)]  # a pure function of the step
    assert {len(j) for j in joint} == {1, 2} and all(j == sorted(set(j)) for j in joint)


def test_joint_skip_branch_with_shortcuts_equals_recomputing_it():
    """The skip branch dropping blocks 2 and 3 together (shared prefix, then later blocks skipped) equals a
    fresh pass with both skipped, logits and gradients, shortcut included."""
    cfg = tiny_model("llama").config
    cfg.num_hidden_layers = 8
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    rm = retrofit(LlamaForCausalLM(cfg).eval(), RetrofitConfig(**SHORTCUT, skip_path="shortcut"))
    rm.set_curriculum(1.0)
    _perturb(rm)
    ids, _ = batch(pad=False)
    out = []
    for shared in (True, False):
        rm.side_channel.zero_grad(set_to_none=True)
        with rm.capturing() as captured:
            full = rm(input_ids=ids, use_cache=False).logits
            cap = captured()
        if shared:
            with rm.replaying(cap, 2), rm.blocks_skipped(3):
                skip = rm(input_ids=ids, use_cache=False).logits
        else:
            with rm.blocks_skipped(2, 3):
                skip = rm(input_ids=ids, use_cache=False).logits
        (full.square().mean() + skip.square().mean()).backward()
        out.append((skip.detach(), [None if p.grad is None else p.grad.clone() for p in rm.trainable_parameters()]))
    assert torch.equal(out[0][0], out[1][0])
    for a, b in zip(out[0][1], out[1][1]):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b)
    grads = {id(p): p.grad for p in rm.trainable_parameters()}
    for m in rm.side_channel.shortcut_modules()[:2]:  # blocks 2 and 3 were skipped: their shortcuts learn
        assert grads[id(m.low_rank.up.weight)].abs().max() > 0


def test_local_regression_is_one_at_init_and_trains_every_shortcut():
    from reskip.train.objective import RetrofitObjective

    cfg = tiny_model("llama").config
    cfg.num_hidden_layers = 8
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    rm = retrofit(LlamaForCausalLM(cfg).eval(), RetrofitConfig(**SHORTCUT, skip_path="shortcut"))
    rm.set_curriculum(1.0)
    ids, _ = batch(pad=False)
    terms = RetrofitObjective(rm, 1.0, 0.01, lambda_local=1.0)(ids, ids.clone(), 2, 1.0, 1.0)
    assert terms["local"].item() == pytest.approx(1.0)  # S = 0: the residual is the whole block's change
    terms["loss"].backward()
    for m in rm.side_channel.shortcut_modules():  # blocks 2 and 3, though the skip branch dropped block 2 only
        assert m.low_rank.up.weight.grad.abs().max() > 0
