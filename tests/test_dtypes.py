"""The compute dtype: `auto` resolution, training in bfloat16 against float32, exact resume in bfloat16,
the exact KV cache in bfloat16, and the fused (compiled) chunked losses against their eager form."""

import io
import json
import warnings

import pytest
import torch
import yaml

from helpers import batch, tiny_model
from reskip import ReskipError, RetrofitConfig, fusion, retrofit
from reskip.ar_retrofit.adapter_io import WEIGHTS_NAME
from reskip.ar_retrofit.kv_cache import reference_logits
from reskip.backbones import dtypes
from reskip.losses import chunk_terms
from reskip.progress import Progress
from reskip.skip.policies import NoSkip, RandomSkip
from reskip.skip.scoring import generate
from reskip.train.objective import RetrofitObjective
from reskip.train.run import train_run
from reskip.train_config import TrainConfig


def _hardware(monkeypatch, cuda: bool = False, cuda_bf16: bool = False, **cpu):
    caps = {"amx_bf16": False, "avx512_bf16": False, **cpu}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: cuda_bf16)


@pytest.mark.parametrize("cpu,expected", [({}, "float32"), ({"amx_bf16": True}, "bfloat16"),
                                          ({"avx512_bf16": True}, "bfloat16")])
def test_auto_is_bfloat16_only_where_the_cpu_has_the_units(monkeypatch, cpu, expected):
    _hardware(monkeypatch, **cpu)
    assert dtypes.resolve_dtype_name("auto") == expected
    assert dtypes.resolve_dtype("auto") == getattr(torch, expected)
    assert dtypes.describe("auto") == f"auto -> {expected}"
    # explicit names are kept whatever the hardware
    assert dtypes.resolve_dtype_name("float32") == "float32" and dtypes.resolve_dtype_name("bfloat16") == "bfloat16"
    assert dtypes.resolve_dtype_name(torch.bfloat16) == "bfloat16"


def test_auto_on_cuda_follows_the_devices_bfloat16_support(monkeypatch):
    _hardware(monkeypatch, cuda=True, cuda_bf16=True)
    assert dtypes.resolve_dtype_name("auto") == "bfloat16"
    _hardware(monkeypatch, cuda=True, cuda_bf16=False, amx_bf16=True)
    assert dtypes.resolve_dtype_name("auto") == "float32"  # the model goes to the GPU, whose support decides
    assert dtypes.resolve_dtype_name("auto", device="cpu") == "bfloat16"


def test_an_unknown_dtype_is_refused():
    with pytest.raises(ReskipError, match="auto, float32, bfloat16"):
        dtypes.resolve_dtype_name("float16")


def test_training_writes_the_resolved_dtype_and_resumes_exactly_in_bfloat16(tiny_run, tmp_path, monkeypatch):
    _hardware(monkeypatch, amx_bf16=True)  # auto -> bfloat16 on any machine the suite runs on
    train_run(tmp_path / "straight", tiny_run(dtype="auto"), show_progress=False)
    cfg = yaml.safe_load((tmp_path / "straight" / "config.yaml").read_text())
    assert cfg["dtype"] == "bfloat16"
    card = json.loads((tmp_path / "straight" / "adapter" / "adapter_config.json").read_text())
    assert card["metadata"]["dtype"] == "bfloat16"

    def crash(step, model):
        if step == 2:
            raise KeyboardInterrupt("simulated kill after the step-2 checkpoint")

    with pytest.raises(KeyboardInterrupt):
        train_run(tmp_path / "resumed", tiny_run(dtype="auto"), on_step_end=crash, show_progress=False)
    # the resumed run reads its own config.yaml: bfloat16, not whatever auto would give now
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {})
    resumed_cfg = TrainConfig.from_yaml((tmp_path / "resumed" / "config.yaml").read_text())
    train_run(tmp_path / "resumed", resumed_cfg, resume=True, show_progress=False)
    a = (tmp_path / "straight" / "adapter" / WEIGHTS_NAME).read_bytes()
    b = (tmp_path / "resumed" / "adapter" / WEIGHTS_NAME).read_bytes()
    assert a == b


@pytest.mark.parametrize("loss_chunk", [None, 4])
def test_bfloat16_loss_terms_are_within_a_stated_tolerance_of_float32(loss_chunk):
    """The same weights, side-channel and batch: every term of the objective in a bfloat16 backbone within 2%
    (relative; the signal correlation within 0.05) of the float32 one. Terms are reduced in float32 either way."""
    ids, _ = batch(bsz=3, seq=12, pad=False)
    labels = ids.clone()
    terms = {}
    for dtype in (torch.float32, torch.bfloat16):
        rm = retrofit(tiny_model("llama", init_std=0.1).to(dtype), RetrofitConfig(block_size=2, rank=8, up_init_std=0.1))
        rm.set_curriculum(1.0)
        objective = RetrofitObjective(rm, 1.0, 0.01, lambda_signal=1.0, lambda_local=1.0, loss_chunk=loss_chunk)
        out = objective(ids, labels, 2, 1.0 / ids.numel(), 1.0 / ids.numel())
        out["loss"].backward()
        assert all(p.dtype == torch.float32 for p in rm.trainable_parameters())
        assert all(v.dtype == torch.float32 for v in out.values())
        grads = torch.cat([p.grad.flatten() for p in rm.trainable_parameters() if p.grad is not None])
        terms[dtype] = {**{k: float(v) for k, v in out.items()}, "grad_norm": float(grads.norm())}
    f32, b16 = terms[torch.float32], terms[torch.bfloat16]
    for k in ("loss", "ce", "kl", "ent", "local", "grad_norm"):
        assert b16[k] == pytest.approx(f32[k], rel=0.02), k
    assert abs(b16["sig"] - f32["sig"]) < 0.05


def test_fused_chunk_terms_equal_the_eager_ones(monkeypatch):
    """The compiled chunk (forced here on a small shape) computes what the eager one does, up to float32 rounding."""
    if not fusion.compile_enabled():
        pytest.skip("RESKIP_COMPILE=0")
    monkeypatch.setattr(fusion, "MIN_ELEMENTS", 0)
    g = torch.Generator().manual_seed(0)
    N, V = 24, 300
    u = [torch.randn(N, V, generator=g).mul(3).bfloat16() for _ in range(3)]
    targets = torch.randint(0, V, (N,), generator=g)
    valid = torch.ones(N, dtype=torch.bool)
    valid[:5] = False
    cap = [torch.rand(N, V, generator=g) for _ in range(2)]  # d logits / d head output under a soft-cap
    for caps in ((None, None), cap):
        eager = chunk_terms(*[x.clone() for x in u], targets, valid, *caps, True)
        fused = fusion.fused(chunk_terms, 1)(*[x.clone() for x in u], targets, valid, *caps, True)
        for a, b in zip(eager, fused):
            assert a.dtype == b.dtype
            torch.testing.assert_close(b.float(), a.float(), rtol=1e-5, atol=1e-2 if a.dtype == torch.bfloat16 else 1e-4)
        assert eager[2][:5].abs().max() == 0  # no gradient where there is no target


def test_a_failing_compiler_falls_back_to_eager_with_one_warning(monkeypatch):
    from torch._dynamo.exc import InternalTorchDynamoError

    def broken(fn, **kw):
        def call(*args):
            raise InternalTorchDynamoError("no C++ compiler")
        return call

    def double(x):
        return x * 2

    monkeypatch.setattr(fusion, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(torch, "compile", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(fusion.fused(double, 1)(torch.ones(2)), torch.full((2,), 2.0))
        assert torch.equal(fusion.fused(double, 1)(torch.ones(2)), torch.full((2,), 2.0))
    assert sum("running it eagerly" in str(w.message) for w in caught) == 1
    monkeypatch.setenv("RESKIP_COMPILE", "0")
    assert fusion.fused(len, 1 << 30) is len


def _bf16_cache_gap(rm, ids, mask, policy, max_new=8):
    """Max |logit| difference of cached generation against the cache-free forward that makes the same skip
    decisions, and whether each generated token is the reference's top-1 where its margin exceeds twice that."""
    out, trace = generate(rm, ids, policy, window=3, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                          output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    seq = out.sequences
    full_mask = torch.cat([mask, torch.ones(seq.shape[0], seq.shape[1] - mask.shape[1], dtype=mask.dtype)], 1)
    ref = reference_logits(rm, seq, trace, attention_mask=full_mask).float()
    prompt = ids.shape[1]
    gap = max(float((step.float() - ref[:, prompt + i - 1]).abs().max()) for i, step in enumerate(out.logits))
    for i in range(len(out.logits)):
        r = ref[:, prompt + i - 1]
        top2 = r.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 2 * gap
        assert torch.equal(seq[clear, prompt + i], r.argmax(-1)[clear])
    return gap, trace


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_the_exact_cache_in_bfloat16_is_as_close_as_the_backbones_own_cache(family):
    """bfloat16 rounds differently for one token than for a whole sequence, so the cache is checked against the
    backbone's own bfloat16 cache: with blocks skipped it stays within twice the gap between the backbone's cached
    and cache-free logits (never skipping), and keeps every token whose top-1 margin is wider than the gap."""
    rm = retrofit(tiny_model(family, init_std=0.3, dtype=torch.bfloat16), RetrofitConfig(block_size=2, rank=8, up_init_std=0.3))
    rm.set_curriculum(1.0)
    ids, mask = batch(bsz=3, seq=10, pad=True)
    dense_gap, _ = _bf16_cache_gap(rm, ids, mask, NoSkip())
    gap, trace = _bf16_cache_gap(rm, ids, mask, RandomSkip(p=0.5, eligible={2, 3}, seed=1))
    assert any(t.skipped for t in trace) and not all(t.skipped for t in trace)
    assert 0 < dense_gap < 1.0
    assert gap <= 2 * dense_gap


def test_progress_in_a_log_file_is_a_line_with_the_time_left():
    stream = io.StringIO()  # not a terminal
    p = Progress(4, "train", every_s=0.0, stream=stream)
    for _ in range(4):
        p.update(1, loss="1.000")
    p.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4 and "\r" not in stream.getvalue()
    assert lines[0].startswith("[train] 1/4 steps,") and "left" in lines[0] and "(loss=1.000)" in lines[0]
    assert lines[-1].startswith("[train] 4/4 steps,") and "left 0:00" in lines[-1]


def test_the_time_left_counts_the_work_set_aside():
    """Validations between steps stay out of the rate per step, and the ones still to come are in the time left."""
    stream = io.StringIO()
    p = Progress(10, "train", every_s=0.0, stream=stream)
    p.t0 -= 100.0  # 100 s elapsed: 60 s of it validating, after 4 steps of 10 s
    p.done = 4
    p.set_aside(60.0, left_s=120.0)
    assert "10.00 s/step" in p.line(p.t0 + 100.0, {}) and "left 3:00" in p.line(p.t0 + 100.0, {})  # 6 x 10 + 120


def test_training_counts_the_validations_it_still_runs():
    from reskip.train.loop import validations_after
    from reskip.train_config import TrainConfig

    cfg = TrainConfig(steps=100, eval_every=25)
    assert [validations_after(s, cfg) for s in (0, 24, 25, 99, 100)] == [4, 4, 3, 1, 0]
    assert validations_after(0, TrainConfig(steps=10, eval_every=3)) == 4  # 3, 6, 9 and the last
