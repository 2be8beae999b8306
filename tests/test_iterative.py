"""Iterative removal (`compress.iterative`): each round reads every unit still in the model by the KL to the
backbone with it removed on top of the current model, whose layers are renumbered once some are gone; the
backbone's references and the head are its own."""

import copy

import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_model
from reskip import compat
from reskip.compress.blocks import BlockCosts, prune
from reskip.compress.iterative import backbone_states, candidate_units, iterative_removal, removal_kl, removed_layers
from reskip.compress.lora import add_lora
from reskip.data.packing import Packed
from reskip.errors import ReskipError
from reskip.lora_ranks import matched_lora_config

BLOCKS = [[0], [1, 2], [3, 4], [5]]  # the tiny model's 6 layers in blocks: the first and the last never removed


def _data():
    ids = torch.randint(3, 90, (4, 12), generator=torch.Generator().manual_seed(0))
    return Packed(ids, ids.clone(), ["doc"] * 4)


def _silent(model, layer: int):
    """Make a layer write nothing (its attention's and MLP's outputs zero): removing it changes nothing."""
    with torch.no_grad():
        compat.decoder_layers(model)[layer].self_attn.o_proj.weight.zero_()
        compat.decoder_layers(model)[layer].mlp.down_proj.weight.zero_()


def _kl_direct(backbone, layers: set[int], data: Packed) -> float:
    """KL(backbone || backbone without `layers`) per position, from whole logits in float64."""
    pruned = prune(copy.deepcopy(backbone), layers)
    with torch.no_grad():
        p = F.log_softmax(backbone(input_ids=data.input_ids).logits.double(), -1)
        q = F.log_softmax(pruned(input_ids=data.input_ids).logits.double(), -1)
    return float((p.exp() * (p - q)).sum(-1).mean())


def test_the_candidates_are_the_middle_blocks_or_their_layers():
    assert candidate_units(BLOCKS, "blocks") == {2: [1, 2], 3: [3, 4]}
    assert candidate_units(BLOCKS, "layers") == {1: [1], 2: [2], 3: [3], 4: [4]}
    with pytest.raises(ReskipError, match="removal unit"):
        candidate_units(BLOCKS, "heads")


def test_round_one_is_the_backbone_ablation_read_as_kl_and_a_silent_layer_goes_first():
    backbone, data = tiny_model("llama", init_std=0.2), _data()
    _silent(backbone, 3)
    units = candidate_units(BLOCKS, "layers")
    kl = removal_kl(backbone, data, backbone_states(backbone, data, 2), compat.output_head(backbone), [], units, 2)
    assert kl[3] == pytest.approx(0.0, abs=1e-6)
    for layer in (1, 2, 4):
        assert kl[layer] == pytest.approx(_kl_direct(backbone, {layer}, data), rel=1e-4) and kl[layer] > 1e-4
    assert len(compat.decoder_layers(backbone)) == 6  # given back whole


def test_later_rounds_read_the_healed_model_in_its_own_numbering():
    """The heal callback's model has the chosen layers removed (here: pruned, with a PEFT LoRA that starts as the
    identity): round two's KL of each unit is the backbone's with both removed, read through the renumbered layers."""
    backbone, data = tiny_model("llama", init_std=0.2), _data()
    _silent(backbone, 2)
    units = candidate_units(BLOCKS, "layers")
    healed = []

    def heal(removed: list[int]):
        model = prune(copy.deepcopy(backbone), set(removed))
        peft = add_lora(model, matched_lora_config(model, 500, [])[0])
        healed.append(removed)
        return peft

    rounds = iterative_removal(backbone, data, units, 2, heal, batch_size=2)
    assert healed == [[2]] and rounds[0].chosen == 2 and rounds[1].removed_before == [2]
    assert set(rounds[1].kl) == {1, 3, 4}
    for layer in (1, 3, 4):
        assert rounds[1].kl[layer] == pytest.approx(_kl_direct(backbone, {2, layer}, data), rel=1e-4)
    assert rounds[1].chosen == min(rounds[1].kl, key=rounds[1].kl.get)
    assert removed_layers(rounds, units) == sorted({2, rounds[1].chosen})
    assert rounds[1].to_dict()["kl"].keys() == {"1", "3", "4"}


def test_blocks_as_units_and_bad_counts():
    backbone, data = tiny_model("llama", init_std=0.2), _data()
    units = candidate_units(BLOCKS, "blocks")
    rounds = iterative_removal(backbone, data, units, 1, heal=None, batch_size=4)
    assert set(rounds[0].kl) == {2, 3} and rounds[0].removed_before == []
    assert rounds[0].kl[2] == pytest.approx(_kl_direct(backbone, {1, 2}, data), rel=1e-4)
    with pytest.raises(ReskipError, match="cannot remove 3 units"):
        iterative_removal(backbone, data, units, 3, heal=None)
    with pytest.raises(ReskipError, match="already removed"):
        removal_kl(backbone, data, [], compat.output_head(backbone), [1, 2], {2: [1, 2]})


def test_the_blocks_a_cut_of_single_layers_removes_whole():
    costs = BlockCosts(BLOCKS, A={}, cos_in_out={})
    assert costs.blocks_within([1, 2, 3]) == [2] and costs.blocks_within([2, 3]) == []
    assert costs.blocks_within(sorted(costs.layers_of([2, 3]))) == [2, 3]
