"""Rewrite docs/guide.md's tables of every training and retrofit key and every stage option from their dataclasses' own help
text (`reskip.config_fields`): `python scripts/config_tables.py`. tests/test_docs.py fails when they differ."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from reskip.ar_retrofit.config import RetrofitConfig
from reskip.compress.options import CompressOptions
from reskip.config_fields import markdown_table
from reskip.evaluate.options import EvalOptions
from reskip.research.calibrate.options import CalibrateOptions
from reskip.research.report.options import DiagnoseOptions
from reskip.train_config import TrainConfig

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide.md"
TABLES = {"train-keys": lambda: markdown_table(TrainConfig, skip=("retrofit",)),
          "retrofit-keys": lambda: markdown_table(RetrofitConfig),
          "calibrate-options": lambda: markdown_table(CalibrateOptions),
          "eval-options": lambda: markdown_table(EvalOptions),
          "diagnose-options": lambda: markdown_table(DiagnoseOptions),
          "compress-options": lambda: markdown_table(CompressOptions)}


def render(text: str) -> str:
    """`text` with every `<!-- NAME -->...<!-- /NAME -->` block of TABLES regenerated."""
    for name, table in TABLES.items():
        text = re.sub(rf"<!-- {name} -->.*?<!-- /{name} -->", lambda _: f"<!-- {name} -->\n{table()}\n<!-- /{name} -->",
                      text, flags=re.S)
    return text


if __name__ == "__main__":
    GUIDE.write_text(render(GUIDE.read_text()))
    sys.exit(0)
