"""`reskip generate` opens any kind of the one table: a retrofit run under a skip policy, a model of its own opened
from the run's backbone (`pruned:K`), an exported folder; options that do not apply are refused, never ignored."""

import json

from helpers import save_tiny, tiny_trained_run
from reskip.backbones.loading import load_backbone
from reskip.cli import main
from reskip.compress.blocks import prune


def test_generate_serves_every_kind_and_refuses_what_would_be_ignored(tmp_path, capsys):
    run = tiny_trained_run(tmp_path, calibrate=[])
    capsys.readouterr()
    assert main(["generate", str(run), "w5 w6", "--policy", "pruned:1", "--max-new-tokens", "3"]) == 0
    assert "[pruned:1] 4 of 6 layers run at every step (2 removed)" in capsys.readouterr().out  # blocks of 2
    assert main(["generate", str(run), "w5 w6", "--policy", "static:1", "--max-new-tokens", "3"]) == 0
    assert "blocks skipped per step" in capsys.readouterr().out
    # an exported folder, as `reskip compress` writes one: a plain model and its record
    model, tok = load_backbone(str(save_tiny(tmp_path / "m", "llama")), "float32", False, "cpu")
    prune(model, {2})
    folder = tmp_path / "exported"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / "reskip.json").write_text(json.dumps({"backbone": "tiny", "backbone_layers": 6, "drop_layers": [2],
                                                    "drop_blocks": [3]}))
    assert main(["generate", str(folder), "w5 w6", "--max-new-tokens", "3"]) == 0
    assert "[exported] 5 of 6 layers run at every step (1 removed)" in capsys.readouterr().out
    for extra in (["--policy", "static:1"], ["--window", "4"], ["--model", str(tmp_path / "m")]):
        assert main(["generate", str(folder), "w5", *extra]) == 2
        assert "would be ignored" in capsys.readouterr().err
    assert main(["generate", str(run), "w5", "--policy", "pruned:1", "--window", "4"]) == 2
    assert "would be ignored" in capsys.readouterr().err


def test_an_exported_folder_is_scored_by_the_model_it_holds_not_by_its_record(tmp_path, capsys):
    """A record that does not describe the folder's model (every layer "removed" from a model that keeps 5 of 6, or
    other layers than the ones gone) is refused, never scored at the share of compute it claims."""
    run = tiny_trained_run(tmp_path, calibrate=[])
    model, tok = load_backbone(str(tmp_path / "model"), "float32", False, "cpu")
    prune(model, {2})
    folder = tmp_path / "exported"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    args = ["eval", str(run), "--methods", "backbone", f"export:{folder}", "--benchmarks", "none", "--sequences", "2",
            "--quiet", "--out", str(tmp_path / "ev")]
    for drop in ([0, 1, 2, 3, 4, 5], [2, 3]):
        (folder / "reskip.json").write_text(json.dumps({"backbone": "tiny", "backbone_layers": 6, "drop_layers": drop,
                                                        "drop_blocks": []}))
        capsys.readouterr()
        assert main(args) == 2
        assert "does not describe this model" in capsys.readouterr().err
    (folder / "reskip.json").write_text(json.dumps({"backbone": "tiny", "backbone_layers": 6, "drop_layers": [2],
                                                    "drop_blocks": [2]}))
    assert main(args) == 0
    row = json.loads((tmp_path / "ev" / "results.json").read_text())["methods"][f"export:{folder}"]
    assert row["flops_executed_share"] == 5 / 6
