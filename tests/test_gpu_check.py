"""The prepared GPU check's CPU dry run (`bash benchmarks/gpu_check.sh --device cpu --tiny OUT`): every item runs and
writes its JSON line, so the script a GPU session runs in one call cannot rot between GPU sessions."""

import json
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"


@pytest.mark.integration
def test_the_gpu_check_dry_run_on_the_cpu(tmp_path):
    out = tmp_path / "gpu"
    proc = subprocess.run(["bash", str(SCRIPT), "--device", "cpu", "--tiny", str(out)], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [x["item"] for x in lines] == ["environment", "cuda_tests", "train", "speed", "summary"]
    items = {x["item"]: x for x in lines}
    assert all(items[n]["rc"] == 0 and json.loads((out / f"{n}.json").read_text()) == items[n]
               for n in ("environment", "cuda_tests", "train", "speed"))
    assert items["cuda_tests"]["result"]["passed"] >= 8 and items["cuda_tests"]["result"]["failed"] == 0
    train, speed = items["train"]["result"], items["speed"]["result"]
    assert train["tok_s_retrofit_bfloat16"] > 0 and 0 <= abs(train["side_channel_share_bfloat16"]) < 1
    assert {"batch_1", "batch_2", "prefill_64"} <= set(speed)
    assert speed["batch_1"]["static_1_mean_skipped"] == 1.0 and speed["batch_1"]["static_2_mean_skipped"] == 2.0
    assert all(f"reskip_{k}_vs_backbone_over_ideal" in speed[r] for k in (1, 2) for r in ("batch_1", "prefill_64"))
    assert items["summary"]["targets"]["cuda_tests_pass"] is True


def test_the_gpu_check_refuses_bad_arguments(tmp_path):
    for args in ([], ["--frobnicate", str(tmp_path)], [str(tmp_path / "a"), str(tmp_path / "b")]):
        proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stderr.strip(), args
