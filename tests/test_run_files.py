"""Run files of an older reskip load under today's names: one upgrade per file kind, chosen by format_version."""

import json

import pytest

from reskip import ReskipError
from reskip.run_files import KINDS, read_run_file, stamped, upgraded
from reskip.train.log import format_summary


def test_every_kind_upgrades_its_first_version_to_todays_names(tmp_path):
    old = {
        "summary.json": {"steps": 2, "tokens_seen": 10, "wall_s_this_session": 3.0, "ppl_backbone": 2.0,
                         "ppl_full": {"start": 2.0, "end": 1.5}, "kl_full": {"start": 0.0, "end": 0.1},
                         "entropy": {"start": {}, "end": {}, "max": {}}, "skip_kl": {"start": None, "end": None}},
        "diagnostics.json": {"memory": {"this_model": [], "seed_instance": {"rows": []}}},
        "pipeline.json": {"finished": [], "timings": {}, "preset": "quick", "data": ["default"], "delta": 1.0},
        "policy.json": {"adapter": {"side_channel_digest": "x"}, "calibration": {}},
    }
    assert set(old) == set(KINDS)
    for name, data in old.items():
        (tmp_path / name).write_text(json.dumps(data))
    summary = read_run_file(tmp_path / "summary.json")
    assert summary["wall_s_process"] == 3.0 and "wall_s_this_session" not in summary
    assert summary["skip_ppl"] == {"start": None, "end": None} and "wall 3 s" in format_summary(summary)
    assert read_run_file(tmp_path / "diagnostics.json")["memory"]["source_instance"] == {"rows": []}
    assert read_run_file(tmp_path / "pipeline.json")["dtype"] == "float32"
    policy = read_run_file(tmp_path / "policy.json")
    assert policy["adapter"]["forward_config"] is None and policy["calibration"]["wall_s"] is None
    assert policy["adapter"]["legacy_tensor_names"] is True
    for name in KINDS:
        assert read_run_file(tmp_path / name)["format_version"] == KINDS[name][0]


def test_todays_files_pass_unchanged_and_a_newer_one_is_refused(tmp_path):
    today = stamped("pipeline.json", {"finished": [], "dtype": "bfloat16"})
    assert upgraded("pipeline.json", dict(today), "p") == today
    with pytest.raises(ReskipError, match="format_version 99.*upgrade reskip"):
        upgraded("summary.json", {"format_version": 99}, tmp_path / "summary.json")
    with pytest.raises(ReskipError, match="not a JSON object"):
        upgraded("diagnostics.json", [1], tmp_path / "diagnostics.json")
