"""What a user with static models gets between their depths: the per-sequence mixture of the two static points
around a compute, and a dynamic method's difference from it, pair by pair."""

import pytest

from reskip.errors import ReskipError
from reskip.research.experiments.static_mixture import backbone_row, minus_mixture, mixture, neighbours, same_sequences


def _row(share, kl, agree, positions=(10, 10, 10)):
    return {"flops_executed_share": share, "kl_to_backbone": sum(kl) / sum(positions),
            "per_sequence": {"kl": list(kl), "agree": list(agree), "positions": list(positions)}}


def test_the_mixture_between_two_static_points_meets_the_compute_and_mixes_each_sequence():
    one, two = _row(0.9, (1.0, 2.0, 3.0), (9, 8, 7)), _row(0.7, (3.0, 4.0, 5.0), (6, 5, 4))
    static = {"backbone": backbone_row(one), "kd-1": one, "kd-2": two}
    assert neighbours(static, 0.95) == ("backbone", "kd-1", pytest.approx(0.5))
    hi, lo, f = neighbours(static, 0.75)
    assert (hi, lo) == ("kd-1", "kd-2") and f == pytest.approx(0.75)
    assert neighbours(static, 0.5) is None  # beyond the deepest static point
    mix = mixture(static, 0.75)
    assert mix["per_sequence"]["kl"] == pytest.approx([2.5, 3.5, 4.5])
    assert mix["kl"] == pytest.approx(10.5 / 30) and mix["top1"] == pytest.approx((6.75 + 5.75 + 4.75) / 30)
    dynamic = _row(0.75, (2.0, 3.0, 4.0), (7, 6, 5))
    d = minus_mixture(dynamic, mix)
    assert d["kl"]["mean"] == pytest.approx(9 / 30 - 10.5 / 30) and d["kl"]["lo"] <= d["kl"]["mean"] <= d["kl"]["hi"]
    assert backbone_row(one)["per_sequence"]["agree"] == [10.0, 10.0, 10.0]


def test_rows_of_other_sequences_are_refused():
    with pytest.raises(ReskipError, match="same sequences"):
        same_sequences(_row(0.9, (1, 1, 1), (1, 1, 1)), _row(0.9, (1, 1), (1, 1), positions=(10, 10)))
