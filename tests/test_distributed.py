"""Data-parallel training on 2 CPU processes (gloo) matches 1 process with the same global batch."""

import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

from conftest import save_tiny, write_corpus
from reskip.ar_retrofit.adapter_io import WEIGHTS_NAME
from reskip.cli import main


def test_two_cpu_processes_match_one(tmp_path):
    model_dir = save_tiny(tmp_path / "model", "qwen3")
    data_dir = write_corpus(tmp_path / "corpus")
    args = ["train", "--model", str(model_dir), "--data", str(data_dir), "--seq-len", "16", "--steps", "3",
            "--batch-size", "4", "--grad-accum", "1", "--eval-every", "3", "--save-every", "3",
            "--eval-sequences", "2", "--lr", "0.01", "--block-size", "2", "--rank", "8", "--quiet"]
    assert main(args + ["--out", str(tmp_path / "one")]) == 0
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
         "-m", "reskip.cli", *args, "--out", str(tmp_path / "two")],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = load_file(tmp_path / "one" / "adapter" / WEIGHTS_NAME)
    two = load_file(tmp_path / "two" / "adapter" / WEIGHTS_NAME)
    assert one.keys() == two.keys()
    # Each process saw half of every batch; only the summation order differs.
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=1e-4, atol=1e-6)
    logs = {n: [json.loads(x) for x in (tmp_path / n / "train_log.jsonl").read_text().splitlines()] for n in ("one", "two")}
    assert {r["processes"] for r in logs["one"] if r["kind"] == "train"} == {1}
    assert {r["processes"] for r in logs["two"] if r["kind"] == "train"} == {2}
    for a, b in zip(logs["one"], logs["two"]):
        if a["kind"] == "train":
            assert a["skip_block"] == b["skip_block"] and abs(a["loss"] - b["loss"]) < 1e-4
