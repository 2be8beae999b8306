"""How lm-evaluation-harness reaches reskip: lm-eval's own `register_model`, called when the plug-in module is
imported; nothing of reskip runs at interpreter start (fresh interpreters)."""

import site
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import has_package


def _fresh(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_nothing_of_reskip_runs_at_interpreter_start():
    out = _fresh("import sys; print(sorted(m for m in sys.modules if 'reskip' in m), 'torch' in sys.modules)")
    assert out == "[] False"
    for folder in [*site.getsitepackages(), site.getusersitepackages()]:
        for pth in Path(folder).glob("*reskip*.pth"):  # an editable install's path line is pip's, and runs nothing
            lines = pth.read_text().splitlines()
            assert not [x for x in lines if x.startswith("import")], f"{pth} runs code at interpreter start"


def test_importing_the_plug_in_registers_reskip_beside_the_harness_models():
    if not has_package("lm_eval"):
        pytest.fail("lm-eval is installed by the README's test command")
    out = _fresh("import reskip.evaluate.lm_eval_model; from lm_eval.api.registry import get_model; "
                 "print(get_model('reskip').__name__, get_model('hf').__name__, get_model('dummy').__name__)")
    assert out == "ReskipLM HFLM DummyLM"
