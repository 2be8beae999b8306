"""CONTRIBUTING.md's how-tos, followed: a healing objective added as its guide says (a divergence function and one row
of the table) is then an objective of `reskip compress`, of the healing loss and of the experiments."""

import pytest
import torch

from reskip.compress import objectives
from reskip.compress.objectives import OBJECTIVES, HealingLoss, HealingObjective, parse_objective


def total_variation(zt: torch.Tensor, zs: torch.Tensor) -> torch.Tensor:
    """Step 1: a divergence of the teacher's and the student's logits (N, V) -> (N,)."""
    return 0.5 * (zt.softmax(-1) - zs.softmax(-1)).abs().sum(-1)


def test_a_healing_objective_added_as_the_guide_says(monkeypatch):
    text = open("CONTRIBUTING.md").read()
    assert "## Add a healing objective" in text and "`OBJECTIVES`" in text and "divergences.py" in text
    # step 2: one row in the table
    row = ("total variation distance", lambda option: HealingLoss("tvd", total_variation, False, "tvd"))
    monkeypatch.setitem(OBJECTIVES, "tvd", row)
    assert parse_objective("tvd").divergence is total_variation
    # the healing loss trains with it (a tiny pruned model and its LoRA), its gradient reaching the LoRA only
    from helpers import tiny_model
    from reskip.compress.blocks import prune_keeping
    from reskip.compress.lora import add_lora
    from reskip.lora_ranks import matched_lora_config

    model = tiny_model("llama", init_std=0.2)
    removed = prune_keeping(model, {2, 3})
    peft = add_lora(model, matched_lora_config(model, 3_000)[0])
    for p in peft.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    ids = torch.randint(3, 90, (2, 12), generator=torch.Generator().manual_seed(0))
    terms = HealingObjective(peft, "tvd", 1.0, 5, removed)(ids, ids, ids.numel(), ids.numel())
    terms["loss"].backward()
    assert 0 < terms["loss"].item() < 1 and all(p.grad is not None for p in peft.parameters() if p.requires_grad)
    # and `reskip compress` takes it before any weights load
    from reskip.compress.options import CompressOptions
    from reskip.compress.run import plan

    assert plan(CompressOptions(out="x", objective="tvd", heldout=[])).identity["objective"] == "tvd"
    assert "tvd: total variation distance" in objectives.objective_help()  # the errors and docs read the table
    with pytest.raises(Exception, match="healing objective 'tvx'"):
        parse_objective("tvx")
