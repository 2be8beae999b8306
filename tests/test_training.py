"""Training: schedules, the shared-prefix skip branch, exact resume, NaN stop, config refusals."""

import json
import math
import os
import time

import pytest
import torch

from helpers import batch, tiny_model
from reskip import ReskipError, RetrofitConfig, retrofit
from reskip.ar_retrofit.adapter_io import WEIGHTS_NAME
from reskip.ar_retrofit.model import load_adapter
from reskip.reading import read_json
from reskip.train.checkpoint import latest_checkpoint
from reskip.train.loop import TrainingDiverged
from reskip.train.run import train_run
from reskip.train.schedules import curriculum, drawn_block, learning_rate
from reskip.train_config import TrainConfig


def test_curriculum_holds_ramps_and_stays_open():
    total = 100
    assert [curriculum(s, total, 0.05, 0.3) for s in (0, 4)] == [0.0, 0.0]
    assert curriculum(5, total, 0.05, 0.3) == 0.0  # ramp starts from 0
    assert curriculum(30, total, 0.05, 0.3) == 1.0 and curriculum(99, total, 0.05, 0.3) == 1.0
    mid = curriculum(17, total, 0.05, 0.3)
    assert math.isclose(mid, (0.17 - 0.05) / 0.25)
    values = [curriculum(s, total, 0.05, 0.3) for s in range(total)]
    assert values == sorted(values)


def test_learning_rate_warms_up_then_decays_to_the_floor():
    lrs = [learning_rate(s, 100, 1.0, warmup_frac=0.1, min_lr_frac=0.1) for s in range(101)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[100] == pytest.approx(0.1)


def test_drawn_block_is_a_pure_function_of_seed_and_step():
    draws = [drawn_block(s, 0, [2, 3, 4]) for s in range(200)]
    assert draws == [drawn_block(s, 0, [2, 3, 4]) for s in range(200)]
    assert set(draws) == {2, 3, 4}


def _full_and_skip_grads(rm, ids, k, shared: bool):
    rm.side_channel.zero_grad(set_to_none=True)
    with rm.capturing() as captured:
        full = rm(input_ids=ids, use_cache=False).logits
        cap = captured()
    if shared:
        with rm.replaying(cap, k):
            skip = rm(input_ids=ids, use_cache=False).logits
    else:
        with rm.blocks_skipped(k):
            skip = rm(input_ids=ids, use_cache=False).logits
    (full.square().mean() + skip.square().mean()).backward()
    return skip.detach(), [p.grad.clone() for p in rm.trainable_parameters()]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_shared_prefix_skip_branch_equals_recomputing_it(k):
    rm = retrofit(tiny_model("qwen3"), RetrofitConfig(block_size=2, rank=8, up_init_std=0.3))
    ids, _ = batch(pad=False)
    skip_a, grads_a = _full_and_skip_grads(rm, ids, k, shared=True)
    skip_b, grads_b = _full_and_skip_grads(rm, ids, k, shared=False)
    assert torch.equal(skip_a, skip_b)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(a, b)


def test_continuing_after_block_one_equals_the_full_pass():
    rm = retrofit(tiny_model("llama"), RetrofitConfig(block_size=2, rank=8, up_init_std=0.3))
    ids, _ = batch(pad=False)
    with torch.no_grad():
        with rm.side_channel_disabled(), rm.capturing() as captured:
            rm(input_ids=ids, use_cache=False)
            teacher = captured()
        full = rm(input_ids=ids, use_cache=False).logits
        with rm.continuing(teacher, 1):
            shared = rm(input_ids=ids, use_cache=False).logits
    assert torch.equal(full, shared)


def test_training_writes_run_files_and_changes_only_the_side_channel(tiny_run, tmp_path):
    out = tmp_path / "run"
    summary = read_json(train_run(out, tiny_run(), show_progress=False))
    assert {p.name for p in out.iterdir()} >= {"config.yaml", "splits.json", "train_log.jsonl", "checkpoints", "adapter", "summary.json"}
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    trains = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in trains] == [1, 2, 3, 4] and [r["step"] for r in evals] == [0, 2, 4]
    for key in ("c", "lr", "loss", "ce", "kl", "entropy", "skip_block", "tokens_seen"):
        assert key in trains[0]
    assert trains[-1]["tokens_seen"] == 4 * 4 * 16
    ev = evals[-1]
    assert set(ev["entropy"]) == {"2", "3"} and ev["entropy_max"]["3"] == pytest.approx(math.log(3))
    assert set(ev["skip_kl"]) == {"1", "2", "3"}
    assert evals[0]["ppl_full"] == evals[0]["ppl_backbone"]  # c = 0 at step 0: the backbone exactly
    assert summary["steps"] == 4
    splits = json.loads((out / "splits.json").read_text())["splits"]
    assert sum(s["documents"] for s in splits.values()) > 100
    # The saved backbone on disk is untouched, and the adapter loads onto it.
    from reskip.backbones.loading import load_backbone

    base, _ = load_backbone(tiny_run().model)
    load_adapter(base, out / "adapter")


def test_resume_after_a_kill_is_exact(tiny_run, tmp_path):
    train_run(tmp_path / "straight", tiny_run(), show_progress=False)

    def crash(step, model):
        if step == 2:
            raise KeyboardInterrupt("simulated kill after the step-2 checkpoint")

    with pytest.raises(KeyboardInterrupt):
        train_run(tmp_path / "resumed", tiny_run(), on_step_end=crash, show_progress=False)
    assert latest_checkpoint(tmp_path / "resumed").name == "step-000002"
    train_run(tmp_path / "resumed", tiny_run(), resume=True, show_progress=False)
    a = (tmp_path / "straight" / "adapter" / WEIGHTS_NAME).read_bytes()
    b = (tmp_path / "resumed" / "adapter" / WEIGHTS_NAME).read_bytes()
    assert a == b
    steps = [json.loads(x)["step"] for x in (tmp_path / "resumed" / "train_log.jsonl").read_text().splitlines()
             if json.loads(x)["kind"] == "train"]
    assert steps == [1, 2, 3, 4]


def test_nan_loss_stops_with_a_clear_message_and_keeps_the_last_checkpoint(tiny_run, tmp_path):
    def poison(step, model):
        if step == 2:
            with torch.no_grad():
                model.side_channel.block(2).router.query.fill_(float("nan"))

    with pytest.raises(TrainingDiverged, match="step 2.*Last good checkpoint.*step-000002"):
        train_run(tmp_path / "run", tiny_run(), on_step_end=poison, show_progress=False)
    ckpt = latest_checkpoint(tmp_path / "run")
    from safetensors.torch import load_file

    assert all(torch.isfinite(t).all() for t in load_file(ckpt / WEIGHTS_NAME).values())


@pytest.mark.parametrize(
    "change,message",
    [
        ({"retrofit": {"rank": 0}}, "rank"),
        ({"hold_frac": 1.5}, "hold_frac"),
        ({"ramp_end_frac": -0.1}, "ramp_end_frac"),
        ({"batch_size": 3, "grad_accum": 2}, "divisible"),
        ({"steps": 0}, "steps"),
        ({"seq_len": 4096}, "exceeds the model's limit"),
        ({"skip_blocks": [7]}, "beyond"),
    ],
)
def test_bad_values_are_refused_before_the_model_loads(tiny_run, tmp_path, monkeypatch, change, message):
    import reskip.train.loop as training

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the config was checked")

    monkeypatch.setattr(training, "load_backbone", no_load)
    with pytest.raises(ReskipError, match=message):
        train_run(tmp_path / "run", tiny_run(**change), show_progress=False)
    assert not (tmp_path / "run").exists()


def test_empty_data_is_refused(tiny_run, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.txt").write_text("")
    with pytest.raises(ReskipError, match="empty|no training documents"):
        train_run(tmp_path / "run", tiny_run(data=[str(empty)]), show_progress=False)


def test_unknown_keys_are_refused():
    with pytest.raises(ReskipError, match="unknown training config keys"):
        TrainConfig.from_yaml("steps: 3\nlearning_rate: 0.1\n")


def test_router_learning_rate_multipliers_take_effect(tiny_run, tmp_path):
    """Queries at a 1e-8 multiple of the lr stay where they started; the adapters still move."""
    from reskip.train.loop import parameter_groups

    rm = retrofit(tiny_model("llama"), RetrofitConfig(block_size=2, rank=8))
    groups = parameter_groups(rm, tiny_run(router_lr_mult=3.0, source_bias_lr_mult=5.0))
    assert [g["lr_mult"] for g in groups] == [3.0, 5.0, 1.0]
    ids = [id(p) for g in groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in rm.trainable_parameters()) and len(set(ids)) == len(ids)
    assert {id(p) for p in groups[0]["params"]} == {id(r.query) for r in rm.side_channel.routers()}

    out = tmp_path / "run"
    train_run(out, tiny_run(router_lr_mult=1e-8, source_bias_lr_mult=1e-8, hold_frac=0.0, ramp_end_frac=0.0),
          show_progress=False)
    init = retrofit(tiny_model("llama"), RetrofitConfig(block_size=2, rank=8), seed=0)
    trained = load_adapter(tiny_model("llama"), out / "adapter")
    for a, b in zip(init.side_channel.routers(), trained.side_channel.routers()):
        assert torch.allclose(a.query, b.query, atol=1e-6) and torch.allclose(a.source_bias, b.source_bias, atol=1e-6)
    moved = [not torch.allclose(a.correction.up.weight, b.correction.up.weight)
             for a, b in zip(init.side_channel.per_block.values(), trained.side_channel.per_block.values())]
    assert any(moved)
    logged = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    ev = [r for r in logged if r["kind"] == "eval"][-1]
    assert set(ev["query_norm"]) == set(ev["alpha_prev_std"]) == {"2", "3"}


def test_signal_term_reaches_the_drawn_blocks_router():
    from reskip.train.objective import RetrofitObjective, pearson

    x, y = torch.randn(50, dtype=torch.float64), torch.randn(50, dtype=torch.float64)
    import numpy as np

    assert pearson(x, y).item() == pytest.approx(np.corrcoef(x.numpy(), y.numpy())[0, 1], rel=1e-6)
    rm = retrofit(tiny_model("llama", init_std=0.3), RetrofitConfig(block_size=2, rank=8, up_init_std=0.3))
    rm.set_curriculum(1.0)
    ids, _ = batch(pad=False)
    grads = {}
    for lam in (0.0, 1.0):
        rm.side_channel.zero_grad(set_to_none=True)
        terms = RetrofitObjective(rm, 1.0, 0.01, lam)(ids, ids.clone(), 3, 1.0, 1.0)
        terms["loss"].backward()
        grads[lam] = rm.side_channel.block(3).router.query.grad.clone()
        if lam:
            assert -1 <= terms["sig"].item() <= 1 and terms["sig"].item() != 0
        else:
            assert terms["sig"].item() == 0
    assert not torch.allclose(grads[0.0], grads[1.0])


def test_token_level_skip_branch_matches_the_reference_and_resumes(tiny_run, tmp_path):
    """skip_fraction < 1: the drawn block is identity at a seeded share of positions; the branch
    equals a plain position-skip pass, and the masks are a pure function of the step."""
    from reskip.train.objective import RetrofitObjective
    from reskip.train.schedules import skipped_positions

    assert skipped_positions(3, 0, (2, 8), 1.0) is None
    m = skipped_positions(3, 0, (4, 64), 0.5)
    assert torch.equal(m, skipped_positions(3, 0, (4, 64), 0.5)) and not torch.equal(m, skipped_positions(4, 0, (4, 64), 0.5))
    assert 0.3 < m.float().mean() < 0.7
    rm = retrofit(tiny_model("llama", init_std=0.3), RetrofitConfig(block_size=2, rank=8, up_init_std=0.3))
    rm.set_curriculum(1.0)
    ids, _ = batch(pad=False)
    mask = skipped_positions(0, 0, tuple(ids.shape), 0.5)
    with torch.no_grad():
        terms = RetrofitObjective(rm, 1.0, 0.0)(ids, ids.clone(), 2, 1.0, 1.0, mask)
        with rm.side_channel_disabled():
            teacher = rm(input_ids=ids, use_cache=False).logits
        with rm.skipping_positions({2: mask}):
            ref = rm(input_ids=ids, use_cache=False).logits
    from reskip.losses import kl_sum

    assert terms["kl"].item() == pytest.approx(kl_sum(teacher, ref).item(), rel=1e-4)
    out = tmp_path / "run"
    train_run(out, tiny_run(skip_fraction=0.5), show_progress=False)
    assert (out / "adapter").is_dir()


def test_report_to_tensorboard_logs_every_scalar_of_the_log(tiny_run, tmp_path):
    """`report_to: tensorboard`: accelerate's tracker writes event files under RUN/tensorboard holding every
    loss term, c(t), lr and the validation figures per block, at the log's steps (read back with
    TensorBoard's own reader); train_log.jsonl is written as without it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    train_run(out, tiny_run(report_to="tensorboard"), show_progress=False)
    events = list((out / "tensorboard").rglob("events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("train/loss", "train/ce", "train/kl", "train/entropy", "train/c", "train/lr", "val/ppl_full",
                "val/ppl_backbone", "val/kl_full", "val/entropy/2", "val/entropy/3", "val/alpha_prev_std/3",
                "val/skip_kl/2"):
        assert tag in tags, tag
    assert [e.step for e in acc.Scalars("val/ppl_full")] == [0, 2, 4]
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    last_val = [r for r in log if r["kind"] == "eval"][-1]
    assert acc.Scalars("val/ppl_full")[-1].value == pytest.approx(last_val["ppl_full"], rel=1e-6)
    with pytest.raises(ReskipError, match="report_to must be one of"):
        tiny_run(report_to="wandb").validate()


def _reference_validation(rm, data, batch_size):
    """Validation's backbone figures as they were computed before the states were kept: the backbone's own
    `.logits`, each KL from them (the formulas of `losses`)."""
    from reskip.losses import ce_sum, kl_sum

    ce_b, kl_f = 0.0, 0.0
    with torch.no_grad():
        for i in range(0, len(data), batch_size):
            ids, labels = data.input_ids[i : i + batch_size], data.labels[i : i + batch_size]
            with rm.side_channel_disabled():
                teacher = rm(input_ids=ids, use_cache=False).logits
            ce_b += ce_sum(teacher, labels).item()
            kl_f += kl_sum(teacher, rm(input_ids=ids, use_cache=False).logits).item()
    return ce_b, kl_f


def test_validation_keeps_the_backbones_states_and_gives_the_same_figures(family, monkeypatch):
    """Training's validations share one dict of the frozen backbone's final hidden states: the first fills it,
    later ones run no backbone pass, and every figure equals validation without it (and the backbone's own
    logits), Gemma's soft-cap included."""
    from reskip.data.packing import Packed
    from reskip.train.validation import validation_metrics

    model = tiny_model(family)
    if family == "gemma3":
        model.config.final_logit_softcapping = 5.0  # the soft-capped head, as Gemma 2's config sets one
    rm = retrofit(model, RetrofitConfig(block_size=2, rank=8, up_init_std=0.3))
    ids, _ = batch(seed=4, bsz=3, seq=12, pad=False)
    labels = ids.clone()
    labels[0, :3] = -100
    data = Packed(ids, labels, ["a"] * 3)
    plain = validation_metrics(rm, data, batch_size=2)
    kept = {}
    first = validation_metrics(rm, data, batch_size=2, teacher_states=kept)
    assert sorted(kept) == [(0, 2), (2, 2)] and kept[(0, 2)].shape == (2, 12, rm.base_model.config.hidden_size)
    entered = []
    original = type(rm).side_channel_disabled
    monkeypatch.setattr(type(rm), "side_channel_disabled", lambda self: (entered.append(1), original(self))[1])
    second = validation_metrics(rm, data, batch_size=2, teacher_states=kept)
    assert not entered  # no backbone pass: its states were read back
    assert plain == first == second
    ce_b, kl_f = _reference_validation(rm, data, 2)
    n_targets = int((labels[:, 1:] != -100).sum())
    assert plain["ppl_backbone"] == math.exp(ce_b / n_targets) and plain["kl_full"] == kl_f / ids.numel()


def test_skip_kl_at_the_ends_only_logs_less_and_trains_the_same(tiny_run, tmp_path):
    """skip_kl_curve: false (the experiments' arms) computes the skip-branch KL at the first and last
    validations only; the adapter and every other validation figure are the same as with it everywhere."""
    train_run(tmp_path / "every", tiny_run(), show_progress=False)
    train_run(tmp_path / "ends", tiny_run(skip_kl_curve=False), show_progress=False)
    a = (tmp_path / "every" / "adapter" / WEIGHTS_NAME).read_bytes()
    b = (tmp_path / "ends" / "adapter" / WEIGHTS_NAME).read_bytes()
    assert a == b

    def evals(run):
        return [r for r in map(json.loads, (tmp_path / run / "train_log.jsonl").read_text().splitlines())
                if r["kind"] == "eval"]

    every, ends = evals("every"), evals("ends")
    assert [("skip_kl" in r) for r in ends] == [True, False, True] and all("skip_kl" in r for r in every)
    for x, y in zip(every, ends):
        assert {k: v for k, v in x.items() if k not in ("skip_kl", "skip_ppl") or k in y} == y
    with pytest.raises(ReskipError, match="skip_kl_curve must be true or false"):
        tiny_run(skip_kl_curve="no").validate()


def test_numbers_are_read_as_yaml_1_2_on_flags_and_in_config_files(tmp_path):
    """`1e-3` is a float (YAML 1.2, JSON), not the string YAML 1.1 makes of it."""
    from reskip.cli import build_parser
    from reskip.cli.train import train_config

    config = tmp_path / "c.yaml"
    config.write_text("lr: 1e-3\nlambda_kl: 5E-1\nsteps: 7\n")
    args = build_parser().parse_args(["train", "--config", str(config), "--lambda-ent", "2e-2"])
    cfg = train_config(args)
    cfg.validate()
    assert (cfg.lr, cfg.lambda_kl, cfg.lambda_ent, cfg.steps) == (1e-3, 0.5, 0.02, 7)
    args = build_parser().parse_args(["train", "--lr", "1e-3"])
    assert train_config(args).lr == 1e-3


@pytest.mark.integration
def test_a_kill_anywhere_in_training_or_calibration_is_refused_in_one_line_or_resumed_exactly(tmp_path):
    """SIGKILL of a real `reskip train` process at several points: `--resume` either continues it to the adapter
    an uninterrupted run writes, byte for byte, or (killed before its first checkpoint) refuses in one line, and
    the same command with --overwrite then writes that adapter."""
    import signal
    import subprocess
    import sys

    from helpers import save_tiny, write_corpus

    model, corpus = save_tiny(tmp_path / "model", "llama"), write_corpus(tmp_path / "corpus", n_docs=300)
    args = ["--model", str(model), "--data", str(corpus), "--seq-len", "16", "--steps", "6", "--batch-size", "2",
            "--eval-every", "3", "--save-every", "2", "--eval-sequences", "2", "--block-size", "2", "--rank", "8",
            "--quiet"]
    cli = [sys.executable, "-m", "reskip.cli", "train"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ref = tmp_path / "ref"
    subprocess.run([*cli, *args, "--out", str(ref)], check=True, env=env, capture_output=True)
    expected = (ref / "adapter" / "adapter_model.safetensors").read_bytes()
    # train records in the log when the kill comes
    for sig, records in ((signal.SIGKILL, 0), (signal.SIGKILL, 1), (signal.SIGKILL, 3), (signal.SIGKILL, 5)):
        run = tmp_path / f"killed-{sig.name}-{records}"
        proc = subprocess.Popen([*cli, *args, "--out", str(run)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        log = run / "train_log.jsonl"
        while proc.poll() is None:
            if records == 0 and (run / "config.yaml").exists():
                break
            if log.exists() and log.read_text().count('"kind": "train"') >= records > 0:
                break
            time.sleep(0.02)
        proc.send_signal(sig)
        proc.wait()
        resumed = subprocess.run([*cli, "--resume", str(run), "--quiet"], env=env, capture_output=True, text=True)
        if resumed.returncode == 2:  # no checkpoint yet: one line, then start over in the same folder
            assert len(resumed.stderr.strip().splitlines()) == 1 and "no checkpoint" in resumed.stderr
            subprocess.run([*cli, *args, "--out", str(run), "--overwrite"], check=True, env=env, capture_output=True)
        else:
            assert resumed.returncode == 0, resumed.stderr
        assert (run / "adapter" / "adapter_model.safetensors").read_bytes() == expected, (sig, records)
    # calibrate stopped by SIGKILL or SIGTERM at any moment: policy.json is absent or whole, and calibrating again
    # writes the policy an uninterrupted calibration writes
    calibrate = [sys.executable, "-m", "reskip.cli", "calibrate", "--adapter", str(ref), "--sequences", "4",
                 "--seq-len", "16", "--budgets", "1"]
    subprocess.run(calibrate, check=True, env=env, capture_output=True)
    whole = json.loads((ref / "policy.json").read_text())["blocks"]
    for sig, delay in ((signal.SIGKILL, 0.3), (signal.SIGTERM, 0.6), (signal.SIGKILL, 1.2)):
        (ref / "policy.json").unlink()
        proc = subprocess.Popen(calibrate, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(sig)
        proc.wait()
        if (ref / "policy.json").exists():
            assert json.loads((ref / "policy.json").read_text())["blocks"] == whole
        subprocess.run(calibrate, check=True, env=env, capture_output=True)
        assert json.loads((ref / "policy.json").read_text())["blocks"] == whole, (sig, delay)


def test_the_checkpoint_pointer_is_never_followed_out_of_the_run(tmp_path):
    """`checkpoints/latest` naming another run's folder, an absolute path, binary bytes or a checkpoint without its
    trainer state: the newest complete checkpoint of this run is used (or none), never what the pointer says."""
    from reskip.train.checkpoint import STATE_NAME, latest_checkpoint

    root = tmp_path / "run" / "checkpoints"
    for step in (25, 50):
        (root / f"step-{step:06d}").mkdir(parents=True)
        (root / f"step-{step:06d}" / STATE_NAME).write_bytes(b"x")
    (root / "step-000075").mkdir()  # a checkpoint cut short: no trainer state
    other = tmp_path / "other" / "checkpoints" / "step-000100"
    other.mkdir(parents=True)
    (other / STATE_NAME).write_bytes(b"x")
    pointer = root / "latest"
    for text in ("step-000025", "../../other/checkpoints/step-000100", str(other), "step-000075"):
        pointer.write_text(text)
        expected = "step-000025" if text == "step-000025" else "step-000050"
        assert latest_checkpoint(tmp_path / "run").name == expected
    pointer.write_bytes(b"\xff\xfe\x00")
    assert latest_checkpoint(tmp_path / "run").name == "step-000050"


@pytest.mark.parametrize("stale_env", [False, True], ids=["clean", "RANK left in the shell"])
def test_a_second_writer_of_a_run_folder_is_refused_and_the_first_unharmed(tiny_run, tmp_path, capsys, monkeypatch,
                                                                          stale_env):
    """While one process writes a run (it holds RUN/.lock), `reskip train --out` the same folder is refused in one
    line before anything loads or is removed, whatever the environment says (RANK and WORLD_SIZE left in a shell
    after a distributed job make no second writer); the same process may take the lock again (the pipeline's
    stages)."""
    from reskip.cli import main
    from reskip.run_folder.lock import writing

    cfg = tiny_run()
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("mine: 1\n")
    import multiprocessing

    ready, done = multiprocessing.Event(), multiprocessing.Event()
    holder = multiprocessing.get_context("fork").Process(target=_hold_lock, args=(run, ready, done))
    holder.start()
    try:
        assert ready.wait(30)
        if stale_env:
            monkeypatch.setenv("RANK", "1")
            monkeypatch.setenv("WORLD_SIZE", "2")
        code = main(["train", "--model", cfg.model, "--data", *cfg.data, "--seq-len", "16", "--steps", "2",
                     "--block-size", "2", "--rank", "8", "--overwrite", "--out", str(run)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "being written by another reskip process (pid" in err[0]
        assert (run / "config.yaml").read_text() == "mine: 1\n" and (run / "checkpoints").is_dir()
    finally:
        done.set()
        holder.join(30)
    with writing(run), writing(run):  # re-entrant in one process
        pass


def _hold_lock(run, ready, done):
    from reskip.run_folder.lock import writing

    with writing(run):
        ready.set()
        done.wait(60)


def test_a_refused_write_leaves_no_lock_behind(tmp_path):
    from reskip.errors import ReskipError
    from reskip.run_folder.lock import writing

    with pytest.raises(ReskipError):
        with writing(tmp_path / "new" / "run"):
            raise ReskipError("bad input")
    assert not list(tmp_path.iterdir())


def test_validation_measures_each_blocks_skip_on_the_data():
    """skip_ppl: the perplexity with block k skipped (the skip branch), on the validation targets."""
    from reskip.data.packing import Packed
    from reskip.losses import ce_sum
    from reskip.train.validation import validation_metrics

    rm = retrofit(tiny_model("llama", init_std=0.3), RetrofitConfig(block_size=2, rank=8, up_init_std=0.3,
                                                                     skip_path="shortcut"))
    rm.set_curriculum(1.0)
    ids = torch.randint(3, 90, (3, 12), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[0, :4] = -100
    out = validation_metrics(rm, Packed(ids, labels, ["x"] * 3), batch_size=2)
    n = int((labels[:, 1:] != -100).sum())
    with torch.no_grad():
        for k in (2, 3):
            with rm.blocks_skipped(k):
                ce = ce_sum(rm(input_ids=ids).logits, labels).item()
            assert out["skip_ppl"][str(k)] == pytest.approx(math.exp(ce / n), rel=1e-4)


def test_overwrite_removes_a_runs_own_files_only(tiny_run, tmp_path):
    """--overwrite replaces a training run, but a folder holding a user's own config.yaml or files of its own in
    checkpoints/ is refused before anything is removed."""
    mine = tmp_path / "mine"
    (mine / "checkpoints").mkdir(parents=True)
    (mine / "config.yaml").write_text("learning_rate: 3\n")
    (mine / "checkpoints" / "model.bin").write_bytes(b"weights")
    with pytest.raises(ReskipError, match="not a reskip training run's"):
        train_run(mine, tiny_run(), overwrite=True, show_progress=False)
    assert (mine / "config.yaml").read_text() == "learning_rate: 3\n" and (mine / "checkpoints" / "model.bin").exists()
    (mine / "config.yaml").unlink()
    with pytest.raises(ReskipError, match="model.bin"):
        train_run(mine, tiny_run(), overwrite=True, show_progress=False)
    run = tmp_path / "run"
    train_run(run, tiny_run(), show_progress=False)
    (run / "checkpoints" / ".step-000004.k1ll3d.tmp").mkdir()  # what a kill during a checkpoint's write leaves
    train_run(run, tiny_run(seed=3), overwrite=True, show_progress=False)  # its own files: replaced


def test_a_finished_run_whose_last_line_was_cut_resumes_to_its_real_end(tiny_run, tmp_path):
    run = tmp_path / "run"
    done = read_json(train_run(run, tiny_run(), show_progress=False))
    log = run / "train_log.jsonl"
    text = log.read_text()
    log.write_text(text[: text.rstrip("\n").rfind("\n") + 1] + text.rstrip("\n").rsplit("\n", 1)[1][:20])
    again = read_json(train_run(run, tiny_run(), resume=True, show_progress=False))
    assert again["ppl_full"]["end"] == pytest.approx(done["ppl_full"]["end"], rel=1e-6)
    assert again["ppl_full"]["end"] != again["ppl_full"]["start"]


@pytest.mark.parametrize("line,said", [("{}", "kind 'None'"), ("[1, 2]", "not a JSON object"),
                                       ('{"kind": "eval", "step": 2}', "ppl_full"),
                                       ('{"kind": "train", "step": -1, "loss": 1}', "step '-1'")])
def test_a_log_record_the_readers_cannot_use_is_refused_by_line(tmp_path, line, said):
    from reskip.train.log import read_log

    log = tmp_path / "train_log.jsonl"
    log.write_text('{"kind": "train", "step": 1, "loss": 2.0}\n' + line + '\n{"kind": "train", "step": 2, "loss": 1.0}\n')
    with pytest.raises(ReskipError, match=f"record 2 .*{said}"):
        read_log(log)


def test_what_a_kill_during_a_checkpoint_leaves_is_the_runs_own(tmp_path):
    """A kill while `save_checkpoint` writes leaves its `.tmp-step-N` folder (and atomic temporaries): --overwrite
    takes them for the run's own, while a user's file in checkpoints/ is still refused."""
    from reskip.run_folder import RunFolder
    from reskip.train.loop import not_written_by_training

    root = tmp_path / "run" / "checkpoints"
    (root / ".tmp-step-000002").mkdir(parents=True)
    (root / "..tmp-step-000002.k3j.tmp").mkdir()
    (root / ".latest.x9.tmp").write_text("step-000002")
    assert not_written_by_training(RunFolder(tmp_path / "run")) == []
    (root / "model.bin").write_bytes(b"x")
    assert not_written_by_training(RunFolder(tmp_path / "run")) == [str(root / "model.bin")]


@pytest.mark.parametrize("chunk", [None, 5])
def test_the_backbone_only_teacher_replaces_ce_by_the_full_paths_kl_to_the_backbone(chunk):
    """full_objective kd: the first term is KL(backbone || full path) per position (the teacher pass's own targets),
    the same in whole logits and chunked; the skip term and the rest are untouched."""
    from reskip.losses import kl_sum
    from reskip.train.objective import RetrofitObjective

    rm = retrofit(tiny_model("llama", init_std=0.2), RetrofitConfig(block_size=2, rank=8, skip_path="identity"))
    rm.set_curriculum(1.0)
    torch.manual_seed(0)
    for p in rm.trainable_parameters():  # a side-channel that moves the full path well away from the backbone
        torch.nn.init.normal_(p, std=0.5)
    ids = torch.randint(3, 90, (2, 12), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    kd = RetrofitObjective(rm, 1.0, 0.0, loss_chunk=chunk, full_objective="kd")(ids, labels, 2, 1.0, 1.0)
    ce = RetrofitObjective(rm, 1.0, 0.0, loss_chunk=chunk)(ids, labels, 2, 1.0, 1.0)
    with torch.no_grad():
        with rm.side_channel_disabled():
            back = rm(input_ids=ids, use_cache=False).logits
        full = rm(input_ids=ids, use_cache=False).logits
    assert kd["kd"].item() == pytest.approx(kl_sum(back, full).item(), rel=1e-4) and kd["kd"].item() > 0
    assert kd["kl"].item() == pytest.approx(ce["kl"].item(), rel=1e-5)  # the skip branch's term is the same
    assert kd["loss"].item() == pytest.approx(kd["kd"].item() + kd["kl"].item(), rel=1e-5)
    assert ce["kd"].item() == 0 and ce["loss"].item() == pytest.approx(ce["ce"].item() + ce["kl"].item(), rel=1e-5)


def test_a_full_disk_during_a_checkpoint_is_one_line_and_leaves_no_temporary(tmp_path, monkeypatch):
    """torch.save on a full disk raises a RuntimeError ("unexpected pos"): the half-written `.tmp-step-*` is removed
    (it would keep filling the disk), the previous checkpoint stays the newest, and the error says what to do."""
    from reskip.errors import ReskipError
    from reskip.train import checkpoint

    class Trainee:
        def save_weights(self, folder, step):
            folder.mkdir(parents=True)
            (folder / "adapter.bin").write_bytes(b"x" * 1000)

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    first = checkpoint.save_checkpoint(tmp_path, 1, Trainee(), optimizer, 10)

    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 1234 vs 1180")

    monkeypatch.setattr(checkpoint.torch, "save", full)
    with pytest.raises(ReskipError, match="is the disk full.*newest checkpoint is .*step-000001"):
        checkpoint.save_checkpoint(tmp_path, 2, Trainee(), optimizer, 20)
    root = checkpoint.checkpoints_dir(tmp_path)
    assert not list(root.glob(".tmp-step-*")) and checkpoint.latest_checkpoint(tmp_path) == first


def test_a_run_resumes_from_its_own_checkpoints_only(tiny_run, tmp_path, capsys):
    """Another run's checkpoints, linked in or copied under a config of another seed, are refused on resume: the
    adapter they hold would be labelled with settings it was not trained with."""
    import shutil

    import yaml

    from reskip.cli import main
    from reskip.train.run import train_run

    cfg = tiny_run(steps=2, save_every=1)
    train_run(tmp_path / "a", cfg, show_progress=False)
    b = tmp_path / "b"
    b.mkdir()
    config = yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())
    (b / "config.yaml").write_text(yaml.safe_dump({**config, "seed": 5, "steps": 3}))
    (b / "checkpoints").symlink_to(tmp_path / "a" / "checkpoints")
    assert main(["train", "--resume", str(b), "--quiet"]) == 2
    assert "is a link" in capsys.readouterr().err
    (b / "checkpoints").unlink()
    shutil.copytree(tmp_path / "a" / "checkpoints", b / "checkpoints")
    assert main(["train", "--resume", str(b), "--quiet"]) == 2
    assert "written by a run of other settings" in capsys.readouterr().err
    assert not (b / "adapter").exists()
