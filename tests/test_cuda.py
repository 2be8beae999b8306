"""On the accelerator (marked `cuda`; `benchmarks/gpu_check.sh` runs them): step-zero parity exact in bfloat16, the
exact KV cache under skipping, and the device runtime's decisions equal to the CPU's. The device is
RESKIP_TEST_DEVICE (default cuda; skipped where torch sees none); the GPU check's CPU dry run sets it to cpu."""

import os

import pytest
import torch

from helpers import VOCAB, batch, tiny_model
from reskip import RetrofitConfig, retrofit
from reskip.ar_retrofit.kv_cache import reference_logits
from reskip.ar_retrofit.parity import check_parity
from reskip.skip.policies import RandomSkip, ReSkip
from reskip.skip.scoring import generate, score, score_rows

DEVICE = os.environ.get("RESKIP_TEST_DEVICE", "cuda")
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="no CUDA device")]


def _rm(family: str, dtype=torch.float32, device=DEVICE):
    rm = retrofit(tiny_model(family, dtype=dtype, init_std=0.3).to(device),
                  RetrofitConfig(block_size=2, rank=8, up_init_std=0.3))
    rm.set_curriculum(1.0)
    return rm


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32"])
def test_step_zero_parity_is_exact_on_the_device(family, dtype):
    model = tiny_model(family, dtype=dtype).to(DEVICE)
    ids, mask = batch(bsz=3, seq=12, pad=True)
    result = check_parity(model, {"input_ids": ids.to(DEVICE), "attention_mask": mask.to(DEVICE)},
                          RetrofitConfig(block_size=2, rank=8))
    assert result["equal"] and result["max_abs_diff"] == 0.0


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_cached_generation_under_skipping_is_the_reference_on_the_device(family):
    rm = _rm(family)
    ids, mask = batch(bsz=3, seq=10, pad=True)
    out, trace = generate(rm, ids, RandomSkip(p=0.5, eligible={2, 3}, seed=1), window=3, attention_mask=mask,
                          max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True,
                          pad_token_id=0)
    seq = out.sequences
    full = torch.cat([mask.to(seq.device), torch.ones(seq.shape[0], seq.shape[1] - ids.shape[1], dtype=mask.dtype,
                                                      device=seq.device)], 1)
    ref = reference_logits(rm, seq, trace, attention_mask=full)
    assert any(t.skipped for t in trace)
    for i, step_logits in enumerate(out.logits):
        torch.testing.assert_close(step_logits, ref[:, ids.shape[1] + i - 1], rtol=1e-4, atol=1e-4)


def test_the_device_runtime_decides_as_the_cpu():
    """The same tiny model on the CPU (host runtime) and on the device (device runtime): every decision the same,
    with thresholds midway between observed values so float rounding of another device cannot flip one."""
    cpu = _rm("llama", device="cpu")
    dev = _rm("llama")
    ids = torch.randint(3, VOCAB, (4, 12), generator=torch.Generator().manual_seed(5))
    never = ReSkip({n: 2.0 for n in (2, 3)}, {2, 3}, 2)
    _, trace = score(cpu, ids, never, 3, chunk_size=2)
    seen = {n: sorted(t.w_recent[n] for t in trace) for n in (2, 3)}
    tau = {n: (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2 for n, v in seen.items()}
    policy = ReSkip(tau, {2, 3}, 1)
    _, on_cpu = score(cpu, ids, policy, 3, chunk_size=2)
    _, on_dev = score(dev, ids, policy, 3, chunk_size=2)
    assert [t.skipped for t in on_cpu] == [t.skipped for t in on_dev]
    assert any(t.skipped for t in on_cpu) and not all(t.skipped for t in on_cpu)
    _, rows_cpu = score_rows(cpu, ids, policy, 3, 2)
    _, rows_dev = score_rows(dev, ids, policy, 3, 2)
    assert [[t.skipped for t in r] for r in rows_cpu] == [[t.skipped for t in r] for r in rows_dev]
