import pytest

from reskip.ar_retrofit.blocks import partition_layers
from reskip.ar_retrofit.config import RetrofitConfig


def sizes(blocks):
    return [len(b) for b in blocks]


def test_smollm2_split_is_balanced():
    blocks = partition_layers(30, 4)
    assert sizes(blocks) == [4, 4, 4, 4, 4, 4, 3, 3]
    assert blocks[0].start == 0 and blocks[-1].stop == 30


@pytest.mark.parametrize("n_layers,size", [(36, 4), (28, 4), (6, 4), (7, 3), (1, 4), (18, 4), (24, 5)])
def test_blocks_cover_layers_contiguously_with_sizes_within_one(n_layers, size):
    blocks = partition_layers(n_layers, size)
    assert [i for b in blocks for i in b] == list(range(n_layers))
    assert max(sizes(blocks)) - min(sizes(blocks)) <= 1
    assert max(sizes(blocks)) <= size
    assert len(blocks) == -(-n_layers // size)


def test_explicit_boundaries():
    assert [list(b) for b in partition_layers(6, boundaries=[1, 4])] == [[0], [1, 2, 3], [4, 5]]


@pytest.mark.parametrize("bad", [[0, 3], [3, 3], [4, 2], [6]])
def test_bad_boundaries_are_refused(bad):
    with pytest.raises(ValueError):
        partition_layers(6, boundaries=bad)


@pytest.mark.parametrize("kwargs", [{"rank": 0}, {"rank": -3}, {"block_size": 0}, {"activation": "tanh"}, {"up_init_std": 0.0}])
def test_bad_config_values_are_refused(kwargs):
    with pytest.raises(ValueError):
        RetrofitConfig(**kwargs)


def test_config_round_trip_and_unknown_keys():
    cfg = RetrofitConfig(block_size=3, rank=8, boundaries=[2, 4])
    assert RetrofitConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown"):
        RetrofitConfig.from_dict({"block_sise": 3})


def test_a_retrofit_needs_two_blocks():
    from helpers import tiny_model
    from reskip import ReskipError, retrofit
    from reskip.ar_retrofit.blocks import retrofit_blocks

    assert len(retrofit_blocks(6, 3)) == 2
    for kwargs in ({"block_size": 6}, {"block_size": 100}):
        with pytest.raises(ReskipError, match="at least two blocks"):
            retrofit(tiny_model("llama"), RetrofitConfig(**kwargs))
    with pytest.raises(ValueError, match="at least two blocks"):  # also a ValueError, for library callers
        retrofit_blocks(6, 6)
