"""Healing by distillation from the backbone: the teacher is the same model with its removed layers put back and
the LoRA off (no second copy of the weights), the chunked and whole-logits objectives agree, and a kd-healed arm
moves toward the backbone."""

import pytest
import torch

from helpers import FAMILIES, tiny_model
from reskip import compat
from reskip.baselines.healing import HealingObjective
from reskip.baselines.lora import add_lora
from reskip.baselines.pruning import prune_keeping
from reskip.lora_ranks import matched_lora_config


def _healed(family, drop=(2, 3)):
    model = tiny_model(family, init_std=0.2)
    ids = torch.randint(3, 90, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = model(input_ids=ids, use_cache=False).logits
    removed = prune_keeping(model, set(drop))
    peft = add_lora(model, matched_lora_config(model, 3_000)[0])
    for p in peft.parameters():  # a LoRA that has learned something: B != 0
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    return peft, removed, ids, whole


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_teacher_is_the_unpruned_backbone_exactly_and_leaves_the_student_as_it_was(family):
    peft, removed, ids, whole = _healed(family)
    objective = HealingObjective(peft, "kd", removed=removed)
    with torch.no_grad():
        student = peft(input_ids=ids, use_cache=False).logits
    with objective.teacher():
        teacher = peft(input_ids=ids, use_cache=False).logits
        assert len(compat.decoder_layers(peft.get_base_model())) == 6
    assert torch.equal(teacher, whole)  # the backbone, bit for bit: layers back, LoRA off
    assert not torch.allclose(student, whole)
    with torch.no_grad():
        assert torch.equal(peft(input_ids=ids, use_cache=False).logits, student)  # nothing leaked out of the teacher
    base = peft.get_base_model()
    assert base.config.num_hidden_layers == 4 and len(compat.decoder_layers(base)) == 4
    with torch.no_grad():  # the cache is still indexed right after the teacher's renumbering
        a = base.generate(ids[:1], max_new_tokens=4, do_sample=False, use_cache=True)
        b = base.generate(ids[:1], max_new_tokens=4, do_sample=False, use_cache=False)
    assert torch.equal(a, b)


@pytest.mark.parametrize("objective", ["kd", "kd+ce"])
def test_chunked_and_whole_logits_objectives_agree_with_their_gradients(objective):
    peft, removed, ids, _ = _healed("llama")
    labels = ids.clone()
    labels[0, :3] = -100
    n_targets, n_positions = int((labels[:, 1:] != -100).sum()), ids.numel()
    out = {}
    for chunk in (5, None):
        peft.zero_grad()
        terms = HealingObjective(peft, objective, 1.0, chunk, removed)(ids, labels, n_targets, n_positions)
        terms["loss"].backward()
        grads = [p.grad.clone() for p in peft.parameters() if p.requires_grad]
        out[chunk] = (terms, grads)
    (a, ga), (b, gb) = out[5], out[None]
    for key in ("loss", "ce", "kl"):
        assert a[key].item() == pytest.approx(b[key].item(), rel=1e-5)
    assert a["kl"].item() > 0
    for x, y in zip(ga, gb):
        assert torch.allclose(x, y, rtol=1e-4, atol=1e-7)


def test_temperature_scales_the_kl_as_hinton_does():
    """At T the objective's KL is T^2 KL(softmax(z_t / T) || softmax(z / T)) per position (Hinton et al.), checked
    against that formula written with log_softmax (float32 both: within 1e-4)."""
    peft, removed, ids, _ = _healed("llama")
    labels = ids.clone()
    n = ids.numel()
    t = 4.0
    kl = HealingObjective(peft, "kd", t, None, removed)(ids, labels, 1, n)["kl"].item()
    with torch.no_grad():
        z = peft(input_ids=ids, use_cache=False).logits.float() / t
        with HealingObjective(peft, "kd", removed=removed).teacher():
            zt = peft(input_ids=ids, use_cache=False).logits.float() / t
    p = torch.softmax(zt, -1)
    expected = (p * (torch.log_softmax(zt, -1) - torch.log_softmax(z, -1))).sum(-1).mean().item() * t * t
    assert kl == pytest.approx(expected, rel=1e-4)
