"""Healing by distillation from the backbone: the teacher is the same model with its removed layers put back and
the LoRA off (no second copy of the weights), the chunked and whole-logits objectives agree, and a kd-healed arm
moves toward the backbone."""

import pytest
import torch

from helpers import FAMILIES, tiny_model
from reskip import compat
from reskip.compress.blocks import prune_keeping
from reskip.compress.lora import add_lora
from reskip.compress.objectives import HealingObjective
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


def _reference(peft, removed, ids, labels, divergence, replies: bool):
    """The divergence written plainly on whole logits (log_softmax), summed over the positions read, and its
    gradients: what the chunked loss objects must equal."""
    peft.zero_grad()
    with HealingObjective(peft, "kd", removed=removed).teacher():
        lp = peft(input_ids=ids, use_cache=False).logits.float().log_softmax(-1)
    lq = peft(input_ids=ids, use_cache=False).logits.float().log_softmax(-1)
    p, q = lp.exp(), lq.exp()
    if divergence == "kd":
        per = (p * (lp - lq)).sum(-1)
    elif divergence == "rkl":
        per = (q * (lq - lp)).sum(-1)
    else:  # jsd:0.3, TRL's convention: m = beta p + (1 - beta) q
        beta = 0.3
        lm = torch.log(beta * p + (1 - beta) * q)
        per = beta * (p * (lp - lm)).sum(-1) + (1 - beta) * (q * (lq - lm)).sum(-1)
    mask = torch.nn.functional.pad(labels[:, 1:] != -100, (0, 1), value=False) if replies else torch.ones_like(per, dtype=torch.bool)
    value = (per * mask).sum() / mask.sum()
    value.backward()
    return value.item(), [p.grad.clone() for p in peft.parameters() if p.requires_grad]


@pytest.mark.parametrize("objective,positions", [("kd", "replies"), ("rkl", "all"), ("rkl", "replies"),
                                                 ("jsd:0.3", "all")])
def test_each_divergence_equals_its_formula_with_its_gradients(objective, positions):
    peft, removed, ids, _ = _healed("llama")
    labels = ids.clone()
    labels[:, :5] = -100  # a chat prompt: its positions are not a reply's
    n_targets, n_positions = int((labels[:, 1:] != -100).sum()), ids.numel()
    expected, grads = _reference(peft, removed, ids, labels, objective.partition(":")[0], positions == "replies")
    peft.zero_grad()
    terms = HealingObjective(peft, objective, 1.0, 5, removed, positions)(ids, labels, n_targets, n_positions)
    terms["loss"].backward()
    assert terms["loss"].item() == pytest.approx(expected, rel=1e-5) and terms["kl"].item() > 0
    for g, p in zip(grads, [p for p in peft.parameters() if p.requires_grad]):
        assert torch.allclose(p.grad, g, rtol=1e-3, atol=1e-7)


def test_the_objectives_table_parses_and_refuses():
    from reskip.compress.objectives import OBJECTIVES, parse_objective
    from reskip.compress.options import OBJECTIVE_NAMES
    from reskip.errors import ReskipError

    assert [n.partition("[")[0] for n in OBJECTIVE_NAMES] == list(OBJECTIVES)  # the CLI's help names the table
    assert parse_objective("jsd").text == "jsd:0.5" and parse_objective("jsd:0.9").text == "jsd:0.9"
    assert parse_objective("kd").is_forward_kl and not parse_objective("ce").needs_teacher
    for bad, match in (("kl", "one of kd, rkl"), ("jsd:1", "strictly between"), ("jsd:x", "strictly between"),
                       ("kd:2", "takes no option")):
        with pytest.raises(ReskipError, match=match):
            parse_objective(bad)


def test_on_policy_steps_and_the_students_samples(tmp_path):
    from helpers import save_tiny
    from reskip.backbones.loading import load_backbone
    from reskip.compress.on_policy import on_policy_step, prompt_pool, sampled_batch
    from reskip.data.documents import Document

    assert [s for s in range(12) if on_policy_step(s, 0.25)] == [3, 7, 11]
    assert not any(on_policy_step(s, 0.0) for s in range(10)) and all(on_policy_step(s, 1.0) for s in range(10))
    folder = save_tiny(tmp_path / "m", "llama", chat=True)
    model, tok = load_backbone(str(folder), "float32", False, "cpu")
    docs = [Document(f"c{i}", "self", messages=[{"role": "user", "content": f"w{5 + i} w{6 + i}"},
                                              {"role": "assistant", "content": "w9"}]) for i in range(4)]
    docs.append(Document("t", "text", text="w5 w6"))
    dialogue = Document("d", "dialogue", messages=[{"role": "user", "content": "w40"}, {"role": "assistant", "content": "w9"}])
    pool = prompt_pool(tok, [dialogue, *docs], 8)  # the model's own requests first: the dialogue's is left out
    assert pool.texts[0] == "w2 w5 w6 w1 w3 " and len(pool.texts) == 4
    assert prompt_pool(tok, [dialogue, docs[-1]], 8).texts == ["w2 w40 w1 w3 "]  # no own requests: every chat one
    ids, labels = sampled_batch(model, tok, pool, step=3, seed=0, batch_size=3, reply_tokens=6)
    again = sampled_batch(model, tok, pool, step=3, seed=0, batch_size=3, reply_tokens=6)
    assert torch.equal(ids, again[0]) and torch.equal(labels, again[1])  # a pure function of (seed, step)
    for row, lab in zip(ids.tolist(), labels.tolist()):
        start = 5  # every prompt here is five tokens: the labels start at the sample
        assert set(lab[:start]) == {-100} and lab[start] != -100 and lab[start] == row[start]
    with pytest.raises(Exception, match="no chat prompt|holds none"):
        prompt_pool(tok, docs[-1:], 8)
