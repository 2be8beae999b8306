"""Step-zero parity: at c = 0 the logits are torch.equal to the backbone's."""

import pytest
import torch

from helpers import batch, tiny_model
from reskip import RetrofitConfig, retrofit


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pad", [False, True])
def test_logits_equal_backbone_at_c0(family, dtype, pad):
    model = tiny_model(family, dtype)
    ids, mask = batch(pad=pad)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
        rm = retrofit(model, RetrofitConfig(block_size=2, rank=8))
        rm.set_curriculum(0.0)
        out = rm(input_ids=ids, attention_mask=mask, output_alphas=True)
    assert torch.equal(out.logits, ref)
    # The side-channel really ran: every router produced alpha over its sources.
    assert sorted(out.alphas) == [2, 3]
    for n, alpha in out.alphas.items():
        assert alpha.shape == (ids.shape[0], ids.shape[1], n)


def test_side_channel_changes_logits_when_gate_open(family):
    model = tiny_model(family)
    ids, mask = batch()
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
        rm = retrofit(model, RetrofitConfig(block_size=2, rank=8, up_init_std=0.5))
        rm.set_curriculum(1.0)
        out = rm(input_ids=ids, attention_mask=mask).logits
        with rm.side_channel_disabled():
            teacher = rm(input_ids=ids, attention_mask=mask).logits
    assert not torch.equal(out, ref)  # the parity test above is not trivially true
    assert torch.equal(teacher, ref)  # switched off: the backbone itself


def test_generation_at_c0_matches_backbone(family):
    model = tiny_model(family)
    ids, mask = batch(bsz=2)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        ref = model.generate(ids, **kw)
        rm = retrofit(model, RetrofitConfig(block_size=2, rank=8))
        rm.set_curriculum(0.0)
        out = rm.generate(ids, **kw)
    assert torch.equal(out, ref)


def test_unretrofit_restores_the_original_layers(family):
    model = tiny_model(family)
    before = [id(layer) for layer in model.model.layers]
    rm = retrofit(model)
    assert [id(layer) for layer in model.model.layers] != before
    assert rm.unretrofit() is model
    assert [id(layer) for layer in model.model.layers] == before


@pytest.mark.real
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bundled_smollm2_parity_cli(dtype, capsys):
    import json

    from reskip.cli import main

    assert main(["parity", "--dtype", dtype, "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["max_abs_diff"] == 0 and result["equal"] is True
    assert result["dtype"] == dtype and result["tokens"] > 20 and result["padded_rows"] >= 1
    assert result["n_blocks"] == 8  # 30 layers -> 4,4,4,4,4,4,3,3
