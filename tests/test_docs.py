"""The documentation's generated parts match the code they describe."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _config_tables():
    spec = importlib.util.spec_from_file_location("config_tables", ROOT / "scripts" / "config_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_guide_s_key_tables_are_the_config_fields_help():
    tables = _config_tables()
    text = tables.GUIDE.read_text()
    assert tables.render(text) == text, "docs/guide.md is stale: run `python scripts/config_tables.py`"
    assert "| `lr` / `--lr` | `0.002` | peak learning rate" in text and "| `rank` / `--rank` | `null` |" in text


def test_no_development_history_outside_the_notebook():
    """README, docs (but the lab notebook), code, tests, benchmarks and scripts say what is, not when."""
    pattern = re.compile(r"session [0-9]|sessions? [0-9]|issue [0-9]|\bE[0-9]+\b", re.I)
    roots = [ROOT / "README.md", ROOT / "src", ROOT / "tests", ROOT / "benchmarks", ROOT / "scripts", ROOT / "docs"]
    hits = []
    for root in roots:
        for path in ([root] if root.is_file() else sorted(root.rglob("*"))):
            if (not path.is_file() or path.name == "experiments.md" or "egg-info" in str(path)
                    or path.suffix not in (".py", ".md", ".sh", ".toml", ".yaml", ".html", ".txt")):
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if pattern.search(line.replace("noqa: E", "")):
                    hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:80]}")
    assert not hits, "\n".join(hits)
