"""Run files of an older reskip load under today's names: one upgrade per file kind, chosen by format_version."""

import json

import pytest

from reskip import ReskipError
from reskip.run_folder.versions import FILE_VERSIONS, read_run_file, stamped, upgraded
from reskip.train.log import format_summary


def test_every_kind_upgrades_its_first_version_to_todays_names(tmp_path):
    old = {
        "summary.json": {"steps": 2, "tokens_seen": 10, "wall_s_this_session": 3.0, "ppl_backbone": 2.0,
                         "ppl_full": {"start": 2.0, "end": 1.5}, "kl_full": {"start": 0.0, "end": 0.1},
                         "entropy": {"start": {}, "end": {}, "max": {}}, "skip_kl": {"start": None, "end": None}},
        "diagnostics.json": {"memory": {"this_model": [], "seed_instance": {"rows": []}}, "n_blocks": 4,
                             "blocks": [], "dilution": {}, "routing_health": [], "mean_alpha": {}},
        "pipeline.json": {"finished": [], "timings": {}, "preset": "quick", "data": ["default"], "delta": 1.0},
        "policy.json": {"adapter": {"side_channel_digest": "x"}, "calibration": {}, "backbone": {}, "delta": 1.0,
                        "quantile": 0.5, "window": 1, "max_skips": 2, "blocks": [], "mean_alpha": {}},
        "results.json": {"meta": {}, "methods": {"reskip:budget=1.5:held": {}, "static:1": {}}, "frontier": [],
                         "heldout": {"methods": {"backbone": {}}}},
        "parity.json": {"model": "m", "parity": [], "params": {}},
    }
    assert set(old) == set(FILE_VERSIONS)
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
    results = read_run_file(tmp_path / "results.json")  # rows typed as today's evaluator writes them
    assert results["methods"]["reskip:budget=1.5:held"] == {"kind": "reskip", "arguments": {"budget": 1.5}}
    assert results["methods"]["static:1"]["kind"] == "static" and results["heldout"]["methods"]["backbone"]["kind"] == "backbone"
    for name in FILE_VERSIONS:
        assert read_run_file(tmp_path / name)["format_version"] == FILE_VERSIONS[name][0]


def test_todays_files_pass_unchanged_and_a_newer_one_is_refused(tmp_path):
    today = stamped("pipeline.json", {"finished": [], "timings": {}, "dtype": "bfloat16"})
    assert upgraded("pipeline.json", dict(today), "p") == today
    with pytest.raises(ReskipError, match="format_version 99.*upgrade reskip"):
        upgraded("summary.json", {"format_version": 99}, tmp_path / "summary.json")
    with pytest.raises(ReskipError, match="not a JSON object"):
        upgraded("diagnostics.json", [1], tmp_path / "diagnostics.json")


@pytest.mark.parametrize("kind", sorted(FILE_VERSIONS))
def test_a_file_without_what_its_readers_rely_on_is_one_clear_error(tmp_path, kind):
    """A run file cut short or edited (a key missing, a key of the wrong type) is refused on read, naming the file
    and the key, instead of failing later inside a reader (the report reads these without torch)."""
    from reskip.run_folder.versions import SCHEMAS

    key = next(iter(SCHEMAS[kind]))
    (tmp_path / kind).write_text(json.dumps({"format_version": FILE_VERSIONS[kind][0]}))
    with pytest.raises(ReskipError, match=f"{kind}: missing field '{key}'"):
        read_run_file(tmp_path / kind)
    (tmp_path / kind).write_text(json.dumps({"format_version": FILE_VERSIONS[kind][0], **{k: "x" for k in SCHEMAS[kind]}}))
    with pytest.raises(ReskipError, match="must be"):
        read_run_file(tmp_path / kind)


def test_the_report_of_a_corrupt_run_file_is_one_line(tmp_path, capsys):
    import shutil
    from pathlib import Path

    from reskip.cli import main

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parent.parent / "docs" / "results" / "main-standard", run)
    for name in ("summary.json", "diagnostics.json", "policy.json", "eval/results.json", "parity.json"):
        keep = (run / name).read_text()
        (run / name).write_text('{"methods": 5}')
        assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and name in err and len(err.strip().splitlines()) == 1
        (run / name).write_text(keep)


def test_a_baseline_arms_summary_is_named_for_what_it_is(tmp_path):
    """The baselines write a summary.json of their own fields (a LoRA run): refused with what to read instead."""
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 1, "lora": {"r": 4}, "ppl_full": {}}))
    with pytest.raises(ReskipError, match="is a healing run's summary"):
        read_run_file(tmp_path / "summary.json")
