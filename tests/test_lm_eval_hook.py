"""The site-packages hook that registers `reskip` with lm-evaluation-harness (fresh interpreters)."""

import subprocess
import sys

import pytest

from helpers import has_package


def _fresh(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_interpreter_start_loads_the_hook_and_nothing_heavy():
    out = _fresh("import sys; print('reskip_lm_eval_hook' in sys.modules, 'torch' in sys.modules, "
                 "'lm_eval' in sys.modules)")
    assert out == "True False False", "reskip-lm-eval.pth is missing from site-packages: reinstall with `pip install .`"


def test_harness_resolves_reskip_and_its_own_models():
    if not has_package("lm_eval"):
        pytest.fail("lm-eval is installed by the README's test command")
    out = _fresh("from lm_eval.api.registry import get_model; "
                 "print(get_model('reskip').__name__, get_model('hf').__name__, get_model('dummy').__name__)")
    assert out == "ReskipLM HFLM DummyLM"
