"""The code passes the linter as pyproject.toml's [tool.ruff] configures it (unused or undefined names, statements
that do nothing, syntax that a supported Python refuses)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    if ruff is None:
        pytest.skip("ruff is not installed (the test extra installs it)")
    r = subprocess.run([ruff, "check", "src", "tests", "benchmarks"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
